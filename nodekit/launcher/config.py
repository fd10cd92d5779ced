"""The launcher's input: the container environment, parsed once into a frozen :class:`LaunchConfig`.

:func:`parse_env` is pure (a mapping in, a config out) so the contract with ``nodekit/job/env.py`` is testable
without a container or torch. Every problem is an :class:`EnvError` whose message names the variable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from nodekit.launcher import contract
from nodekit.launcher.contract import (
    DEFAULT_LAUNCH_MODE,
    LAUNCH_MODES,
    LINK_SECONDS_DEFAULT,
    LINK_SECONDS_MAX,
    LINK_SECONDS_MIN,
    OUTPUT_DIR,
    Env,
)
from nodekit.launcher.stacks.hook import DEFAULT_DIR as DEFAULT_WORKER_DIR

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
Check = Literal["warn", "refuse", "off"]
CHECKS: tuple[Check, ...] = ("warn", "refuse", "off")
DEFAULT_PEER_TIMEOUT = 15.0
MIN_PEER_TIMEOUT = 3.0
DEFAULT_STALL_TIMEOUT = 300.0
# Ranks record their progress once a second and nodes publish it once a second: a shorter window would be noise.
MIN_STALL_TIMEOUT = 5.0
StallAction = Literal["stop", "warn"]
STALL_ACTIONS: tuple[StallAction, ...] = ("stop", "warn")
# Timeouts the launcher's arithmetic and Python's waits can hold (timedelta, threading.TIMEOUT_MAX), with room to
# spare; nodekit.toml is held to the same bound (nodekit/config/inputs.py), this guards a hand-edited compose file.
MAX_TIMEOUT_S = 7 * 24 * 3600


class EnvError(ValueError):
    """A required variable is missing or a variable does not parse; the message is one line naming it."""


@dataclass(frozen=True)
class LaunchConfig:
    """What one node's launcher knows about the job, all of it from the environment."""

    master_addr: str
    master_port: int
    node_rank: int
    nnodes: int
    nproc_per_node: int
    world_size: int | None
    name: str
    mode: str  # one of contract.LAUNCH_MODES
    max_restarts: int
    rdzv_timeout: float
    peer_timeout: float  # 0: no peer watchdog
    preflight: bool
    preflight_port: int
    output_dir: str
    fingerprint: str
    image_id: str
    iface: str | None
    allow_heterogeneous_gpus: bool
    accelerator: str = "cpu"  # mode fabric: NODEKIT_ACCELERATOR, resolved on the host
    strategy: str = "ddp"  # mode fabric
    precision: str | None = None  # mode fabric
    nproc_declared: tuple[tuple[int, str], ...] = ()  # NODEKIT_NPROC_DECLARED: (rank, "N" or "auto") per node
    gpus_declared: tuple[tuple[int, int], ...] = ()  # NODEKIT_GPUS_DECLARED: (rank, N) where declared
    data_check: tuple[tuple[str, str], ...] = ()  # NODEKIT_DATA_CHECK: (container path, "sizes" or "hashes")
    exit_guard: bool = True  # NODEKIT_EXIT_GUARD for the job's processes (nodekit/launcher/exitguard.py)
    # [health]: the link check (NODEKIT_LINK_CHECK, _MIN_LINK_GBIT, _LINK_SECONDS) and the GPU health check
    # (NODEKIT_GPU_HEALTH, NODEKIT_DCGM), both after a good preflight; NODEKIT_CHECKS_ONLY: no training after them.
    link_check: Check = "warn"
    min_link_gbit: float | None = None
    link_seconds: float = LINK_SECONDS_DEFAULT
    gpu_health: Check = "warn"
    dcgm: bool = True
    checks_only: bool = False
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # NODEKIT_STALL_TIMEOUT; 0: no stall watch
    stall_action: StallAction = "stop"  # NODEKIT_STALL_ACTION
    worker_dir: str = DEFAULT_WORKER_DIR  # NODEKIT_WORKER_DIR: each job process's stack and progress (stacks/hook.py)
    # NODEKIT_JOB_SECRET: what this node presents to main's store (launcher/auth.py); never printed.
    job_secret: str = field(default="", repr=False)

    @property
    def is_main(self) -> bool:
        return self.node_rank == 0


