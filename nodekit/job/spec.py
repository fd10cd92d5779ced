"""Frozen, validated models: what one node of one job is, and the pure decisions that make it from Settings plus
per-node facts (main's address, the node and its refusals).

Nothing here reads the environment, the file system or the network; callers pass what varies
(:mod:`nodekit.job.gather` does the reads).
"""

from __future__ import annotations

import functools
import ipaddress
import posixpath
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from nodekit.config.settings import Settings
from nodekit.config.tables import HealthSettings
from nodekit.errors import ConfigError, UsageError
from nodekit.launcher.contract import DEFAULT_LAUNCH_MODE, PREFLIGHT_PORT_OFFSET, preflight_port_for
from nodekit.system.frozen import FROZEN
from nodekit.system.host.facts import HostFacts


class Command(BaseModel):
    """The user's training command: a script path or a module, plus arguments."""

    model_config = FROZEN

    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_target(self) -> Command:
        if (self.script is None) == (self.module is None):
            raise ValueError("set exactly one of script or module")
        if self.script is not None and PurePosixPath(self.script).is_absolute():
            raise ValueError(f"script {self.script!r} must be relative to the project root")
        return self

    def argv(self) -> list[str]:
        """The arguments torchrun (or python) takes after its own options."""
        head = [self.script] if self.script is not None else ["-m", str(self.module)]
        return [*head, *self.args]


class LaunchSpec(BaseModel):
    """The job, identical on every node."""

    model_config = FROZEN

    name: str
    command: Command
    launcher: str = DEFAULT_LAUNCH_MODE  # one of contract.LAUNCH_MODES (settings checked it)
    accelerator: str | None = None  # launcher fabric; None: cuda on a node with GPUs, else cpu
    strategy: str = "ddp"  # launcher fabric
    precision: str | None = None  # launcher fabric; None: Fabric's default
    nnodes: int = Field(ge=1)
    nproc_per_node: int | Literal["auto"] = "auto"
    master_port: int = Field(29500, ge=1, le=65535 - PREFLIGHT_PORT_OFFSET)
    max_restarts: int = Field(0, ge=0)
    rdzv_timeout: int = Field(180, ge=1)
    peer_timeout: int = Field(15, ge=0)
    stall_timeout: int = Field(300, ge=0)
    stall_action: Literal["stop", "warn"] = "stop"
    env: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()  # names only: compose takes the values from the shell that runs it
    # Per node, by rank: processes (an int, or "auto" for the node's GPUs) and declared GPU counts ([nodes.R]).
    node_nproc: tuple[int | Literal["auto"], ...] = ()
    node_gpus: tuple[int | None, ...] = ()
    health: HealthSettings = HealthSettings()  # [health]: the launcher's link and GPU checks

    def nproc_of(self, rank: int) -> int | Literal["auto"]:
        """Node ``rank``'s declared processes: its [nodes.R] nproc_per_node, else the job's."""
        return self.node_nproc[rank] if rank < len(self.node_nproc) else self.nproc_per_node

    @property
    def world_size(self) -> int | None:
        """Total processes, the sum over nodes; None while some node's count is 'auto' (known after preflight)."""
        return _world_size(self.nnodes, self.nproc_per_node, self.node_nproc)

    @property
    def preflight_port(self) -> int:
        return preflight_port_for(self.master_port)


def processes(declared: int | Literal["auto"], gpus: int) -> int:
    """A node's processes: its declared count, or for "auto" one per GPU (one on a node without GPUs). Every
    backend asks here (compose and the fleet per node, Slurm and Kubernetes for every node alike)."""
    return declared if declared != "auto" else max(gpus, 1)


class MountPoint(BaseModel):
    """One mount on one node: this node's host path (its [nodes.R] override, else the shared one)."""

    model_config = FROZEN

    host: str
    container: str
    writable: bool = False
    check: Literal["none", "sizes", "hashes"] = "none"


