"""The live side of a run record: :func:`recording` makes the run's directory (pruning the oldest beyond
``runs_keep``), hands the command a :class:`Recorder` (the backend's
:class:`~nodekit.runs.events.RunEvents`, and a tee for the merged log), and when the command ends, however it ends,
writes how (exit code, failing node, rank and signal, its last lines). The webhook hears "start" once the image
is known, and "finish" or "failure" at the end.

run.json is rewritten whole (atomically) at most once a second while the run goes on, and at its end; log.txt is
appended to as lines come. Nothing here may fail the job: a record that cannot be written is reported once.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from nodekit.config.settings import Settings
from nodekit.errors import JobFailed, NodekitError
from nodekit.image.fingerprint import TAG_LENGTH
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_LOCK
from nodekit.runs import store
from nodekit.runs.events import Phase
from nodekit.runs.model import Command, Lines, NodeRecord, RunRecord, signal_of
from nodekit.runs.notify import TAIL_LINES, Event, Notifier, payload, webhook
from nodekit.system.proc import Interrupted

SAVE_EVERY_S = 1.0
LOG_CAP_BYTES = 1 << 30  # one GiB of merged log per run; past it a line says so and the rest is Docker's to keep

Warn = Callable[[str], None]


class Recorder:
    """One run's record as it happens (thread-safe: nodes start in parallel threads). Implements RunEvents."""

    def __init__(
        self, d: Path, record: RunRecord, *, notifier: Notifier | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.dir, self.record, self.notifier, self._clock = d, record, notifier, clock
        self._lock = threading.RLock()
        self._tails: dict[int, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES)
        )
        self._log: IO[str] | None = None
        self._logged = 0
        self._saved = 0.0
        self.problem = ""
        self._told: set[Event] = set()
        self._lines = Lines()

    # --- RunEvents -------------------------------------------------------------------------------------------

    def image(self, ref: str, image_id: str, labels: Mapping[str, str]) -> None:
        with self._lock:
            r = self.record
            r.image, r.image_id = ref, image_id
            tag = ref.rpartition(":")[2] if "/" in ref or ":" in ref else ""
            short = tag if len(tag) == TAG_LENGTH and all(c in "0123456789abcdef" for c in tag) else ""
            r.fingerprint = labels.get(LABEL_FINGERPRINT, short)  # nodekit's tags carry its first 12 digits
            r.lock_digest = labels.get(LABEL_LOCK, r.lock_digest)
            self._save(force=True)
        self._tell("start")

    def phase(self, rank: int, phase: Phase) -> None:
        with self._lock:
            node = self.record.node(rank)
            if node is not None and phase not in node.phases:
                node.phases[phase] = self._clock()
                self._save()

    def exited(self, rank: int, code: int | None) -> None:
        with self._lock:
            node = self.record.node(rank)
            if node is None:
                return
            node.exit_code, node.lost = code, code is None
            node.phases.setdefault("end", self._clock())
            self._save()

    def attempt(self, number: int, hosts: Sequence[tuple[int, str]]) -> None:
        with self._lock:
            r = self.record
            r.attempts = number + 1
            before = {n.host: n for n in r.nodes}
            r.dropped += [n for n in r.nodes if n.host not in {h for _, h in hosts}]
            r.nodes = [
                NodeRecord(
                    rank=rank, host=host, earlier=[*before[host].earlier, before[host].phases] if host in before else []
                )
                for rank, host in hosts
            ]
            self._tails.clear()
            self._save(force=True)

    def failed(self, rank: int, code: int, reason: str) -> None:
        with self._lock:
            self.record.failed_rank, self.record.reason = rank, reason
            node = self.record.node(rank)
            self.record.signal = signal_of(node.exit_code if node else code)

    def placed(self, job_id: str, hosts: Sequence[tuple[int, str]]) -> None:
        with self._lock:
            self.record.job_id = job_id
            for rank, host in hosts:
                node = self.record.node(rank)
                if node is not None:
                    node.host = host
            self._save(force=True)

    # --- lines ----------------------------------------------------------------------------------------------

    def line(self, rank: int, text: str) -> None:
        """One line of node ``rank``'s output: into the merged log, its phase (if it marks one) noted. The job's
        first output is its first line after torchrun's rendezvous where there is one (torchrun starts the workers
        only then; what came before is torch's own, such as c10d's warnings), else after the launcher's lines."""
        with self._lock:
            phase = self._lines.phase(rank, text)
            self._tails[rank].append(text)
            node = self.record.node(rank)
            if phase == "rendezvous" and node is not None and "rendezvous" not in node.phases:
                node.phases.pop("output", None)
            if phase is not None:
                self.phase(rank, phase)
            self._write(f"[node {rank}] {text}\n")

    def raw(self, text: str) -> None:
        """A line of the run's log that no node printed (a batch script's own)."""
        with self._lock:
            self._write(f"{text}\n")

    def tee(self, on_line: Callable[[int, str], None]) -> Callable[[int, str], None]:
        """``on_line`` (the terminal's) that also records each line."""

        def both(rank: int, text: str) -> None:
            self.line(rank, text)
            on_line(rank, text)

        return both

    def _write(self, text: str) -> None:
        if self.problem or self._logged > LOG_CAP_BYTES:
            return
        try:
            if self._log is None:
                self._log = open(self.dir / store.LOG, "a", encoding="utf-8")  # noqa: SIM115 (closed by finish)
            self._log.write(text)
            self._logged += len(text)
            if self._logged > LOG_CAP_BYTES:
                self._log.write(
                    f"[nodekit] the merged log stops here ({LOG_CAP_BYTES >> 20} MiB); nodekit logs has the rest\n"
                )
        except OSError as e:
            self.problem = f"cannot write the run's log in {self.dir}: {e.strerror}"

    # --- the end -------------------------------------------------------------------------------------------

    def detach(self) -> None:
        """The job goes on in the background (``up --detach``): nobody follows it to its end."""
        with self._lock:
            self.record.detached = True
            self._save(force=True)

    def finish(self, code: int, *, signal: str = "", reason: str = "", refused: bool = False) -> None:
        """The run ended with ``code``; ``refused``: before any node started (:func:`refusal`), no node failed."""
        with self._lock:
            r = self.record
            r.ended, r.exit_code, r.refused = self._clock(), code, refused
            if code != 0 and r.failed_rank is None and len(r.nodes) == 1 and not signal and not refused:
                r.failed_rank = r.nodes[0].rank  # one node: it is the one that failed
            if r.failed_rank is not None:
                node = r.node(r.failed_rank)
                r.signal = r.signal or signal_of(node.exit_code if node else code)
                r.log_tail = list(self._tails.get(r.failed_rank, ()))
            else:
                r.signal = signal or r.signal or signal_of(code)
            r.reason = r.reason or reason
            if self._log is not None:
                with contextlib.suppress(OSError):
                    self._log.close()
                self._log = None
            self._save(force=True)
        if not r.detached:
            self._tell("finish" if code == 0 else "failure")

    def _tell(self, event: Event) -> None:
        """The webhook's message for ``event``, once each (start: once the image, and so the run, is known)."""
        if self.notifier is None or event in self._told:
            return
        self._told.add(event)
        with self._lock:
            body = payload(event, self.record, self.notifier.hook.settings.format, self._clock())
        self.notifier.send(event, body)

    def flush(self) -> None:
        with self._lock:
            if self._log is not None:
                with contextlib.suppress(OSError):
                    self._log.flush()
            self._save(force=True)

    def _save(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.problem or (not force and now - self._saved < SAVE_EVERY_S):
            return
        try:
            if self._log is not None:
                self._log.flush()
            store.save(self.dir, self.record)
            self._saved = now
        except OSError as e:
            self.problem = f"cannot write the run record in {self.dir}: {e.strerror}"


def settings_digest(data: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def lock_digest(project_dir: Path) -> str:
    """The project's lock file's sha256 (the image's own label wins once the image is known)."""
    from nodekit.image.lock import LOCK_FILE

    try:
        return hashlib.sha256((project_dir / LOCK_FILE).read_bytes()).hexdigest()
    except OSError:
        return ""


def begin(
    settings: Settings,
    command: Command,
    hosts: Sequence[tuple[int, str]],
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    warn: Warn = lambda _: None,
) -> Recorder:
    """A new record for a run of ``command`` on ``hosts`` ((rank, where) pairs): its directory made, the oldest
    beyond ``runs_keep`` pruned. The webhook hears "start" once the backend names the image."""
    now = clock()
    root = store.runs_dir(settings.project_dir)
    run_id = store.new_id(now)
    data = settings.model_dump(mode="json", exclude={"project_dir"})
    record = RunRecord(
        id=run_id, command=command, project=str(settings.project_dir), started=now, pid=os.getpid(), settings=data,
        settings_digest=settings_digest(data), nodes=[NodeRecord(rank=r, host=h) for r, h in hosts],
        lock_digest=lock_digest(settings.project_dir),
    )  # fmt: skip
    joined = _detached_peer(root, record, window_s=settings.rdzv_timeout) if command == "up" else None
    if joined is not None:  # a node of the same job started here with up -d: one job, one run
        run_id, record = joined.id, joined
        record.nodes = sorted([*record.nodes, *(NodeRecord(rank=r, host=h) for r, h in hosts)], key=lambda n: n.rank)
        record.detached, record.pid = False, os.getpid()
    hook, why = webhook(settings.notify, os.environ if environ is None else environ, settings.project_dir)
    if why:
        warn(why)
    rec = Recorder(root / run_id, record, notifier=Notifier(hook) if hook else None, clock=clock)
    try:
        if joined is None:
            store.make_dir(root, run_id)
        store.prune(root, settings.runs_keep, spare=run_id)
        rec._save(force=True)
    except OSError as e:
        rec.problem = f"cannot write a run record in {root}: {e.strerror}"
    if rec.problem:
        warn(f"{rec.problem}; the run goes on unrecorded")
    return rec


def _detached_peer(root: Path, mine: RunRecord, *, window_s: float) -> RunRecord | None:
    """The record of another node of this job that ``nodekit up -d`` started on this host: same settings, other
    ranks, still detached, started within the rendezvous window before this one. The attached ``up`` then records
    the job to its end in that record (it follows its own node; the detached one is named by its rank), instead of
    the job being listed twice, once forever "detached"."""
    ranks = {n.rank for n in mine.nodes}
    found = [
        r
        for _, r in store.records(root)
        if r.command == "up" and r.detached and r.ended is None and r.settings_digest == mine.settings_digest
        and 0 <= mine.started - r.started <= window_s and not ranks & {n.rank for n in r.nodes}
    ]  # fmt: skip
    return max(found, key=lambda r: r.started, default=None)


def ending(e: BaseException | None) -> tuple[int, str, str]:
    """(exit code, signal, reason) of a command that ended with ``e`` (None: it returned)."""
    if e is None:
        return 0, "", ""
    if isinstance(e, Interrupted):
        return e.exit_code, e.name, f"{e.name} received: every node was stopped"
    if isinstance(e, KeyboardInterrupt):
        return 130, "SIGINT", "interrupted: every node was stopped"
    if isinstance(e, JobFailed):
        return e.exit_code, "", e.message
    if isinstance(e, NodekitError):
        return e.exit_code, "", e.message
    if isinstance(e, SystemExit):
        return (e.code if isinstance(e.code, int) else 1), "", ""
    return 1, "", f"{type(e).__name__}: {e}"


def refusal(e: BaseException, record: RunRecord) -> bool:
    """Whether ``e`` refused the run before any of its nodes started: one of nodekit's exit-2 errors (bad input, a
    host, engine or image not ready), raised while no node had reached "started". An exit 2 after a start is the
    launcher's refusal inside a container: a failed run."""
    return (
        isinstance(e, NodekitError)
        and not isinstance(e, JobFailed)
        and e.exit_code == 2
        and not any("started" in n.phases for n in record.nodes)
    )


@contextlib.contextmanager
def recording(
    settings: Settings,
    command: Command,
    hosts: Sequence[tuple[int, str]],
    *,
    warn: Warn,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[Recorder]:
    """A :class:`Recorder` for the block; however the block ends (a returned exit code is set with
    :meth:`Recorder.finish` by the caller, an exception here), the record is closed and the webhook's last
    message waited for, within its deadline. The block's exception goes on unchanged."""
    rec = begin(settings, command, hosts, environ=environ, warn=warn, clock=clock)
    try:
        yield rec
    except BaseException as e:
        code, sig, reason = ending(e)
        if rec.record.ended is None:
            rec.finish(code, signal=sig, reason=reason, refused=refusal(e, rec.record))
        raise
    finally:
        if rec.record.ended is None and not rec.record.detached:
            rec.finish(0)
        if rec.problem:
            warn(f"{rec.problem}; the record of run {rec.record.id} is incomplete")
        if rec.notifier is not None:
            for problem in rec.notifier.close():
                warn(f"notify: {problem}")
