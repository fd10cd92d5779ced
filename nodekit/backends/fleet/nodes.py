"""What the fleet's plan (:mod:`nodekit.backends.fleet.plan`) is made from: the settings every rank of an attempt is
planned with, and the :class:`~nodekit.backends.fleet.plan.FleetInputs` gathered for the run (:func:`gathered`: what
each host reported, main's address resolved once here) or for its dry run (:func:`gather`: this machine alone). Both
go to the one planner: ``nodekit run`` (fleet/run.py) applies the plan, ``--dry-run`` prints it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nodekit.backends.fleet.hosts import FleetHost, check_main_on_host0, fleet_main
from nodekit.backends.fleet.plan import FleetInputs
from nodekit.config.settings import Settings
from nodekit.job.gather import check_command
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


def gathered(
    settings: Settings,
    hosts: Sequence[FleetHost],
    reported: Sequence[Gathered],
    image: str,
    *,
    image_id: str = "",
    secret: str = "",
    debug: bool = False,
    environ: Mapping[str, str] | None = None,
) -> FleetInputs:
    """What the run plans an attempt from (``settings``: :func:`job_settings`'s): each host's facts as it reported
    them (its mounts were checked there, by remote.check_host), main's address resolved here once (with host
    networking, refused when it is none of host 0's addresses), the image id every node verified after shipping, the
    run's one job secret, and which pass_env variables this shell sets (``environ``, default this process's)."""
    launch = check_command(settings)
    main = fleet_main(hosts[0], settings.main)
    main_ip = net.resolve(main)
    if settings.network == "host":
        check_main_on_host0(main_ip, settings.main, hosts[0], reported[0].addresses)
    environ = os.environ if environ is None else environ
    return FleetInputs(
        settings=settings, hosts=tuple(hosts), image=image, last_built=None, main=main, main_ip=main_ip,
        facts=tuple(g.facts for g in reported), image_id=image_id, secret=secret,
        env_set=frozenset(n for n in launch.pass_env if n in environ), cwd=Path.cwd(), debug=debug,
    )  # fmt: skip


# The dry run's stand-in for the secret the run makes (masked wherever the plan is shown): each run has its own.
DRY_RUN_SECRET = "a-new-secret-for-each-run"


def gather(settings: Settings, hosts: Sequence[FleetHost], *, image: str | None, debug: bool = False) -> FleetInputs:
    """What the dry-run plan needs, from this machine only: the job's settings, the training command checked (a
    missing script is refused as the run refuses it), the build record read, main's address as configured (an IP
    only when written as one: no name is resolved), and the shell's pass_env names. Nothing is contacted or
    written."""
    from nodekit.image.builder import last_build
    from nodekit.launcher.preflight.network import is_address

    launch = check_command(settings)
    record = last_build(settings)
    tag = record.get("tag") if record else None
    main = fleet_main(hosts[0], settings.main)
    return FleetInputs(
        settings=job_settings(settings, hosts, restart=0),
        hosts=tuple(hosts),
        image=image,
        last_built=tag if isinstance(tag, str) else None,
        main=main,
        main_ip=net.resolve(main) if is_address(main) else None,
        secret=DRY_RUN_SECRET,
        env_set=frozenset(n for n in launch.pass_env if n in os.environ),
        cwd=Path.cwd(),
        debug=debug,
    )