class NodeSpec(BaseModel):
    """One node of the job: its rank, where main is (None: only the backend knows, when the job starts), and the
    job."""

    model_config = FROZEN

    rank: int = Field(ge=0)
    main_addr: str | None
    launch: LaunchSpec
    nproc: int = Field(ge=1, description="processes on this node, 'auto' resolved with this node's facts")
    iface: str | None = None
    local_addr: str | None = None
    network: Literal["host", "bridge"] = "host"
    infiniband: tuple[str, ...] = Field((), description="InfiniBand devices passed to the container")
    mounts: tuple[MountPoint, ...] = ()

    @model_validator(mode="after")
    def _rank_in_range(self) -> NodeSpec:
        if self.rank >= self.launch.nnodes:
            raise ValueError(f"node rank {self.rank} is outside 0..{self.launch.nnodes - 1}")
        if self.main_addr is not None:
            ipaddress.ip_address(self.main_addr)
        return self

    @property
    def world_size(self) -> int | None:
        """Total processes, the sum of every node's declared count; None while some node's is 'auto'."""
        return self.launch.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launch_spec(settings: Settings) -> LaunchSpec:
    """The job from settings; a missing or ambiguous training command is a ConfigError."""
    if (settings.script is None) == (settings.module is None):
        which = "both script and module are set" if settings.script else "neither script nor module is set"
        raise ConfigError(
            f"no single training command: {which}",
            fix='set script = "train.py" (or module = "pkg.train") in nodekit.toml, or pass --script',
        )
    if settings.script is not None and PurePosixPath(settings.script).is_absolute():
        raise ConfigError(f"script {settings.script!r} must be relative to the project root", fix="use a relative path")
    command = Command(script=settings.script, module=settings.module, args=settings.args)
    return LaunchSpec(
        name=settings.image_name,
        command=command,
        launcher=settings.launcher,
        accelerator=settings.accelerator if settings.accelerator not in (None, "auto") else None,
        strategy=settings.strategy or "ddp",
        precision=settings.precision,
        nnodes=settings.nnodes,
        nproc_per_node=settings.nproc_per_node,
        master_port=settings.master_port,
        max_restarts=settings.max_restarts,
        rdzv_timeout=settings.rdzv_timeout,
        peer_timeout=settings.peer_timeout,
        stall_timeout=settings.stall_timeout,
        stall_action=settings.stall_action,
        env=tuple(sorted(settings.env.items())),
        pass_env=settings.pass_env,
        node_nproc=tuple(
            o.nproc_per_node if (o := settings.nodes.get(r)) and o.nproc_per_node else settings.nproc_per_node
            for r in range(settings.nnodes)
        ),
        node_gpus=tuple(o.gpus if (o := settings.nodes.get(r)) else None for r in range(settings.nnodes)),
        health=settings.health,
    )


def check_rank(launch: LaunchSpec, rank: int) -> None:
    """UsageError unless ``rank`` is one of the job's node ranks."""
    if not 0 <= rank < launch.nnodes:
        raise UsageError(
            f"node rank {rank} is outside 0..{launch.nnodes - 1} (nnodes = {launch.nnodes})",
            fix=f"pass --node-rank between 0 and {launch.nnodes - 1}, or set nnodes",
        )


def node_spec(settings: Settings, launch: LaunchSpec, rank: int, main_ip: str | None, facts: HostFacts) -> NodeSpec:
    """Node ``rank`` of ``launch``; ``main_ip`` is already resolved to an IP address by the caller, or None where
    only the backend learns it when the job starts (Slurm's allocation, pod 0's DNS name)."""
    check_rank(launch, rank)
    override = settings.nodes.get(rank)
    nproc = processes(launch.nproc_of(rank), facts.gpu_count)
    if main_ip is not None:
        check_main_addr(settings, main_ip)
    main_addr = main_ip
    # The interface and own address toward main belong to the node that runs the file: its launcher resolves them at
    # container start (nodekit/launcher/preflight/network.py). Only a pin in the config, or a loopback main (every node
    # on this machine, where the rendering host is the running host), is written into the file.
    local = main_ip is not None and ipaddress.ip_address(main_ip).is_loopback
    iface = override.iface if override and override.iface else (facts.iface if local else None)
    local_addr = override.addr if override and override.addr else (facts.local_addr if local else None)
    if settings.network == "bridge":
        main_addr, iface, local_addr = bridge_addresses(main_ip, facts, override.iface if override else None)
    return NodeSpec(
        rank=rank,
        main_addr=main_addr,
        launch=launch,
        nproc=nproc,
        iface=iface,
        local_addr=local_addr,
        network=settings.network,
        infiniband=infiniband_for(settings, facts, rank),
        mounts=mount_points(settings, rank),
    )


