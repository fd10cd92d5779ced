"""The doctor's data: the facts it looks at and the rows it answers with.

Plain frozen values and nothing else: :class:`DoctorFacts` is what :func:`nodekit.doctor.gathering.gather` collects
from this host and Docker, and what the pure checks (:mod:`nodekit.doctor.checks`, :mod:`nodekit.doctor.network`)
read; :class:`CheckRow` is one check's verdict. Nothing here runs a command, opens a socket or reads the environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from nodekit.config.settings import Settings
from nodekit.doctor.handshake import Probe
from nodekit.errors import UsageError
from nodekit.launcher.contract import preflight_port_for
from nodekit.system.host import net
from nodekit.system.host.facts import Firewall, HostFacts
from nodekit.system.host.net import Route


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class CheckRow:
    check: str
    status: Status
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status.value, "detail": self.detail, "fix": self.fix}


def exit_code(rows: Sequence[CheckRow]) -> int:
    return 1 if any(r.status is Status.FAIL for r in rows) else 0


def as_json(rows_: Sequence[CheckRow]) -> list[dict[str, str | None]]:
    return [r.as_dict() for r in rows_]


@dataclass(frozen=True)
class EngineCheck:
    """``nodekit.system.docker.check_engine``'s answer: versions, or the error and which part failed."""

    server: str | None = None
    compose: str | None = None
    buildx: str | None = None
    error: str | None = None
    fix: str | None = None
    failed: str | None = None  # "engine", "compose" or "buildx"


@dataclass(frozen=True)
class ContainerView:
    """Limits, shared memory and GPUs inside a container started as the job's is; sizes in bytes, None = unlimited."""

    image: str
    memlock: int | None = None
    stack: int | None = None
    nofile: int | None = None
    shm: int | None = None
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerCheck:
    """The containers doctor starts as the job's would be: what they saw inside, or why they did not run."""

    view: ContainerView | None = None
    error: str | None = None
    """Why the job-like container (limits, no GPUs) did not run; with ``view`` None."""
    note: str | None = None
    """Why no container was tried (no engine, no image)."""
    gpu_error: str | None = None
    """Why a container with every GPU did not run, on a node with GPUs."""


@dataclass(frozen=True)
class ImageCheck:
    ref: str | None = None
    present: bool = False
    fingerprint: str | None = None
    error: str | None = None
    fix: str | None = None


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the checks look at, gathered once; every field is plain data."""

    settings: Settings
    rank: int | None
    main: str | None = None
    main_ip: str | None = None
    main_error: UsageError | None = None
    main_is_here: bool = False
    host: HostFacts = field(default_factory=HostFacts)
    route: Route | None = None
    mtu: int | None = None
    probes: tuple[Probe, ...] = ()
    holders: tuple[tuple[int, str | None], ...] = ()
    """On main: (port, holder) for each rendezvous port already taken; holder None when unknown."""
    port_range: tuple[int, int] | None = None
    reserved: str | None = None
    firewall: Firewall = field(default_factory=Firewall)
    hostname: str = ""
    hostname_addrs: tuple[str, ...] = ()
    engine: EngineCheck = field(default_factory=EngineCheck)
    image: ImageCheck = field(default_factory=ImageCheck)
    containers: ContainerCheck = field(default_factory=ContainerCheck)
    toolkit: bool = False
    host_shm: int | None = None
    host_nofile: int | None = None

    @property
    def ports(self) -> tuple[int, int]:
        return self.settings.master_port, preflight_port_for(self.settings.master_port)

    @property
    def is_main(self) -> bool:
        return is_main_node(self.rank, self.main_is_here)

    @property
    def loopback_main(self) -> bool:
        return self.main_ip is not None and net.is_loopback(self.main_ip)


def is_main_node(rank: int | None, main_is_here: bool) -> bool:
    """Main's doctor: rank 0, or no rank given and --main is an address of this machine."""
    return rank == 0 or (rank is None and main_is_here)
