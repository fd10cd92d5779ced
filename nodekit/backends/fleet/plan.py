"""The fleet's plan: every rank's node file and start, the ship plan and the relay chains; what ``nodekit run``
applies in each attempt and what ``nodekit run --dry-run`` prints, made by one pure function, :func:`plan`.

Gather, then plan: :mod:`nodekit.backends.fleet.nodes` collects the :class:`FleetInputs`, for the run from what each
host reported over SSH (its facts, main's address resolved on this head, the image's id, the run's secret), for the
dry run from this machine alone (the settings, the hosts, the image named with ``--image``, the last build record,
main's address as configured; no SSH, no Docker, no DNS and no file written). :func:`plan_fleet` is a pure function of
them: each rank's node is planned as ``nodekit up`` plans one (:func:`nodekit.backends.compose.node.plan`) and
started as the run starts it (``docker run`` on an ``ssh://`` host: :func:`nodekit.backends.fleet.start.run_args`).
What only a host can answer (whether it has the image, which layers travel, its host key for a relay hop) is printed
as "decided when run", never guessed; a dry run plans each node with the facts the config declares for it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodekit.backends.compose.node import NodePlan
from nodekit.backends.compose.node import plan as plan_node
from nodekit.backends.compose.render import compose_filename
from nodekit.backends.fleet.hosts import FleetHost, hosts_checked
from nodekit.backends.fleet.start import container_name, run_args, startable
from nodekit.backends.shape import BackendPlan, PlannedFile
from nodekit.config.settings import Settings
from nodekit.job.gather import world_of
from nodekit.job.spec import LaunchSpec, launch_spec, processes
from nodekit.launcher.contract import preflight_port_for
from nodekit.launcher.preflight.network import is_address
from nodekit.ship.codecs import Codec, choose_codec
from nodekit.ship.grouping import groups, relay_candidates
from nodekit.ship.plan import Step, Target
from nodekit.ship.relay import RELAY_MIN_BYTES, RelayMode
from nodekit.ship.tree import plan_tree, shape_lines
from nodekit.system.host.facts import HostFacts

WHEN_RUN = "decided when run"


@dataclass(frozen=True)
class FleetInputs:
    """Everything the fleet's plan is made from, gathered before it (:mod:`nodekit.backends.fleet.nodes`).

    ``settings`` are the job's (nnodes = the hosts, hostfile slots as processes: ``fleet.nodes.job_settings``);
    ``image`` is the image every node runs (None: chosen on this head when run); ``last_built`` is the tag the
    project's build record names, a hint only; ``main`` is main's address as the other nodes are told it, ``main_ip``
    that address as an IP (None: a name the run resolves). ``facts`` are each host's facts as it reported them, in
    rank order (empty: no host was asked, and each node is planned with what the config declares of it).
    ``image_id``, ``secret`` and ``env_set`` are what ``nodekit up``'s world holds: the image's id every node
    verifies ("" when not read), the run's job secret, the ``pass_env`` names this shell sets. ``cwd`` anchors a
    relative project (None: the project's directory)."""

    settings: Settings
    hosts: tuple[FleetHost, ...]
    image: str | None
    last_built: str | None
    main: str
    main_ip: str | None = None
    facts: tuple[HostFacts, ...] = ()
    image_id: str = ""
    secret: str = ""
    env_set: frozenset[str] = frozenset()
    cwd: Path | None = None
    debug: bool = False


@dataclass(frozen=True)
class RankPlan:
    """One rank: its host, the compose file the head writes for it, the launch values it gets, and (where the image
    and main's address are known) its node's plan and how it is started."""

    rank: int
    host: FleetHost
    compose_path: Path
    nproc: str
    """Processes on this node as the plan knows them: a number, or what decides it when run."""
    node: NodePlan | None = None
    """The node's container and compose file, as ``nodekit up`` plans one; None while the image or main's IP is
    decided when run."""
    start: tuple[str, ...] = ()
    """``docker run``'s arguments that start it over SSH on its host (after ``--detach --name``); empty where
    ``docker compose up`` starts it from its compose file."""


@dataclass(frozen=True)
class Receiver:
    """A host the image may be shipped to, and the stream it would take."""

    name: str
    codec: Codec
    scheme: str


@dataclass(frozen=True)
class FleetPlan:
    """What ``nodekit run`` would do, as far as it can be known without asking a host."""

    name: str
    project_dir: Path
    image: str | None
    last_built: str | None
    main: str
    master_port: int
    nnodes: int
    ranks: tuple[RankPlan, ...]
    receivers: tuple[Receiver, ...]
    relay: RelayMode
    chains: tuple[tuple[str, ...], ...]
    """The relay chains if every ``ssh://`` host lacked the same layers (each a tuple of node names)."""
    restarts: int
    min_nodes: int | None
    command: tuple[str, ...] = ()
    """What every node runs, after the launcher (``train.py --lr 3e-4``; ``-m pkg.train``)."""
    launcher: str = "torchrun"
    declared: bool = True
    """The nodes were planned with the facts the config declares (no host was asked: a dry run)."""
    unplanned: str = ""
    """Why no node is planned yet ("" when every rank's is)."""

    @property
    def nodes(self) -> tuple[NodePlan, ...]:
        """Every rank's node plan, in rank order (empty while the image or main's IP is decided when run)."""
        return tuple(r.node for r in self.ranks if r.node is not None)

    def to_text(self) -> str:
        """The plan as ``run --dry-run`` prints it; paths inside the project are shown relative to it."""
        preflight = preflight_port_for(self.master_port)
        lines = [
            f"# nodekit run --dry-run: {self.name}, {self.nnodes} node(s); nothing was contacted, written or started",
            f"main: {self.main}:{self.master_port} (rendezvous; nodekit's preflight store on {preflight})"
            + ("" if is_address(self.main) else f"; {WHEN_RUN}: the address this head resolves {self.main} to"),
            f"image: {self._image_text()}",
            f"command: {shlex.join(self.command)} ({self.launcher}, on every node)",
            f"before anything, {WHEN_RUN}: {hosts_checked(r.host for r in self.ranks)} (Docker engine and "
            f"Compose, GPUs, mounts; ports {self.master_port} and {preflight} free on node 0)",
        ]
        for r in self.ranks:
            lines += [
                f"node {r.rank}: {r.host.where} ({r.host.url})",
                f"  compose file: {self._shown(r.compose_path)}",
                f"  launch: node_rank {r.rank}, nnodes {self.nnodes}, nproc_per_node {r.nproc}, "
                f"main {self.main}:{self.master_port}",
            ]
            if r.node is not None:
                lines.append(f"  start: {self._start_text(r, r.node)}")
        lines += self._ship_text()
        restarts = f"restarts: {self.restarts} (the whole job on every node)"
        if self.min_nodes is not None:
            restarts += f"; going on without lost hosts down to {self.min_nodes} node(s)"
        return "\n".join([*lines, restarts, *self._nodes_text()])

    def _nodes_text(self) -> list[str]:
        if self.unplanned:
            return [f"every node's compose file and start: {WHEN_RUN}: {self.unplanned}"]
        if not self.declared:
            return []
        return [
            f"every node's compose file, as planned with what nodekit.toml declares of its host ({WHEN_RUN}: the "
            "GPUs, InfiniBand devices and limits each host reports, the image's id, the run's own job secret):"
        ]

    def _image_text(self) -> str:
        if self.image is not None:
            return f"{self.image} (--image); its id is read on this head when run and checked on every node"
        hint = f"; last built here: {self.last_built}" if self.last_built else "; no build recorded here"
        return (
            f"{WHEN_RUN}: the image of {self.name} on this head whose fingerprint is the project's as it is now "
            f"(nodekit build makes it){hint}"
        )

    def _ship_text(self) -> list[str]:
        lines = [
            f"ship: every host may receive the image; {WHEN_RUN}: which already have it (skipped) and which layers "
            "each lacks (only those travel, from the project's blob store when it holds them all)"
        ]
        for r in self.receivers:
            how = "skipped if it is this head's own engine" if r.scheme == "unix" else f"{r.codec} stream"
            lines.append(f"  {r.name}: {how}")
        if self.relay == "never":
            lines.append("relay: never (the head sends each host its own stream)")
        elif not self.chains:
            lines.append(f"relay: {self.relay}, no tree (fewer than two ssh:// hosts): the head feeds each host")
        else:
            when = "always" if self.relay == "always" else f"auto, when {RELAY_MIN_BYTES >> 20} MiB or more travels"
            lines.append(
                f"relay ({when}; {WHEN_RUN}: only hosts that lack the same layers share a tree, and a host whose "
                "host key the head lacks, or reached through a proxy, is fed directly):"
            )
            for chain in self.chains:
                lines += shape_lines(chain, plan_tree(len(chain)))
        return lines

    def _start_text(self, r: RankPlan, node: NodePlan) -> str:
        if r.start:
            argv = ["docker", "run", "--detach", "--name", container_name(node.project), *r.start]
            return f"{shlex.join(argv)} (on its host, over SSH)"
        return f"docker compose -f {self._shown(node.compose_path)} -p {node.project} up (on {r.host.url})"

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.project_dir)) if path.is_relative_to(self.project_dir) else str(path)


