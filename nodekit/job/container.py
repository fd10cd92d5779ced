"""What one rank's container is, whatever backend starts it: :class:`ContainerSpec`, decided by
:func:`nodekit.job.plan.plan_container` and rendered, each a pure translation, by every backend: the compose file
(``backends/compose/render.py``), Slurm's ``docker run``, ``ch-run`` and pyxis lines (``backends/slurm/modes.py``)
and the Kubernetes pod template (``backends/k8s/render.py``). No backend reads its own output back.

Values only the backend knows when the container starts are declared :class:`Hole` s, never placeholders: the
node's rank (:data:`RANK`), main's address (:data:`MAIN_ADDR`) and the image's id on the node's engine
(:data:`IMAGE_ID`). Each backend fills them its own way: compose from what planning knew (``rank``, ``main_addr``,
``image_id`` below), a Slurm task from its allocation and its node's engine, a pod from its completion index and
pod 0's DNS name.

Secrets travel by name only: ``secrets`` lists the variables whose value is the job's own secret (the backend keeps
the value where no other user can read it: a 0600 compose file, the 0600 batch script's environment, a Kubernetes
Secret), ``pass_env`` the user's variables taken by name from the environment that starts the container.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nodekit.launcher.contract import TORCHRUN_KILL_AFTER_S, WORKDIR
from nodekit.system.host.facts import HostFacts

# NVIDIA's recommendation for deep-learning containers (nvidia-docker's --ulimit stack=67108864).
STACK_BYTES = 64 * 1024 * 1024
# How long `docker stop` (and compose down, Kubernetes, the fleet's stop) waits before SIGKILL: torchrun's own
# escalation (TORCHRUN_KILL_AFTER_S, its workers' time to write a checkpoint) plus the launcher's last words (the
# stop line, the done mark the other nodes read). With the two equal, a node whose workers took the whole time was
# SIGKILLed by the engine in the same second: exit 137 and no done mark, so the others called it lost, not stopped.
STOP_GRACE_S = TORCHRUN_KILL_AFTER_S + 15


@dataclass(frozen=True)
class Hole:
    """A value the backend fills in when it starts the container (see the module's docstring)."""

    what: str

    def __str__(self) -> str:
        return f"<{self.what}>"


RANK = Hole("node rank")
MAIN_ADDR = Hole("main's address")
IMAGE_ID = Hole("image id on the node")

Value = str | Hole


@dataclass(frozen=True)
class EnvVar:
    """One variable of the container: a literal value or a hole. ``per_rank``: the value may differ between the
    job's ranks (the rank, processes, the interface); job-wide otherwise (the same on every rank)."""

    name: str
    value: Value
    per_rank: bool = False


@dataclass(frozen=True)
class Mount:
    """A bind mount of a host directory. ``create``: made when missing (the outputs directory); a dataset that is
    missing must be an error, never an empty directory made for it."""

    source: str
    target: str
    read_only: bool
    create: bool = False


def docker_mount(m: Mount) -> str:
    """``docker run --mount``'s value for ``m`` (Go's encoding/csv: a field quoted when it holds , " or a line end).
    A mount made when missing is never read-only (the compose renderer's rule)."""
    fields = ["type=bind", f"source={m.source}", f"target={m.target}"]
    if m.read_only and not m.create:
        fields.append("readonly")
    return ",".join('"' + f.replace('"', '""') + '"' if any(c in f for c in ',"\n\r') else f for f in fields)


@dataclass(frozen=True)
class Ulimit:
    name: str  # "stack", "memlock" (bytes; -1 unlimited)
    soft: int
    hard: int


@dataclass(frozen=True)
class ContainerSpec:
    """One rank's container, complete: every backend renders this and nothing else about the container.

    ``command`` is the argument list of the image's entrypoint (the launcher). ``env`` in order, then ``secrets``
    and ``pass_env`` (names only). ``gpus``: None for no GPU access, else how many the container reserves ("all":
    every GPU of the node). ``ports`` are published on main's address (bridge network, node 0 only). ``init``: a real
    PID 1 that forwards signals and reaps orphans. ``rank``, ``main_addr`` and ``image_id`` are what planning knew
    of the holes (``main_addr`` None and ``image_id`` "" when it did not); a backend that fills holes itself ignores
    them."""

    name: str  # the job's
    rank: int
    nnodes: int
    image: str
    command: tuple[str, ...]
    env: tuple[EnvVar, ...]
    secrets: tuple[str, ...] = ()
    pass_env: tuple[str, ...] = ()
    labels: tuple[tuple[str, Value], ...] = ()
    mounts: tuple[Mount, ...] = ()
    ulimits: tuple[Ulimit, ...] = ()
    gpus: int | Literal["all"] | None = None
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    # Host networking: NCCL and gloo advertise the container's own address to the other nodes; behind a bridge
    # network that address is a private NAT address nobody else can reach. (bridge: every node on one machine.)
    network: Literal["host", "bridge"] = "host"
    ports: tuple[int, ...] = ()
    # Host IPC: DataLoader workers and NCCL's shared-memory transport outgrow Docker's 64 MB /dev/shm.
    ipc: Literal["host"] = "host"
    # A real PID 1 (Docker's tini) forwards signals and reaps orphans: in launcher = "env" mode the user's script
    # would otherwise be PID 1, ignore SIGTERM, and make every stop wait out the grace period.
    init: bool = True
    workdir: str = WORKDIR
    stop_grace_s: int = STOP_GRACE_S
    main_addr: str | None = None
    image_id: str = ""

    @property
    def job_env(self) -> tuple[EnvVar, ...]:
        """The variables that are the same on every rank."""
        return tuple(v for v in self.env if not v.per_rank)

    @property
    def rank_env(self) -> tuple[EnvVar, ...]:
        """The variables that may differ between ranks."""
        return tuple(v for v in self.env if v.per_rank)

    @property
    def holes(self) -> frozenset[Hole]:
        """Every hole in the description: what the backend must fill."""
        values = [v.value for v in self.env] + [v for _, v in self.labels]
        return frozenset(v for v in values if isinstance(v, Hole))


def ulimits(facts: HostFacts) -> tuple[Ulimit, ...]:
    """The ulimits a node's container asks for on a host with ``facts``."""
    stack = STACK_BYTES if facts.stack_hard is None else min(STACK_BYTES, facts.stack_hard)
    limits = [Ulimit("stack", stack, stack)]
    # runc refuses to start a container whose limit exceeds what the daemon may raise to (seen with an 8 MiB
    # hard memlock): ask for unlimited memlock only where the host allows it.
    if facts.memlock_hard is None:
        limits.append(Ulimit("memlock", -1, -1))
    return tuple(limits)
