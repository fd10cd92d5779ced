"""The job on the fleet's hosts, planned: the settings every rank of an attempt is planned with, each rank's gathered
world, and its plan (pure but for main's address, resolved once here). ``nodekit run`` (fleet/run.py) applies them;
``nodekit run --dry-run`` (fleet/plan.py) prints the same job's settings."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nodekit.backends.compose.node import NodePlan, plan
from nodekit.backends.fleet.hosts import FleetHost, check_main_on_host0, fleet_main
from nodekit.config.settings import Settings
from nodekit.job.gather import NodeWorld, check_command, world_of
from nodekit.launcher.contract import Env
from nodekit.system.host import net
from nodekit.system.host.facts import Gathered

RESTART_ENV = Env.RESTART_COUNT


def job_settings(settings: Settings, hosts: Sequence[FleetHost], *, restart: int) -> Settings:
    """The settings every node of attempt ``restart`` is planned with: nnodes = the hosts, the restart counter in
    the environment, hostfile slots as processes per node where the config sets none."""
    nodes = dict(settings.nodes)
    for h in hosts:
        if h.slots is not None and (h.rank not in nodes or nodes[h.rank].nproc_per_node is None):
            base = nodes.get(h.rank)
            nodes[h.rank] = base.model_copy(update={"nproc_per_node": h.slots}) if base else _override(h.slots)
    env = {**settings.env, RESTART_ENV: str(restart)}
    return settings.model_copy(update={"nnodes": len(hosts), "env": env, "nodes": nodes})


def _override(nproc: int) -> Any:
    from nodekit.config.settings import NodeOverride

    return NodeOverride(nproc_per_node=nproc)


def node_worlds(
    settings: Settings,
    hosts: Sequence[FleetHost],
    facts: Sequence[Gathered],
    image: str,
    *,
    image_id: str = "",
    secret: str = "",
    environ: Mapping[str, str] | None = None,
) -> list[NodeWorld]:
    """Each rank's world, gathered: that host's own facts (its mounts were checked there, by remote.check_host),
    main's address resolved here once (with host networking, refused when it is none of host 0's addresses), the
    image id every node verified after shipping, the run's one job secret, and which pass_env variables this shell
    sets (``environ``, default this process's)."""
    launch = check_command(settings)
    main_ip = net.resolve(fleet_main(hosts[0], settings.main))
    if settings.network == "host":
        check_main_on_host0(main_ip, settings.main, hosts[0], facts[0].addresses)
    environ = os.environ if environ is None else environ
    env_set = frozenset(n for n in launch.pass_env if n in environ)
    cwd = Path.cwd()
    return [
        world_of(settings, h.rank, main_ip, g.facts, image=image, cwd=cwd, launch=launch, image_id=image_id,
                 job_secret=secret, env_set=env_set)
        for h, g in zip(hosts, facts, strict=True)
    ]  # fmt: skip


def plan_nodes(
    settings: Settings, hosts: Sequence[FleetHost], worlds: Sequence[NodeWorld], *, debug: bool = False
) -> list[NodePlan]:
    """Pure: one NodePlan per rank, each from that host's world (:func:`node_worlds`)."""
    return [plan(settings, w, debug=debug).detail for w in worlds]
