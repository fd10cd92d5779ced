"""Commands on a job's live nodes: exec (a command or a shell in a node's container) and top (what every node is
doing). Both reach the nodes as ``nodekit run`` does: each host's engine endpoint (with hosts configured), else
this machine's engine."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodekit.cli.common import ConfigOpt, app, handled, load_settings

if TYPE_CHECKING:
    from rich.table import Table

    from nodekit.backends.fleet.sampler import Row
    from nodekit.backends.fleet.targets import Target
    from nodekit.config.settings import Settings

HostfileOpt = Annotated[Path | None, typer.Option("--hostfile", help="these hosts (DeepSpeed/MPI hostfile)")]
NodeRankOpt = Annotated[int | None, typer.Option("--node-rank", "-r", "--node", help="node (rank)")]
SHELL = ["sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"]


def _targets(config: Path | None, hostfile: Path | None) -> tuple[Settings, list[Target]]:
    from nodekit.backends.fleet.targets import targets

    settings = load_settings(config)
    return settings, targets(settings, hostfile)


@app.command("exec")
@handled
def exec_(
    command: Annotated[list[str] | None, typer.Argument(help="the command, after -- (default: a shell)")] = None,
    node_rank: NodeRankOpt = None,
    all_nodes: Annotated[bool, typer.Option("--all", help="on every node, each line prefixed by its node")] = False,
    tty: Annotated[
        bool | None, typer.Option("--tty/--no-tty", help="a terminal for the command (default: when stdin is one)")
    ] = None,
    hostfile: HostfileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Run a command in a node's job container (-r R), or on every node (--all): nodekit exec -r 1 -- bash,
    nodekit exec --all -- nvidia-smi. While the job runs, and after it ended where its container was kept (a copy
    of it then). Exits with the command's code; with --all, the first failing node's (named)."""
    from nodekit.backends.fleet import inside
    from nodekit.backends.fleet.alive import alive_interval, kept_alive
    from nodekit.backends.fleet.targets import pick
    from nodekit.errors import UsageError

    if (node_rank is None) == (not all_nodes):
        raise UsageError("which node? give -r R for one node or --all for every node", fix="nodekit exec -r 0 -- bash")
    if all_nodes and tty:
        raise UsageError("--all runs without a terminal (its output is prefixed)", fix="-r R --tty for a terminal")
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    argv = list(command or [])
    if not argv and (all_nodes or not interactive):
        raise UsageError("no command to run (a shell needs a terminal)", fix="nodekit exec --all -- hostname")
    settings, found = _targets(config, hostfile)
    chosen = pick(found, node_rank)
    with kept_alive(alive_interval(settings.peer_timeout)):
        if not all_nodes:
            use_tty = interactive if tty is None else tty
            raise typer.Exit(inside.run_one(chosen[0], argv or SHELL, stdin=True, tty=use_tty))
        from nodekit.cli.common import line_printer

        ended = inside.run_all(chosen, argv, line_printer(None))
    failed = inside.first_failure(ended)
    if failed is None:
        return
    from nodekit.cli import ui

    for e in ended:
        if e.code != 0:
            ui.error(f"exec: {e.target.name}: " + (e.problem or f"{argv[0]} exited with code {e.code}"))
    raise typer.Exit(failed.code)


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return "-"


def _gpus(r: Row) -> str:
    return " ".join(
        f"{g.index}:{'-' if g.util is None else f'{g.util:.0f}%'} "
        f"{'-' if g.mem_used_mib is None else f'{g.mem_used_mib / 1024:.0f}G'}"
        f"{'' if g.power_w is None else f' {g.power_w:.0f}W'}"
        for g in r.gpus
    )


def _age(s: float | None) -> str:
    return "-" if s is None else (f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m")


COLUMNS = ("NODE", "HOST", "STATE", "SINCE", "CPU%", "MEM", "NET IN/s", "NET OUT/s", "GPUS", "AGE", "LAST LINE")


def _cells(r: Row) -> list[str]:
    """A row's cells as plain text: what a node printed (its last line, its host's name, ssh's complaint) keeps no
    terminal control sequence."""
    from nodekit.system.terminal import printable

    state = r.state + (" QUIET" if r.quiet else "")
    cpu = "-" if r.cpu_pct is None else f"{r.cpu_pct:.0f}"
    last = r.problem if r.problem and r.state in ("unreachable", "lost") else r.last_line
    cells = [str(r.rank), r.host[:24], state, r.since[5:19].replace("T", " "), cpu, _size(r.mem_bytes),
             _size(r.rx_bps), _size(r.tx_bps), _gpus(r) or "-", _age(r.line_age_s), last[:70]]  # fmt: skip
    return [printable(c) for c in cells]


def _plain(rows: list[Row]) -> str:
    table = [list(COLUMNS), *(_cells(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in table)


def _rich(rows: list[Row], title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left", expand=False)
    for c in COLUMNS:
        t.add_column(c, no_wrap=c != "LAST LINE", overflow="ellipsis")
    for r in rows:
        style = "bold yellow" if r.quiet else ("red" if r.state in ("unreachable", "lost") else None)
        t.add_row(*(Text(c) for c in _cells(r)), style=style)  # text, never markup: "[/2 done]" would raise
    return t


@app.command()
@handled
def top(
    node_rank: NodeRankOpt = None,
    once: Annotated[bool, typer.Option("--once", help="print one table and exit (two samples, about 2 s)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="with --once: one JSON list")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.5, max=60, help="seconds between samples")] = 2.0,
    hostfile: HostfileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """What every node is doing, refreshed every --interval seconds: state and since when, the job container's CPU,
    memory and network, each GPU's use, memory and power, the job's last line and its age; a node whose output
    and CPU went quiet while the others go on is marked QUIET. One SSH session per host; Ctrl-C ends it. While a
    run started here goes on, its record keeps the samples (nodekit runs report draws them)."""
    from nodekit.backends.fleet import remote
    from nodekit.backends.fleet.targets import pick
    from nodekit.backends.fleet.top import Recording, Top
    from nodekit.cli.ui import out
    from nodekit.errors import UsageError
    from nodekit.runs import store

    if as_json and not once:
        raise UsageError("--json prints one table: it goes with --once", fix="nodekit top --once --json")
    settings, found = _targets(config, hostfile)
    every = 1.0 if once else interval
    recording = Recording(store.live(store.runs_dir(settings.project_dir)))
    sampling = Top(pick(found, node_rank), every)
    try:
        if once:
            sampling.wait(2, 3 * every + remote.SSH_TIMEOUT_S + 5)
            rows = sampling.rows()
            recording.add(sampling, time.time())
            text = json.dumps([r.as_dict() for r in rows]) if as_json else _plain(rows)
            out.print(text, markup=False)
            return
        _live(sampling, recording, every, settings.image_name)
    finally:
        sampling.close()


def _live(sampling: Any, recording: Any, every: float, name: str) -> None:
    from rich.live import Live

    from nodekit.cli.ui import out

    title = f"nodekit top: {name} (every {every:g} s; Ctrl-C ends)"
    try:
        with Live(_rich(sampling.rows(), title), console=out, auto_refresh=False, transient=False) as live:
            while True:
                sampling.changed.wait(every)
                sampling.changed.clear()
                live.update(_rich(sampling.rows(), title), refresh=True)
                recording.add(sampling, time.time())
    except KeyboardInterrupt:
        return  # Ctrl-C is how top ends: its sessions are closed by the caller, exit 0
