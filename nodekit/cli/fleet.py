"""Fleet commands on the head node: run (every node, one log, one exit code) and status (a table of every node).

``nodekit logs`` and ``nodekit down`` act on the fleet too when hosts are configured (see cli/nodes.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodekit.cli.common import (
    BuildOpt,
    ConfigOpt,
    DebugOpt,
    DryRunOpt,
    ImageOpt,
    app,
    handled,
    job_flags,
    line_printer,
    load_settings,
)

if TYPE_CHECKING:
    from nodekit.backends.fleet.hosts import FleetHost
    from nodekit.config.settings import Settings

HostfileOpt = Annotated[
    Path | None, typer.Option("--hostfile", help="DeepSpeed/MPI hostfile: 'host slots=N' per line (rank = line)")
]
NodeOpt = Annotated[int | None, typer.Option("--node", help="only this node (rank)")]


def fleet_of(config: Path | None, hostfile: Path | None, **flags: Any) -> tuple[Settings, list[FleetHost]]:
    """The settings and the job's hosts. ``--nnodes`` below the hosts' count is a stated choice, said here."""
    from nodekit.backends.fleet.hosts import hosts_of, left_out

    settings = load_settings(config, **flags)
    stated = flags.get("nnodes") is not None
    hosts = hosts_of(settings, hostfile, stated=stated)
    cut = left_out(settings, hosts, hostfile) if stated else []
    if cut:
        from nodekit.cli.ui import err

        err.print(
            f"nodekit: the first {len(hosts)} of {len(hosts) + len(cut)} hosts run the job (--nnodes {len(hosts)}); "
            f"left out: {', '.join(cut[:5])}{', ...' if len(cut) > 5 else ''}",
            markup=False,
        )
    return settings, hosts


@app.command()
@handled
@job_flags
def run(
    hostfile: HostfileOpt = None,
    node: Annotated[int | None, typer.Option("--node", help="follow only this node's log (all still run)")] = None,
    image: ImageOpt = None,
    build: BuildOpt = False,
    debug: DebugOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    **job: Any,
) -> None:
    """Run the job on every host from this (head) node: check every host, ship the image where missing, write
    compose/node-<rank>.yaml per rank, start every node, stream one log. The first node to fail is named and every
    other node stopped; Ctrl-C, SIGTERM and SIGHUP stop every node (exit 128 + the signal); the exit code is the
    failing node's. With --build the project's image is built first (a no-op when it is up to date). Each run is
    recorded in .nodekit/runs/ (nodekit runs) and told to the webhook nodekit.toml names (its notify table)."""
    from nodekit.backends.fleet import run as fleet
    from nodekit.cli.ui import RichReporter

    settings, hosts = fleet_of(config, hostfile, **job)
    if build and image is None and not dry_run:
        from nodekit.image import builder as building

        image = building.build(settings, RichReporter(verbose=True)).tag
    if dry_run:  # the planner each attempt of the run applies, gathered on this machine only: no host, engine or DNS
        from nodekit.backends.fleet.nodes import gather
        from nodekit.backends.fleet.plan import plan
        from nodekit.cli.ui import show_plan

        show_plan(plan(gather(settings, hosts, image=image, debug=debug)))
        return
    from nodekit.backends.fleet.once import one_run_here
    from nodekit.runs.recorder import recording
    from nodekit.system.progress import command_started

    rep = RichReporter(verbose=True)
    # SIGHUP (a closed SSH session to the head), SIGTERM and Ctrl-C stop every node: handled(), proc.stopping.
    log = line_printer(node)
    try:
        # One run of the project on these hosts at a time (a second is refused before it is recorded); the run's
        # record (.nodekit/runs/) and its webhook messages: nodekit/runs/recorder.py.
        with (
            one_run_here(settings.image_name, hosts),
            recording(settings, "run", [(h.rank, h.where) for h in hosts], warn=rep.warn) as rec,
        ):
            code = fleet.run(settings, hosts, rep, rec.tee(log), image=image, debug=debug, events=rec,
                             started=command_started())  # fmt: skip
            rec.finish(code)
    finally:
        log.close()
    raise typer.Exit(code)


@app.command()
@handled
def status(
    node: NodeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON list instead of the table")] = False,
    hostfile: HostfileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Every node of the fleet: node, host, state, image fingerprint, since, exit code. Without hosts (nodes
    started here with nodekit up), this host's nodes, as nodekit ps shows them."""
    from nodekit.backends.fleet import manage
    from nodekit.cli.ui import out

    if hostfile is None and not (here := load_settings(config)).hosts:
        from nodekit.cli.nodes import nodes_here, ps

        if as_json:
            out.print(json.dumps(nodes_here(here, node, None)), markup=False)
        else:
            ps(node_rank=node, out_dir=None, config=config)
        return
    settings, hosts = fleet_of(config, hostfile)
    rows = manage.status(settings, hosts, node)
    if as_json:
        out.print(json.dumps([r.as_dict() for r in rows]), markup=False)
        return
    out.print(f"{'NODE':<6}{'HOST':<28}{'STATE':<14}{'IMAGE':<14}{'SINCE':<21}EXIT", markup=False)
    for r in rows:
        code = "" if r.exit_code is None else str(r.exit_code)
        out.print(f"{r.rank:<6}{r.host:<28}{r.state:<14}{r.image:<14}{r.since:<21}{code}", markup=False)