def plan_fleet(inputs: FleetInputs) -> FleetPlan:
    """Pure: the fleet's plan from what :func:`gather` collected."""
    s = inputs.settings
    launch = launch_spec(s)
    compose_dir = s.resolve(s.compose_dir)
    nodes = _nodes(inputs, launch)
    ranks = tuple(
        RankPlan(
            rank=h.rank,
            host=h,
            compose_path=compose_dir / compose_filename(h.rank),
            nproc=str(n.node.nproc) if n is not None and inputs.facts else _nproc(s, launch.nproc_of(h.rank), h.rank),
            node=n,
            start=_start(h, n) if n is not None else (),
        )
        for h, n in zip(inputs.hosts, nodes, strict=True)
    )
    receivers = tuple(Receiver(f"node {h.rank}", choose_codec("auto", h.url), h.scheme) for h in inputs.hosts)
    return FleetPlan(
        name=launch.name,
        project_dir=s.project_dir,
        image=inputs.image,
        last_built=inputs.last_built,
        main=inputs.main,
        master_port=s.master_port,
        nnodes=len(inputs.hosts),
        ranks=ranks,
        receivers=receivers,
        relay=s.relay,
        chains=relay_chains(inputs.hosts, s.relay),
        restarts=s.restarts,
        min_nodes=s.min_nodes,
        command=tuple(launch.command.argv()),
        launcher=launch.launcher,
        declared=inputs.facts == (),
        unplanned=unplanned(inputs),
    )