def main_address(settings: Settings, rank: int, main: str | None, default_here: Callable[[], str | None]) -> str:
    """Main's address for node ``rank``: ``--main``, else ``main`` in the settings; on node 0 (which is main)
    without either, loopback for a one-node job, else ``default_here()`` (this host's address on its default route,
    where the other machines most likely reach it). UsageError when none applies."""
    if main:
        return main
    if settings.main:
        return settings.main
    if rank == 0:
        if settings.nnodes == 1:
            return "127.0.0.1"
        found = default_here()
        if found is not None:
            return found
        raise UsageError(
            "node 0 is main, and this host has no default route to take main's address from",
            fix="pass --main with this host's address as the other nodes reach it, or set main in nodekit.toml",
            node="node 0",
        )
    raise UsageError(
        "main's address is not known on this node",
        fix="pass --main with node 0's address as this node reaches it (e.g. --main 10.0.0.5), or set main in "
        "nodekit.toml",
        node=f"node {rank}",
    )


def decide_node(
    settings: Settings, launch: LaunchSpec, rank: int, main_ip: str, facts: HostFacts, absent: tuple[str, ...] = ()
) -> tuple[NodeSpec, HostFacts]:
    """Pure: node ``rank`` as the settings decide it with its host's ``facts`` (returned with the config's per-node
    pins) and main at ``main_ip``; UsageError for what they contradict, a mount source in ``absent`` included."""
    pinned = pinned_host_facts(settings, rank, facts)
    node = node_spec(settings, launch, rank, main_ip, pinned)
    check_mounts(node, absent)
    return node, pinned


def mount_points(settings: Settings, rank: int) -> tuple[MountPoint, ...]:
    """Node ``rank``'s mounts: each shared mount with that node's ``[nodes.R] mounts`` host path where set."""
    override = settings.nodes.get(rank)
    return tuple(
        MountPoint(
            host=host_path(settings, override.mounts.get(m.container, m.host) if override else m.host),
            container=m.container,
            writable=m.writable,
            check=m.check,
        )
        for m in settings.mounts
    )


def host_path(settings: Settings, path: str) -> str:
    """A mount's host path as the node's engine takes it: absolute, a relative one resolved against the project
    directory on the machine that plans (the node's own for `nodekit up`; the head's for `nodekit run`, so every
    host must have the project at the same path, as it does where the data was pushed there). A relative project
    directory is anchored at this process's working directory, as everywhere the settings are used."""
    return path if path.startswith("/") else posixpath.normpath(str(settings.project_dir.absolute() / path))


def check_mounts(node: NodeSpec, absent: tuple[str, ...]) -> None:
    """Pure: UsageError for the first of the node's mounts whose source is in ``absent``."""
    missing = next((m for m in node.mounts if m.host in absent), None)
    if missing is not None:
        raise UsageError(
            f"mount {missing.host} (for {missing.container}) does not exist on node {node.rank}",
            fix=f"create or mount it here, or set this node's path: [nodes.{node.rank}] mounts = "
            f'{{ "{missing.container}" = "/its/path" }} in nodekit.toml',
        )


def output_dir_of(settings: Settings, rank: int, cwd: Path) -> Path:
    """Node ``rank``'s host directory at /outputs: its ``[nodes.R] output_dir``, else ``output_dir`` (relative to
    the project, which ``cwd`` anchors when the project directory itself is relative)."""
    override = settings.nodes.get(rank)
    if override is not None and override.output_dir is not None:
        return Path(override.output_dir)
    return cwd / settings.resolve(settings.output_dir)


