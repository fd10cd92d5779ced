"""The environment one node's container runs with: rendezvous, rank, network and launcher variables.

Each variable is declared job-wide (the same on every rank) or per rank; the rank and main's address are holes the
backend fills (nodekit/job/container.py). The names are the launcher's (nodekit/launcher/contract.py).
"""

from __future__ import annotations

import functools
from typing import Literal

from nodekit.job.container import MAIN_ADDR, RANK, EnvVar, Value
from nodekit.job.spec import LaunchSpec, NodeSpec
from nodekit.launcher.contract import LINK_SECONDS_DEFAULT, OUTPUT_DIR, Env, LaunchMode
from nodekit.system.host.facts import HostFacts

DEBUG_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_CPP_LOG_LEVEL": "INFO",
}
# What the user's env table may not replace: the rendezvous itself.
PROTECTED = frozenset({Env.MASTER_ADDR, Env.MASTER_PORT, Env.NODE_RANK, Env.NNODES})


class _Vars:
    """An ordered set of variables where a later value replaces an earlier one in its place."""

    def __init__(self) -> None:
        self.items: dict[str, EnvVar] = {}

    def job(self, name: str, value: Value) -> None:
        self.items[name] = EnvVar(name, value)

    def rank(self, name: str, value: Value) -> None:
        self.items[name] = EnvVar(name, value, per_rank=True)


@functools.lru_cache(maxsize=8)
def _nproc_declared(nnodes: int, default: int | Literal["auto"], node_nproc: tuple[int | Literal["auto"], ...]) -> str:
    """Every node's declared processes, ``rank:count`` comma-separated, once per job (O(nodes); planned once per
    node)."""
    return ",".join(f"{r}:{node_nproc[r] if r < len(node_nproc) else default}" for r in range(nnodes))


@functools.lru_cache(maxsize=8)
def _gpus_declared(node_gpus: tuple[int | None, ...]) -> str:
    """``rank:gpus`` of the nodes that declare them, once per job (O(nodes); planned once per node)."""
    return ",".join(f"{r}:{g}" for r, g in enumerate(node_gpus) if g is not None)


def node_env(node: NodeSpec, facts: HostFacts, *, debug: bool = False) -> tuple[EnvVar, ...]:
    """Variables for node ``node.rank``, in order; user-configured variables win over everything but the
    rendezvous (:data:`PROTECTED`), and ``debug``'s over those."""
    launch = node.launch
    v = _Vars()
    v.job(Env.MASTER_ADDR, MAIN_ADDR)
    v.job(Env.MASTER_PORT, str(launch.master_port))
    v.rank(Env.NODE_RANK, RANK)
    v.job(Env.NNODES, str(launch.nnodes))
    v.rank(Env.NPROC_PER_NODE, str(node.nproc))
    if node.world_size is not None:
        v.job(Env.WORLD_SIZE, str(node.world_size))
    v.job(Env.NAME, launch.name)
    v.job(Env.LAUNCHER, launch.launcher)
    v.job(Env.MAX_RESTARTS, str(launch.max_restarts))
    v.job(Env.RDZV_TIMEOUT, str(launch.rdzv_timeout))
    v.job(Env.PEER_TIMEOUT, str(launch.peer_timeout))
    v.job(Env.STALL_TIMEOUT, str(launch.stall_timeout))
    v.job(Env.STALL_ACTION, launch.stall_action)
    v.job(Env.PREFLIGHT_PORT, str(launch.preflight_port))
    v.job(Env.OUTPUT_DIR, OUTPUT_DIR)
    if launch.nnodes > 1:
        # What the shared nodekit.toml declares per node, so the preflight accepts exactly those differences.
        v.job(Env.NPROC_DECLARED, _nproc_declared(launch.nnodes, launch.nproc_per_node, launch.node_nproc))
        if gpus := _gpus_declared(launch.node_gpus):
            v.job(Env.GPUS_DECLARED, gpus)
    for key, value in health_env(launch).items():
        v.job(key, value)
    checked = [f"{m.container}:{m.check}" for m in node.mounts if m.check != "none"]
    if checked:
        # The launcher's same-data check: a manifest of each of these mounts, compared across nodes by the preflight.
        v.job(Env.DATA_CHECK, ",".join(checked))
    if launch.launcher == LaunchMode.FABRIC:
        # What `fabric run --accelerator/--strategy/--precision` passes on; the launcher turns them into LT_*.
        if launch.accelerator:
            v.job(Env.ACCELERATOR, launch.accelerator)
        else:
            v.rank(Env.ACCELERATOR, "cuda" if facts.gpu_count > 0 else "cpu")
        v.job(Env.STRATEGY, launch.strategy)
        if launch.precision is not None:
            v.job(Env.PRECISION, launch.precision)
    if node.iface:
        # Both libraries otherwise pick the first non-loopback interface (or the hostname's address), which on
        # a multi-homed node is often not the one that reaches main: the classic hang at init.
        v.rank(Env.GLOO_SOCKET_IFNAME, node.iface)
        v.rank(Env.NCCL_SOCKET_IFNAME, node.iface)
    if not node.infiniband:
        # Without this NCCL probes for IB verbs and, on some images, fails instead of falling back to sockets.
        # Also set when InfiniBand is present but switched off (ib = "off"): the devices are not passed then.
        v.rank("NCCL_IB_DISABLE", "1")
    for key, value in launch.env:
        if key not in PROTECTED:
            v.job(key, value)
    if debug:
        # A flag outranks the configuration file, so --debug wins over a configured NCCL_DEBUG=WARN.
        for key, value in DEBUG_ENV.items():
            v.job(key, value)
    return tuple(v.items.values())


def health_env(launch: LaunchSpec) -> dict[str, str]:
    """``[health]`` for the launcher (``launcher/checks.py``): only what differs from its defaults, so a job that
    leaves the table alone renders the same file as before it existed."""
    h = launch.health
    env: dict[str, str] = {}
    if h.links != "warn":
        env[Env.LINK_CHECK] = h.links
    if h.min_link_gbit is not None:
        env[Env.MIN_LINK_GBIT] = f"{h.min_link_gbit:g}"
    if h.link_seconds != LINK_SECONDS_DEFAULT:
        env[Env.LINK_SECONDS] = f"{h.link_seconds:g}"
    if h.gpus != "warn":
        env[Env.GPU_HEALTH] = h.gpus
    if not h.dcgm:
        env[Env.DCGM] = "0"
    return env
