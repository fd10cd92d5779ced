"""``nodekit run --dry-run``: the whole fleet's plan, printable, without touching any host.

Gather, then plan: :func:`gather` collects what the plan needs from this machine alone (the settings, the hosts,
the image named with ``--image``, the last build record, main's address as configured) into one frozen
:class:`FleetInputs`; :func:`plan_fleet` is a pure function of it, and :meth:`FleetPlan.to_text` prints it. No SSH,
no Docker, no DNS and no file written: what only a host can answer (whether it has the image, its GPUs, which
layers travel, its host key for a relay hop) is printed as "decided when run", never guessed.

The run itself (:mod:`nodekit.backends.fleet.run`) plans each rank's compose file from facts gathered on each host.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodekit.backends.compose.render import compose_filename
from nodekit.backends.fleet.hosts import FleetHost, fleet_main
from nodekit.backends.shape import BackendPlan
from nodekit.config.settings import Settings
from nodekit.job.spec import launch_spec, processes
from nodekit.launcher.contract import preflight_port_for
from nodekit.launcher.preflight.network import is_address
from nodekit.ship.codecs import Codec, choose_codec
from nodekit.ship.grouping import groups, relay_candidates
from nodekit.ship.plan import Step, Target
from nodekit.ship.relay import RELAY_MIN_BYTES, RelayMode
from nodekit.ship.tree import plan_tree, shape_lines

WHEN_RUN = "decided when run"


@dataclass(frozen=True)
class FleetInputs:
    """Everything the fleet's dry-run plan is made from, gathered on this machine without contacting anything.

    ``settings`` are the job's (nnodes = the hosts, hostfile slots as processes: ``fleet.nodes.job_settings``);
    ``image`` is the ``--image`` given, else None (chosen on this head when run); ``last_built`` is the tag the
    project's build record names, a hint only; ``main`` is main's address as the other nodes are told it."""

    settings: Settings
    hosts: tuple[FleetHost, ...]
    image: str | None
    last_built: str | None
    main: str


@dataclass(frozen=True)
class RankPlan:
    """One rank: its host, the compose file the head writes for it, and the launch values it gets."""

    rank: int
    host: FleetHost
    compose_path: Path
    nproc: str
    """Processes on this node as the plan knows them: a number, or what decides it when run."""


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

    def to_text(self) -> str:
        """The plan as ``run --dry-run`` prints it; paths inside the project are shown relative to it."""
        preflight = preflight_port_for(self.master_port)
        lines = [
            f"# nodekit run --dry-run: {self.name}, {self.nnodes} node(s); nothing was contacted, written or started",
            f"main: {self.main}:{self.master_port} (rendezvous; nodekit's preflight store on {preflight})"
            + ("" if is_address(self.main) else f"; {WHEN_RUN}: the address this head resolves {self.main} to"),
            f"image: {self._image_text()}",
            f"command: {shlex.join(self.command)} ({self.launcher}, on every node)",
            f"before anything, {WHEN_RUN}: every host is checked over SSH (Docker engine and Compose, GPUs, mounts; "
            f"ports {self.master_port} and {preflight} free on node 0)",
        ]
        for r in self.ranks:
            lines += [
                f"node {r.rank}: {r.host.where} ({r.host.url})",
                f"  compose file: {self._shown(r.compose_path)}",
                f"  launch: node_rank {r.rank}, nnodes {self.nnodes}, nproc_per_node {r.nproc}, "
                f"main {self.main}:{self.master_port}",
            ]
        lines += self._ship_text()
        restarts = f"restarts: {self.restarts} (the whole job on every node)"
        if self.min_nodes is not None:
            restarts += f"; going on without lost hosts down to {self.min_nodes} node(s)"
        return "\n".join([*lines, restarts])

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

    def _shown(self, path: Path) -> str:
        return str(path.relative_to(self.project_dir)) if path.is_relative_to(self.project_dir) else str(path)


def plan_fleet(inputs: FleetInputs) -> FleetPlan:
    """Pure: the fleet's plan from what :func:`gather` collected."""
    s = inputs.settings
    launch = launch_spec(s)
    compose_dir = s.resolve(s.compose_dir)
    ranks = tuple(
        RankPlan(
            rank=h.rank,
            host=h,
            compose_path=compose_dir / compose_filename(h.rank),
            nproc=_nproc(s, launch.nproc_of(h.rank), h.rank),
        )
        for h in inputs.hosts
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
    )


def plan(inputs: FleetInputs) -> BackendPlan[FleetPlan]:
    """Pure: :func:`plan_fleet` in the shape every backend returns (its steps are :meth:`FleetPlan.to_text`)."""
    return as_plan(plan_fleet(inputs))


def as_plan(p: FleetPlan) -> BackendPlan[FleetPlan]:
    return BackendPlan("fleet", p, steps=p.to_text())


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


def gather(settings: Settings, hosts: Sequence[FleetHost], *, image: str | None) -> FleetInputs:
    """What the dry-run plan needs, from this machine only: the job's settings, the training command checked (a
    missing script is refused as the run refuses it), the build record read. Nothing is contacted or written."""
    from nodekit.backends.fleet.nodes import job_settings
    from nodekit.image.builder import last_build
    from nodekit.job.gather import check_command

    check_command(settings)
    record = last_build(settings)
    tag = record.get("tag") if record else None
    return FleetInputs(
        settings=job_settings(settings, hosts, restart=0),
        hosts=tuple(hosts),
        image=image,
        last_built=tag if isinstance(tag, str) else None,
        main=fleet_main(hosts[0], settings.main),
    )