def pinned_host_facts(settings: Settings, rank: int, facts: HostFacts) -> HostFacts:
    """``facts`` with what the config pins for node ``rank`` (``[nodes.R] gpus``): a file rendered on a CPU-only
    head for a GPU node still gives that node its GPUs."""
    override = settings.nodes.get(rank)
    if override is not None and override.gpus is not None and override.gpus != facts.gpu_count:
        return facts.model_copy(update={"gpu_count": override.gpus, "gpu_models": ()})
    return facts


def check_main_addr(settings: Settings, main_ip: str) -> None:
    """A loopback main only works with every node on this machine; a per-node address elsewhere contradicts it.

    And the other way round: a node told to use a loopback address cannot be reached from a main elsewhere.
    """
    main_loopback = ipaddress.ip_address(main_ip).is_loopback
    for r, o in sorted(settings.nodes.items()):
        if r >= settings.nnodes:
            continue
        addr_loopback = o.addr is not None and _is_loopback(o.addr)
        if main_loopback and o.addr is not None and not addr_loopback:
            raise UsageError(
                f"main address {main_ip} is loopback, which only works with every node on this machine, "
                f"but [nodes.{r}] addr = {o.addr} puts node {r} on another one",
                fix="give main's address on the network the nodes share (nodekit up: --main 10.0.0.5; nodekit run: "
                'main = "10.0.0.5" in nodekit.toml)',
            )
        if not main_loopback and (addr_loopback or o.iface == "lo"):
            key, value = ("addr", o.addr) if addr_loopback else ("iface", "lo")
            raise UsageError(
                f"[nodes.{r}] {key} = {value} is loopback, but main {main_ip} is not: no other machine can reach it",
                fix=f"remove {key} from [nodes.{r}] in nodekit.toml (nodekit detects the route to main)",
            )


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def bridge_addresses(main_ip: str | None, facts: HostFacts, iface: str | None) -> tuple[str, str, None]:
    """Main's address, the interface and the local address of a node on Docker's default bridge network."""
    if main_ip is None or not ipaddress.ip_address(main_ip).is_loopback:
        raise UsageError(
            f'network = "bridge" with main {main_ip}: NCCL and gloo advertise the container\'s own address, '
            "which the bridge network hides behind NAT, so nodes on other machines cannot reach it",
            fix='remove network = "bridge" (host networking), or run every node on this machine with --main 127.0.0.1',
        )
    if facts.bridge_gateway is None:
        raise UsageError(
            'network = "bridge" but this host has no docker0 bridge (the engine runs with --bridge=none?)',
            fix='remove network = "bridge" from nodekit.toml, or start dockerd with its default bridge',
        )
    # Inside a container on the default bridge, its own interface is eth0 and this host is the gateway, where
    # node 0 publishes the rendezvous ports; the containers then reach each other directly over the bridge.
    return facts.bridge_gateway, iface or "eth0", None


def infiniband_for(settings: Settings, facts: HostFacts, rank: int) -> tuple[str, ...]:
    if settings.ib == "off":
        return ()
    if settings.ib == "on" and not facts.infiniband:
        raise UsageError(
            f'ib = "on" but node {rank} has no /dev/infiniband (driver not loaded, or no RDMA hardware)',
            fix='ls /dev/infiniband && ibv_devices to check the hardware; or set ib = "auto" to fall back to TCP',
        )
    return facts.infiniband


# Once per job, not once per node: each is O(nodes), and a job of 10,000 nodes plans 10,000 of them (the arguments'
# hashes are computed in C, each call).
@functools.lru_cache(maxsize=8)
def _counts(
    nnodes: int, default: int | Literal["auto"], node_nproc: tuple[int | Literal["auto"], ...]
) -> tuple[int | Literal["auto"], ...]:
    return tuple(node_nproc[r] if r < len(node_nproc) else default for r in range(nnodes))


@functools.lru_cache(maxsize=8)
def _world_size(
    nnodes: int, default: int | Literal["auto"], node_nproc: tuple[int | Literal["auto"], ...]
) -> int | None:
    counts = _counts(nnodes, default, node_nproc)
    return None if "auto" in counts else sum(c for c in counts if c != "auto")
