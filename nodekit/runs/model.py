"""A run record as data: what ran where (settings and lock digests, image id and fingerprint, hosts and ranks), when
each node reached each phase, and how it ended (exit codes, the failing node, rank and signal). Pure: to and from
JSON, and which phase a line of a node's output marks.
"""

from __future__ import annotations

import functools
import json
import signal as signals
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError, with_config

from nodekit.config import backends
from nodekit.launcher.contract import OWN_CONTINUED, OWN_LINES, OWN_REPORTS, PREFLIGHT_OK, RENDEZVOUS_DONE
from nodekit.runs.events import PHASES, Phase

SCHEMA = 1


def _recorded(command: str) -> str:
    if command not in backends.recorded():
        raise ValueError(f"{command!r} is not a command whose runs are recorded ({', '.join(backends.recorded())})")
    return command


# The commands whose runs are recorded: each backend's registration says which of its commands record.
Command = Annotated[str, AfterValidator(_recorded)]
State = Literal["running", "ok", "failed", "refused", "interrupted", "detached", "vanished"]

# A record is read back strictly: a cloned repo can carry .nodekit/runs/, and a value of the wrong type (a rank that
# is a string of HTML, a pid of 2**70, a start of NaN) would reach the report unescaped or crash the list.
READ = ConfigDict(strict=True, allow_inf_nan=False)
Pid = Annotated[int, Field(ge=0, lt=2**31)]  # a pid_t: os.kill raises OverflowError beyond
Time = Annotated[float, Field(ge=0, lt=253_402_300_800)]  # unix time up to the year 9999: time.gmtime's range


class NotARecord(ValueError):
    """A file that is not a run record this nodekit can read; the message says why, in one line."""


@with_config(READ)
@dataclass
class NodeRecord:
    """One node (rank) of a run: where it ran and when it reached each phase of the last attempt (unix time)."""

    rank: int
    host: str
    phases: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    lost: bool = False
    earlier: list[dict[str, float]] = field(default_factory=list)
    """The phases of earlier attempts (a restart of the whole job), oldest first."""


@with_config(READ)
@dataclass
class RunRecord:
    """One run of ``nodekit run``, ``up`` or ``slurm --submit``. ``ended`` is None while it runs (or when the process
    that wrote it vanished: :meth:`state` tells)."""

    id: str
    command: Command
    project: str
    started: Time
    pid: Pid
    settings: dict[str, Any]
    settings_digest: str
    nodes: list[NodeRecord]
    image: str = ""
    image_id: str = ""
    fingerprint: str = ""
    lock_digest: str = ""
    ended: float | None = None
    exit_code: int | None = None
    failed_rank: int | None = None
    signal: str = ""
    reason: str = ""
    attempts: int = 1
    detached: bool = False
    job_id: str = ""
    log_tail: list[str] = field(default_factory=list)
    """The failing node's last lines."""
    dropped: list[NodeRecord] = field(default_factory=list)
    """Nodes an earlier attempt had and a restart went on without (lost hosts, ``min_nodes``)."""
    refused: bool = False
    """Ended by a refusal (bad input, a host or image not ready: exit 2) before any node started: nothing ran, and
    nothing failed. ``reason`` says why."""
    schema: int = SCHEMA

    def state(self, alive: Callable[[int], bool]) -> State:
        """How it stands: ``alive(pid)`` says whether the process that writes it still runs."""
        if self.detached and self.ended is None:
            return "detached"
        if self.ended is None:
            return "running" if alive(self.pid) else "vanished"
        if self.exit_code == 0:
            return "ok"
        if self.refused:
            return "refused"
        return (
            "interrupted" if self.signal in ("SIGINT", "SIGTERM", "SIGHUP") and self.failed_rank is None else "failed"
        )

    def duration(self, now: float) -> float:
        return (self.ended if self.ended is not None else now) - self.started

    def node(self, rank: int) -> NodeRecord | None:
        return next((n for n in self.nodes if n.rank == rank), None)

    @property
    def failed_host(self) -> str:
        n = self.node(self.failed_rank) if self.failed_rank is not None else None
        return n.host if n else ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> RunRecord:
        """A record read back from its JSON; fields a newer nodekit added are ignored, missing ones with a default
        take it. Every value is checked against its type (strictly: no "3" for 3, no NaN) and range; NotARecord
        says which is wrong."""
        try:
            return _reader().validate_json(text)
        except ValidationError as e:
            problems = e.errors(include_input=False, include_url=False)
            first = problems[0]
            where = ".".join(str(part) for part in first["loc"])
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise NotARecord(f"{where + ': ' if where else ''}{first['msg']}{more}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """:meth:`from_json` of a mapping."""
        return cls.from_json(json.dumps(data))


@functools.cache
def _reader() -> TypeAdapter[RunRecord]:
    return TypeAdapter(RunRecord)


def signal_of(code: int | None) -> str:
    """The signal a shell's exit code says ended the process (128 + n), e.g. 137 -> SIGKILL; "" for none."""
    if code is None or not 128 < code < 128 + 65:
        return ""
    try:
        return signals.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def phase_of_line(text: str) -> Phase | None:
    """The phase a line of a node's output marks on its own: the launcher's preflight report and rendezvous line
    (their wording is the contract's), else the job's own output; None for the launcher's other lines. A line that
    continues one of the launcher's multi-line reports needs what came before: :class:`Lines`."""
    if text.startswith(PREFLIGHT_OK):
        return "preflight"
    if text.startswith(RENDEZVOUS_DONE):
        return "rendezvous"
    if text.startswith(OWN_LINES):
        return None
    return "output"


class Lines:
    """Reads each node's lines in order: :func:`phase_of_line`, except that the lines of one of the launcher's
    multi-line reports (``contract.OWN_REPORTS``' head, then ``OWN_CONTINUED`` lines) are the launcher's, not the
    job's first output."""

    def __init__(self) -> None:
        self._in_report: dict[int, bool] = {}

    def phase(self, rank: int, text: str) -> Phase | None:
        if self._in_report.get(rank, False) and text.startswith(OWN_CONTINUED):
            return None
        self._in_report[rank] = text.startswith(OWN_REPORTS)
        return phase_of_line(text)


def ordered(phases: Mapping[str, float]) -> list[tuple[Phase, float]]:
    """A node's phases in :data:`~nodekit.runs.events.PHASES` order, those it reached only."""
    return [(p, phases[p]) for p in PHASES if p in phases]
