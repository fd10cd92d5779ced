"""The environment one node's container runs with: rendezvous, rank, network and launcher variables."""

from __future__ import annotations

from nodekit.job.spec import NodeSpec
from nodekit.system.host.facts import HostFacts

OUTPUT_DIR_IN_CONTAINER = "/outputs"

DEBUG_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_CPP_LOG_LEVEL": "INFO",
}


def rank_env(node: NodeSpec, facts: HostFacts, *, debug: bool = False) -> dict[str, str]:
    """Variables for node ``node.rank``; user-configured variables win over everything but the rank itself."""
    launch = node.launch
    env: dict[str, str] = {
        "MASTER_ADDR": node.main_addr,
        "MASTER_PORT": str(launch.master_port),
        "NODE_RANK": str(node.rank),
        "NNODES": str(launch.nnodes),
        "NPROC_PER_NODE": str(node.nproc),
    }
    if node.world_size is not None:
        env["WORLD_SIZE"] = str(node.world_size)
    env |= {
        "NODEKIT_NAME": launch.name,
        "NODEKIT_LAUNCHER": launch.launcher,
        "NODEKIT_MAX_RESTARTS": str(launch.max_restarts),
        "NODEKIT_RDZV_TIMEOUT": str(launch.rdzv_timeout),
        "NODEKIT_PEER_TIMEOUT": str(launch.peer_timeout),
        "NODEKIT_STALL_TIMEOUT": str(launch.stall_timeout),
        "NODEKIT_STALL_ACTION": launch.stall_action,
        "NODEKIT_PREFLIGHT_PORT": str(launch.preflight_port),
        "NODEKIT_OUTPUT_DIR": OUTPUT_DIR_IN_CONTAINER,
    }
    if launch.nnodes > 1:
        # What the shared nodekit.toml declares per node, so the preflight accepts exactly those differences.
        env["NODEKIT_NPROC_DECLARED"] = ",".join(f"{r}:{launch.nproc_of(r)}" for r in range(launch.nnodes))
        gpus = [(r, g) for r, g in enumerate(launch.node_gpus) if g is not None]
        if gpus:
            env["NODEKIT_GPUS_DECLARED"] = ",".join(f"{r}:{g}" for r, g in gpus)
    checked = [f"{m.container}:{m.check}" for m in node.mounts if m.check != "none"]
    if checked:
        # The launcher's same-data check: a manifest of each of these mounts, compared across nodes by the preflight.
        env["NODEKIT_DATA_CHECK"] = ",".join(checked)
    if launch.launcher == "fabric":
        # What `fabric run --accelerator/--strategy/--precision` passes on; the launcher turns them into LT_*.
        env["NODEKIT_ACCELERATOR"] = launch.accelerator or ("cuda" if facts.gpu_count > 0 else "cpu")
        env["NODEKIT_STRATEGY"] = launch.strategy
        if launch.precision is not None:
            env["NODEKIT_PRECISION"] = launch.precision
    if node.iface:
        # Both libraries otherwise pick the first non-loopback interface (or the hostname's address), which on
        # a multi-homed node is often not the one that reaches main: the classic hang at init.
        env["GLOO_SOCKET_IFNAME"] = node.iface
        env["NCCL_SOCKET_IFNAME"] = node.iface
    if not node.infiniband:
        # Without this NCCL probes for IB verbs and, on some images, fails instead of falling back to sockets.
        # Also set when InfiniBand is present but switched off (ib = "off"): the devices are not passed then.
        env["NCCL_IB_DISABLE"] = "1"
    protected = {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "NNODES"}
    env |= {k: v for k, v in launch.env if k not in protected}
    if debug:
        # A flag outranks the configuration file, so --debug wins over a configured NCCL_DEBUG=WARN.
        env |= DEBUG_ENV
    return env