def unplanned(inputs: FleetInputs) -> str:
    """Pure: why the nodes cannot be planned from ``inputs`` yet ("" when they can): the image or main's IP is not
    known, or (no host asked) a setting needs what only the hosts report."""
    if inputs.image is None or inputs.main_ip is None:
        return "once the image and main's IP address are known (--image, and main as an address, print them here)"
    if inputs.facts:
        return ""
    if inputs.settings.ib == "on":
        return 'ib = "on" needs the InfiniBand devices each host reports'
    if inputs.settings.network == "bridge":
        return 'network = "bridge" needs the docker0 bridge each host reports'
    return ""


def _nodes(inputs: FleetInputs, launch: LaunchSpec) -> list[NodePlan | None]:
    """Each rank's node, planned as ``nodekit up`` plans one, from its host's facts (or, in a dry run, the facts
    its ``[nodes.R]`` declares); None for every rank while :func:`unplanned` says why not."""
    image, main_ip = inputs.image, inputs.main_ip
    if image is None or main_ip is None or unplanned(inputs):
        return [None] * len(inputs.hosts)
    s = inputs.settings
    facts = inputs.facts or tuple(HostFacts() for _ in inputs.hosts)
    cwd = inputs.cwd or s.project_dir
    return [
        plan_node(
            s,
            world_of(s, h.rank, main_ip, f, image=image, cwd=cwd, launch=launch,
                     image_id=inputs.image_id, job_secret=inputs.secret, env_set=inputs.env_set),
            debug=inputs.debug,
        ).detail
        for h, f in zip(inputs.hosts, facts, strict=True)
    ]  # fmt: skip


def _start(host: FleetHost, node: NodePlan) -> tuple[str, ...]:
    """How the run starts ``node`` on ``host``: ``docker run``'s arguments over SSH, or () for ``compose up``."""
    if host.scheme != "ssh" or not startable(node.container):
        return ()
    # The config-hash label hashes the file as shown: the label is readable by anyone who may inspect the container.
    return tuple(
        run_args(node.container, project=node.project, compose_file=node.compose_path, compose_text=node.shown)
    )


def plan(inputs: FleetInputs) -> BackendPlan[FleetPlan]:
    """Pure: :func:`plan_fleet` in the shape every backend returns: its steps are :meth:`FleetPlan.to_text`, its files
    every rank's compose file (the job secret masked when shown), its warnings the nodes'. ``nodekit run`` applies
    its ``detail`` (each rank's ``node`` written and started); ``--dry-run`` prints it."""
    return as_plan(plan_fleet(inputs))


def as_plan(p: FleetPlan) -> BackendPlan[FleetPlan]:
    files = tuple(
        PlannedFile(n.compose_path, n.text, secret=n.job_secret, about=f"project {n.project}") for n in p.nodes
    )
    warnings = tuple(dict.fromkeys(w for n in p.nodes for w in n.warnings))
    return BackendPlan("fleet", p, files=files, steps=p.to_text(), warnings=warnings)


def relay_chains(hosts: Sequence[FleetHost], mode: RelayMode) -> tuple[tuple[str, ...], ...]:
    """Pure: the relay trees ``--relay`` would form if every host lacked the image's same layers (the most a push
    relays), through the push's own grouping: ``ssh://`` hosts only, each tree's hosts in its order
    (:func:`~nodekit.ship.tree.plan_tree` gives who feeds whom)."""
    steps = [
        Step(Target(f"node {h.rank}", h.url), "load", "assumed to lack the image", codec=choose_codec("auto", h.url))
        for h in hosts
    ]
    travels = RELAY_MIN_BYTES  # the least that makes `auto` relay; the real size is known only when run
    chains = []
    for group in groups(steps).values():
        candidates = relay_candidates(group, travels, mode)
        if candidates:
            chains.append(tuple(s.target.name for s in candidates))
    return tuple(chains)


def _nproc(settings: Settings, declared: int | Literal["auto"], rank: int) -> str:
    if declared != "auto":
        return str(declared)
    override = settings.nodes.get(rank)
    if override is not None and override.gpus is not None:
        return f"{processes(declared, override.gpus)} (auto: [nodes.{rank}] gpus = {override.gpus})"
    return f"auto ({WHEN_RUN}: the GPUs node {rank} reports, 1 without)"