def _int(
    env: Mapping[str, str], key: str, *, default: int | None = None, lo: int | None = None, hi: int | None = None
) -> int:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        if default is None:
            raise EnvError(f"{key} is not set (nodekit's compose file sets it; run `nodekit compose` again)")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvError(f"{key}={raw!r} is not an integer") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
        raise EnvError(f"{key}={value} is outside {bounds}")
    return value


def _bool(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise EnvError(f"{key}={raw!r} is not a boolean (use 1 or 0)")


def _per_node(env: Mapping[str, str], key: str, nnodes: int, *, auto: bool) -> tuple[tuple[int, str], ...]:
    """``0:2,1:auto`` -> ((0, "2"), (1, "auto")); ranks in 0..nnodes-1, counts >= 0 (or auto where allowed)."""
    raw = env.get(key, "").strip()
    out: dict[int, str] = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        rank, sep, count = item.partition(":")
        if not (sep and rank.strip().isdigit() and (count.strip().isdigit() or (auto and count.strip() == "auto"))):
            raise EnvError(f"{key}={raw!r} is not a list of rank:count (e.g. 0:2,1:1)")
        if int(rank) >= nnodes:
            raise EnvError(f"{key}={raw!r} names node {int(rank)}, outside 0..{nnodes - 1}")
        out[int(rank)] = count.strip()
    return tuple(sorted(out.items()))


def _check(env: Mapping[str, str], key: str) -> Check:
    raw = env.get(key, "").strip() or "warn"
    found = next((c for c in CHECKS if c == raw), None)
    if found is None:
        raise EnvError(f"{key}={raw!r} is not one of {', '.join(CHECKS)}")
    return found


def _float(env: Mapping[str, str], key: str, lo: float, hi: float) -> float | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise EnvError(f"{key}={raw!r} is not a number") from None
    if not lo <= value <= hi:
        raise EnvError(f"{key}={raw} is outside {lo:g}..{hi:g}")
    return value


def _data_check(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """``/data:sizes,/ref:hashes`` -> (("/data", "sizes"), ("/ref", "hashes"))."""
    raw = env.get(Env.DATA_CHECK, "").strip()
    out = []
    for item in filter(None, (p.strip() for p in raw.split(","))):
        path, _, mode = item.rpartition(":")
        if not path.startswith("/") or mode not in ("sizes", "hashes"):
            raise EnvError(f"NODEKIT_DATA_CHECK={raw!r} is not a list of /path:sizes or /path:hashes")
        out.append((path, mode))
    return tuple(out)


def _master_addr(env: Mapping[str, str]) -> str:
    addr = env.get(Env.MASTER_ADDR, "").strip()
    if not addr:
        raise EnvError("MASTER_ADDR is not set (nodekit's compose file sets it; run `nodekit compose` again)")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        if env.get(Env.RESOLVE_MAIN, "").strip() == "1":  # a pod: netfacts.resolve tried until the deadline
            raise EnvError(
                f"MASTER_ADDR={addr!r} did not resolve to a non-loopback address within NODEKIT_RDZV_TIMEOUT "
                "(is pod 0 scheduled, and its headless Service there? `kubectl get pods,svc`)"
            ) from None
        # The host resolves names once so every node agrees on main; a name resolved inside each container can
        # differ per node (the 127.0.1.1 /etc/hosts trap) and then the rendezvous hangs.
        raise EnvError(f"MASTER_ADDR={addr!r} is not an IP address (nodekit passes main's IP, not a name)") from None
    return addr


def _timeouts(env: Mapping[str, str]) -> tuple[float, float]:
    """NODEKIT_RDZV_TIMEOUT and NODEKIT_PEER_TIMEOUT, in seconds."""
    timeout_raw = env.get(Env.RDZV_TIMEOUT, "").strip() or "180"
    try:
        rdzv_timeout = float(timeout_raw)
    except ValueError:
        raise EnvError(f"NODEKIT_RDZV_TIMEOUT={timeout_raw!r} is not a number of seconds") from None
    if not 0 < rdzv_timeout <= MAX_TIMEOUT_S:
        raise EnvError(f"NODEKIT_RDZV_TIMEOUT={timeout_raw} must be more than 0 and at most {MAX_TIMEOUT_S} seconds")
    peer_raw = env.get(Env.PEER_TIMEOUT, "").strip() or str(DEFAULT_PEER_TIMEOUT)
    try:
        peer_timeout = float(peer_raw)
    except ValueError:
        raise EnvError(f"NODEKIT_PEER_TIMEOUT={peer_raw!r} is not a number of seconds") from None
    if peer_timeout > MAX_TIMEOUT_S:
        raise EnvError(f"NODEKIT_PEER_TIMEOUT={peer_raw} is more than {MAX_TIMEOUT_S} seconds")
    if peer_timeout != 0 and not peer_timeout >= MIN_PEER_TIMEOUT:
        # Nodes beat once a second: a shorter window would call a node lost for one slow beat.
        raise EnvError(
            f"NODEKIT_PEER_TIMEOUT={peer_raw} must be 0 (no peer watchdog) or at least {MIN_PEER_TIMEOUT:g} seconds"
        )
    return rdzv_timeout, peer_timeout


def _stall(env: Mapping[str, str]) -> tuple[float, StallAction]:
    """NODEKIT_STALL_TIMEOUT (seconds; 0: off) and NODEKIT_STALL_ACTION."""
    raw = env.get(Env.STALL_TIMEOUT, "").strip() or str(DEFAULT_STALL_TIMEOUT)
    try:
        timeout = float(raw)
    except ValueError:
        raise EnvError(f"NODEKIT_STALL_TIMEOUT={raw!r} is not a number of seconds") from None
    if not (timeout == 0 or MIN_STALL_TIMEOUT <= timeout <= MAX_TIMEOUT_S):
        bounds = f"{MIN_STALL_TIMEOUT:g} to {MAX_TIMEOUT_S} seconds"
        raise EnvError(f"NODEKIT_STALL_TIMEOUT={raw} must be 0 (no stall watch) or {bounds}")
    action = env.get(Env.STALL_ACTION, "").strip() or "stop"
    if action not in STALL_ACTIONS:
        raise EnvError(f"NODEKIT_STALL_ACTION={action!r} is not one of {', '.join(STALL_ACTIONS)}")
    return timeout, next(a for a in STALL_ACTIONS if a == action)


def _preflight_port(env: Mapping[str, str], master_port: int) -> int:
    """NODEKIT_PREFLIGHT_PORT, by default the contract's (:func:`nodekit.launcher.contract.preflight_port_for`)."""
    preflight_default = contract.preflight_port_for(master_port)
    default_preflight_port = preflight_default if preflight_default <= 65535 else None
    preflight_port = _int(env, Env.PREFLIGHT_PORT, default=default_preflight_port, lo=1, hi=65535)
    if preflight_port == master_port:
        # torchrun's own store listens on MASTER_PORT; sharing it would let a late torchrun client talk to ours.
        raise EnvError(f"NODEKIT_PREFLIGHT_PORT={preflight_port} must differ from MASTER_PORT")
    return preflight_port


def parse_env(env: Mapping[str, str]) -> LaunchConfig:
    """Parse the environment nodekit's compose file gives every node; raise :class:`EnvError` on the first problem.

    Required: MASTER_ADDR (an IP address; in a pod, netfacts.resolve has already turned the name into one),
    MASTER_PORT, NODE_RANK, NNODES, NPROC_PER_NODE (an integer; the host resolved ``auto``). Everything else has a
    default, listed in the package docstring.
    """
    addr = _master_addr(env)
    master_port = _int(env, Env.MASTER_PORT, lo=1, hi=65535)
    nnodes = _int(env, Env.NNODES, lo=1)
    node_rank = _int(env, Env.NODE_RANK, lo=0)
    if node_rank >= nnodes:
        raise EnvError(f"NODE_RANK={node_rank} is outside 0..{nnodes - 1} (NNODES={nnodes})")
    nproc = env.get(Env.NPROC_PER_NODE, "").strip()
    if nproc == "auto":
        raise EnvError("NPROC_PER_NODE='auto' must be resolved to an integer on the host (nodekit compose does it)")
    nproc_per_node = _int(env, Env.NPROC_PER_NODE, lo=1)
    world_size = _int(env, Env.WORLD_SIZE, lo=1) if env.get(Env.WORLD_SIZE, "").strip() else None
    mode = env.get(Env.LAUNCHER, "").strip() or DEFAULT_LAUNCH_MODE
    if mode not in LAUNCH_MODES:
        raise EnvError(f"{Env.LAUNCHER}={mode!r} is not one of {', '.join(LAUNCH_MODES)}")
    rdzv_timeout, peer_timeout = _timeouts(env)
    stall_timeout, stall_action = _stall(env)
    preflight_port = _preflight_port(env, master_port)
    iface = env.get(Env.GLOO_SOCKET_IFNAME, "").strip() or env.get(Env.NCCL_SOCKET_IFNAME, "").strip() or None
    return LaunchConfig(
        master_addr=addr,
        master_port=master_port,
        node_rank=node_rank,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        world_size=world_size,
        name=env.get(Env.NAME, "").strip(),
        mode=mode,
        max_restarts=_int(env, Env.MAX_RESTARTS, default=0, lo=0),
        rdzv_timeout=rdzv_timeout,
        peer_timeout=peer_timeout,
        preflight=_bool(env, Env.PREFLIGHT, True),
        preflight_port=preflight_port,
        output_dir=env.get(Env.OUTPUT_DIR, "").strip() or OUTPUT_DIR,
        fingerprint=env.get(Env.FINGERPRINT, "").strip(),
        image_id=env.get(Env.IMAGE_ID, "").strip(),
        iface=iface,
        allow_heterogeneous_gpus=_bool(env, Env.ALLOW_HETEROGENEOUS_GPUS, False),
        accelerator=env.get(Env.ACCELERATOR, "").strip() or "cpu",
        strategy=env.get(Env.STRATEGY, "").strip() or "ddp",
        precision=env.get(Env.PRECISION, "").strip() or None,
        nproc_declared=_per_node(env, Env.NPROC_DECLARED, nnodes, auto=True),
        gpus_declared=tuple((r, int(c)) for r, c in _per_node(env, Env.GPUS_DECLARED, nnodes, auto=False)),
        data_check=_data_check(env),
        exit_guard=_bool(env, Env.EXIT_GUARD, True),
        link_check=_check(env, Env.LINK_CHECK),
        min_link_gbit=_float(env, Env.MIN_LINK_GBIT, 1e-6, 1e6),
        link_seconds=_float(env, Env.LINK_SECONDS, LINK_SECONDS_MIN, LINK_SECONDS_MAX) or LINK_SECONDS_DEFAULT,
        gpu_health=_check(env, Env.GPU_HEALTH),
        dcgm=_bool(env, Env.DCGM, True),
        checks_only=_bool(env, Env.CHECKS_ONLY, False),
        stall_timeout=stall_timeout,
        stall_action=stall_action,
        worker_dir=env.get(Env.WORKER_DIR, "").strip() or DEFAULT_WORKER_DIR,
        job_secret=env.get(Env.JOB_SECRET, "").strip(),
    )
