"""Node commands: compose, up, down, logs, ps. Each acts on one node's compose project on this host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodekit.cli.common import (
    BuildOpt,
    ConfigOpt,
    DebugOpt,
    DryRunOpt,
    ImageOpt,
    MainOpt,
    RankOpt,
    app,
    handled,
    job_flags,
    load_settings,
    reporter,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nodekit.backends.compose.node import NodePlan
    from nodekit.backends.fleet.hosts import FleetHost
    from nodekit.backends.shape import BackendPlan
    from nodekit.config.settings import Settings

OutDirOpt = Annotated[Path | None, typer.Option("--out-dir", help="where node-<rank>.yaml goes (default: compose/)")]


def _plan(
    settings: Settings,
    rank: int,
    main: str | None,
    image: str | None,
    debug: bool,
    out_dir: Path | None,
    image_id: Callable[[str], str] | None = None,
    *,
    dry_run: bool = False,
) -> BackendPlan[NodePlan]:
    import os

    from nodekit.backends.compose.node import plan
    from nodekit.job import secret
    from nodekit.job.gather import gather_node

    # The node's plan from its world, gathered once (refusals in the order a user meets them); the job secret is
    # asked for last, once everything else passed, since asking may create the project's secret file.
    return plan(
        settings,
        gather_node(
            settings, rank, main, image=image, environ=os.environ, image_id=image_id, dry_run=dry_run,
            job_secret=lambda: secret.for_node(os.environ, settings.project_dir, create=not dry_run),
        ),
        debug=debug,
        out_dir=out_dir,
    )  # fmt: skip


@app.command()
@handled
@job_flags
def compose(
    node_rank: RankOpt,
    main: MainOpt = None,
    image: ImageOpt = None,
    out_dir: OutDirOpt = None,
    debug: DebugOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    **job: Any,
) -> None:
    """Write compose/node-<rank>.yaml for this node and print its path.

    The file is self-contained: `docker compose -f compose/node-<rank>.yaml up` runs this node by hand.
    """
    from nodekit.backends.compose.node import write_compose
    from nodekit.cli.ui import show_plan

    plan = _plan(load_settings(config, **job), node_rank, main, image, debug, out_dir, dry_run=dry_run)
    if dry_run:
        show_plan(plan)
        return
    for warning in plan.warnings:
        reporter().warn(warning)
    typer.echo(write_compose(plan.detail))


@app.command()
@handled
@job_flags
def up(
    node_rank: RankOpt,
    main: MainOpt = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="start in the background and return")] = False,
    build: BuildOpt = False,
    image: ImageOpt = None,
    out_dir: OutDirOpt = None,
    debug: DebugOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    **job: Any,
) -> None:
    """Write this node's compose file and run it: logs stream with a node prefix, the exit code is the job's."""
    import socket

    from nodekit.backends.compose import node
    from nodekit.cli.ui import JobLog, show_plan
    from nodekit.runs.recorder import recording

    settings = load_settings(config, **job)
    if build and image is None:
        from nodekit.cli.images import base_when_missing
        from nodekit.image import builder as building

        settings, rep = load_settings(config, **job), reporter()
        if not dry_run:
            base_when_missing(settings, rep)
        image = building.build(settings, rep, dry_run=dry_run).tag
    image_id = None if dry_run else node.image_id_here(node_rank)
    plan = _plan(settings, node_rank, main, image, debug, out_dir, image_id, dry_run=dry_run)
    if dry_run:
        show_plan(plan)
        return
    rep = reporter()
    log = JobLog()
    try:
        with recording(settings, "up", [(node_rank, socket.gethostname())], warn=rep.warn) as rec:

            def on_line(line: str) -> None:
                rec.line(node_rank, line)
                log(node_rank, line)

            code = node.up(plan.detail, rep, detach=detach, on_line=on_line, debug=debug, events=rec)
            if detach:
                rec.detach()
            else:
                rec.finish(code)
    finally:
        log.close()
    raise typer.Exit(code)


def _node_here(settings: Settings, rank: int, out_dir: Path | None) -> tuple[Path | None, str]:
    """Node ``rank``'s compose file on this host (None where it was never written here: Docker finds the containers
    by project) and its compose project."""
    from nodekit.backends.compose.node import compose_path, project_for

    path = compose_path(settings, rank, out_dir)
    return path if path.is_file() else None, project_for(settings, rank)


def _ranks(settings: Settings, node_rank: int | None) -> list[int]:
    """Without hosts, down and logs act on this host's nodes: every node of the project whose compose project is on
    this engine (running or stopped), or only the one --node-rank names where it is among them."""
    from nodekit.backends.compose.node import ranks_here

    here = ranks_here(settings)
    return here if node_rank is None else [r for r in here if r == node_rank]


def _nowhere(settings: Settings, node_rank: int | None) -> str:
    """What is not on this host: the node --node-rank names, else any node of the project."""
    from nodekit.backends.compose.node import project_for

    if node_rank is None:
        return f"no node of {settings.image_name} is on this host"
    return f"node {node_rank} of {settings.image_name} ({project_for(settings, node_rank)}) is not on this host"


# With hosts configured (nodekit.toml `hosts`, or --hostfile), logs and down act on the whole fleet from the head.
FleetRankOpt = Annotated[
    int | None, typer.Option("--node-rank", "-r", "--node", help="only this node (default: every node of the project)")
]
FleetFileOpt = Annotated[Path | None, typer.Option("--hostfile", help="act on these hosts (DeepSpeed/MPI hostfile)")]


def _fleet(settings: Settings, hostfile: Path | None) -> list[FleetHost] | None:
    """The fleet's hosts when hosts are configured, else None (this node only)."""
    if not settings.hosts and hostfile is None:
        return None
    from nodekit.backends.fleet.hosts import hosts_of

    return hosts_of(settings, hostfile)


