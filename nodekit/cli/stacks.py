"""``nodekit stacks``: every rank's Python stack on every node, ranks grouped by where they wait."""

from __future__ import annotations

from typing import Annotated

import typer

from nodekit.cli.common import ConfigOpt, app, handled, load_settings
from nodekit.cli.nodes import FleetFileOpt, FleetRankOpt, OutDirOpt

AllOpt = Annotated[
    bool, typer.Option("--all", help="every rank's stack and other threads, and the job's processes that are no rank")
]


@app.command()
@handled
def stacks(
    node_rank: FleetRankOpt = None,
    every: AllOpt = False,
    out_dir: OutDirOpt = None,
    hostfile: FleetFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Print the Python stack of every worker on every node, ranks that wait in the same place as one entry
    ("ranks 0,2,3 in all_gather at train.py:88; rank 1 in all_reduce at train.py:61"), then each place's stack.

    With hosts configured (or --hostfile) every host is read through its ssh:// engine, as `nodekit run` reaches
    it; else the nodes `nodekit up` runs on this machine. The job goes on: each of its processes writes its stack
    when signalled (Python's faulthandler, armed by the image's launcher)."""
    from nodekit.backends.compose import stacks as node_stacks
    from nodekit.cli import ui
    from nodekit.cli.nodes import _fleet
    from nodekit.errors import JobFailed
    from nodekit.launcher.stacks import places

    settings = load_settings(config)
    hosts = _fleet(settings, hostfile)
    if hosts is not None:
        from nodekit.backends.fleet import manage

        found = manage.stacks(settings, hosts, node_rank)
    else:
        found = node_stacks.gather(node_stacks.local_targets(settings, node_rank, out_dir))
    nobody = found.nothing_runs()
    if nobody is not None:
        raise JobFailed(nobody, exit_code=1, fix="nodekit ps (or nodekit status), then nodekit up or nodekit run")
    if found.stacks:
        ui.out.print(places.report(found.stacks, every=every), markup=False)
    for line in found.absent_lines() if hosts is not None or node_rank is not None else []:
        ui.error(f"stacks: {line}")
    for line in found.problems:
        ui.error(f"stacks: {line}")
    if found.problems:
        raise typer.Exit(1)
