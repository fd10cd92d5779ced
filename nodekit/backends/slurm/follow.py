"""Following a submitted job: its state (``scontrol show job``), its log as it grows, its exit code; ``scancel``
when the user stops nodekit (Ctrl-C, SIGTERM, SIGHUP).

:func:`parse_job` and :func:`exit_code` are pure; :func:`follow` takes its clock, its sleep and the query as
arguments, so its decisions are tested without a Slurm.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nodekit.backends.slurm import cmd
from nodekit.errors import NodekitError

# Slurm's job states after which nothing of the job runs any more.
DONE = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)  # fmt: skip
POLL_S = 1.0
CANCEL_WAIT_S = 120.0  # after scancel: Slurm's KillWait (30 s by default) and the epilog


_FIELD_START = re.compile(r"\s+(?=[A-Z][A-Za-z0-9_/:]*=)")


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str
    exit_code: int = 0
    signal: int = 0
    log: str = ""
    nodes: str = ""
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.state in DONE


def parse_job(text: str) -> JobInfo | None:
    """A JobInfo from ``scontrol show job -o <id>``'s one line; None when Slurm no longer knows the job."""
    # One "Key=value" after another, separated by a space; a value may hold spaces itself (StdOut, WorkDir and
    # Command of a project under "my proj"), so a field ends only where the next "Key=" begins.
    fields = dict(item.split("=", 1) for item in _FIELD_START.split(text.strip()) if "=" in item)
    if "JobId" not in fields:
        return None
    code, _, sig = fields.get("ExitCode", "0:0").partition(":")
    return JobInfo(
        job_id=fields["JobId"],
        state=fields.get("JobState", "UNKNOWN"),
        exit_code=int(code) if code.isdigit() else 0,
        signal=int(sig) if sig.isdigit() else 0,
        log=fields.get("StdOut", ""),
        nodes=fields.get("NodeList", ""),
        reason=fields.get("Reason", ""),
    )


_LABEL = re.compile(r"^\s*([0-9]{1,5}):(?: (.*))?$", re.S)


def labelled(line: str) -> tuple[int | None, str]:
    """``srun --label``'s ``R: text`` (one task per node, so R is the node's rank) as (R, text); (None, line) for a
    line no task printed (the script's own)."""
    m = _LABEL.match(line)
    return (int(m.group(1)), m.group(2) or "") if m else (None, line)


def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed host list (``h[0-2,5],gpu7``) written out, in order; [] for none (``(null)``)."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?", nodelist):
        prefix, ranges = m.group(1), m.group(2)
        if prefix in ("(null)", "None"):
            continue
        if ranges is None:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                names.append(f"{prefix}[{part}]")
                continue
            names += [f"{prefix}{n:0{len(lo)}d}" for n in range(int(lo), int(hi or lo) + 1)]
    return names


def exit_code(info: JobInfo) -> int:
    """The job's exit code as a shell gives it: the batch script's code, 128 + the signal that ended it, or 1 for a
    job that ended badly without either (a node failure before the script ran)."""
    if info.exit_code:
        return info.exit_code
    if info.signal:
        return 128 + info.signal
    return 0 if info.state == "COMPLETED" else 1


def query(job_id: str) -> JobInfo | None:
    found = cmd.run(["scontrol", "show", "job", "-o", job_id])
    if found.code != 0:
        if "Invalid job id" in found.message:
            return None
        raise NodekitError(f"scontrol show job {job_id} failed: {found.message}", fix="scontrol ping")
    return parse_job(found.out)


def cancel(job_id: str) -> None:
    found = cmd.run(["scancel", job_id])
    if found.code != 0:
        raise NodekitError(f"scancel {job_id} failed: {found.message}", fix=f"scancel {job_id} by hand")


class LogTail:
    """The job's log as it grows: complete lines, once each (the file may not exist before the job starts)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self, *, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if final and self._partial:
            complete.append(self._partial)
            self._partial = b""
        return [c.decode(errors="replace") for c in complete]


StateFn = Callable[[JobInfo], None]
LineFn = Callable[[str], None]


def follow(
    job_id: str,
    on_state: StateFn,
    on_line: LineFn,
    *,
    ask: Callable[[str], JobInfo | None] = query,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    deadline_s: float | None = None,
) -> JobInfo:
    """Until the job is done: every state change to ``on_state``, every new log line to ``on_line``. Returns the
    job's last state. With ``deadline_s``, gives up after that long (returns the last state seen)."""
    last: JobInfo | None = None
    tail: LogTail | None = None
    started = clock()
    while True:
        info = ask(job_id)
        if info is None:
            raise NodekitError(
                f"Slurm no longer knows job {job_id} (it ended longer ago than MinJobAge)",
                fix=f"sacct -j {job_id} for its end, if the cluster keeps accounting",
            )
        if last is None or (info.state, info.reason) != (last.state, last.reason):
            on_state(info)
        last = info
        if tail is None and info.log:
            tail = LogTail(Path(info.log))
        for line in tail.lines(final=info.done) if tail else []:
            on_line(line)
        if info.done or (deadline_s is not None and clock() - started > deadline_s):
            return info
        sleep(POLL_S)


class Stopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP while following: the job is cancelled."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