def _failed_hosts(failed: Any, command: str) -> None:
    """One error line per host the fleet command could not act on, then exit 1 (none: nothing)."""
    if not failed:
        return
    from nodekit.cli import ui

    for f in failed:
        ui.error(f"{command}: {f.line()}")
    raise typer.Exit(1)


@app.command()
@handled
def down(
    node_rank: FleetRankOpt = None,
    timeout: Annotated[int, typer.Option(help="seconds to let the job stop before it is killed")] = 30,
    out_dir: OutDirOpt = None,
    hostfile: FleetFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Stop and remove this host's nodes of the project (--node-rank R: only that one; with hosts configured: every
    node's, on every host)."""
    settings = load_settings(config)
    hosts = _fleet(settings, hostfile)
    if hosts is not None:
        from nodekit.backends.fleet import manage

        done, failed = manage.down(settings, hosts, node_rank, timeout)
        for h in done:
            typer.echo(f"{h.name}: down")
        _failed_hosts(failed, "down")
        return
    from nodekit.system import docker

    ranks = _ranks(settings, node_rank)
    if not ranks:
        typer.echo(f"{_nowhere(settings, node_rank)}: nothing to stop")
    for rank in ranks:
        path, project = _node_here(settings, rank, out_dir)
        docker.compose_down(path, project, timeout=timeout)
        typer.echo(f"node {rank} ({project}) is down")


@app.command()
@handled
def logs(
    node_rank: FleetRankOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep following until the job ends")] = False,
    tail: Annotated[str | None, typer.Option(help="only the last N lines")] = None,
    out_dir: OutDirOpt = None,
    hostfile: FleetFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Print the job output of this host's nodes, merged (--node-rank R: only that one; with hosts configured: every
    node's, from every host)."""
    settings = load_settings(config)
    hosts = _fleet(settings, hostfile)
    if hosts is not None:
        from nodekit.backends.fleet import manage
        from nodekit.cli.common import line_printer

        log = line_printer(None)
        seen = [0]

        def counted(rank: int, line: str) -> None:
            seen[0] += 1
            log(rank, line)

        try:
            failed = manage.logs(settings, hosts, counted, node=node_rank, follow=follow, tail=tail)
        finally:
            log.close()
        _failed_hosts(failed, "logs")
        if not seen[0]:
            from nodekit.cli.ui import err

            err.print(
                f"nodekit: no output from {'node ' + str(node_rank) if node_rank is not None else 'any node'}: "
                "a finished nodekit run removes its containers (keep_containers = true keeps them); its output is "
                "in nodekit runs show last --log",
                markup=False,
            )
        return
    from nodekit.cli.common import line_printer
    from nodekit.errors import UsageError
    from nodekit.system import docker
    from nodekit.system.merge import merged

    ranks = _ranks(settings, node_rank)
    if not ranks:
        raise UsageError(
            _nowhere(settings, node_rank),
            fix="nodekit up --node-rank R first (nodekit ps lists this host's nodes)",
        )

    def one(rank: int) -> Callable[[], Iterable[str]]:
        path, project = _node_here(settings, rank, out_dir)
        return lambda: docker.compose_logs(path, project, follow=follow, tail=tail)

    log = line_printer(None)
    try:
        lost = merged({r: one(r) for r in ranks}, log)
    finally:
        log.close()
    if lost:
        raise next(iter(lost.values()))


@app.command()
@handled
def ps(
    node_rank: Annotated[int | None, typer.Option("--node-rank", "-r", help="only this node")] = None,
    out_dir: OutDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Show this host's nodekit containers for the project: node, state, exit code."""
    from nodekit.cli.ui import out

    out.print(f"{'NODE':<6}{'PROJECT':<40}{'STATE':<12}EXIT", markup=False)
    for row in nodes_here(load_settings(config), node_rank, out_dir):
        code = "" if row["exit_code"] is None else str(row["exit_code"])
        out.print(f"{row['node']:<6}{row['project']:<40}{row['state']:<12}{code}", markup=False)


def nodes_here(settings: Any, node_rank: int | None, out_dir: Path | None) -> list[dict[str, Any]]:
    """This host's containers of the project's nodes (``node_rank``: that node's only), one row each."""
    from nodekit.system import docker

    rows: list[dict[str, Any]] = []
    for r in [node_rank] if node_rank is not None else range(settings.nnodes):
        path, project = _node_here(settings, r, out_dir)
        rows += [{"node": r, "project": project, "state": c.status, "exit_code": c.exit_code}
                 for c in docker.compose_ps(path, project)]  # fmt: skip
    return rows
