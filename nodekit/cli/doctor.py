"""``nodekit doctor``: what would stop a multi-node job on this node, each problem with the command that fixes it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nodekit.cli.common import ConfigOpt, ImageOpt, NnodesOpt, PortOpt, app, handled, load_settings

if TYPE_CHECKING:
    from nodekit.doctor import CheckRow
    from nodekit.doctor.handshake import Arrival

_STYLE = {"PASS": "bold green", "WARN": "bold yellow", "FAIL": "bold red", "SKIP": "dim"}


@app.command()
@handled
def doctor(
    main: Annotated[
        str | None, typer.Option("--main", "-m", help="main node's address, as the other nodes reach it")
    ] = None,
    node_rank: Annotated[
        int | None, typer.Option("--node-rank", "-r", min=0, help="this node's rank (0 is main)")
    ] = None,
    listen: Annotated[
        int,
        typer.Option(
            "--listen", min=0, help="on main: answer the workers' doctors on the rendezvous ports for up to N seconds"
        ),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="from the head, on every host of `nodekit run`: the preflight, each node's GPU health and the link "
            "check between every pair of nodes, without training; prints node 0's report and the link matrix",
        ),
    ] = False,
    hostfile: Annotated[Path | None, typer.Option("--hostfile", help="with --fleet: the hosts, as nodekit run")] = None,
    image: ImageOpt = None,
    nnodes: NnodesOpt = None,
    master_port: PortOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Check this node: Docker, GPUs, the route and port toward main, limits, the image. Exit 1 on any FAIL.

    Run it on main with --node-rank 0 --listen 120 and on each worker with --main ADDR --node-rank R: the workers'
    rows then show a real TCP round trip to main (or whether the port is closed, unreachable or filtered).
    With --fleet, from the head: every host of `nodekit run` runs the job's own checks (stack, GPU health, the link
    between every pair of nodes) and nothing else; the exit code is theirs (20 a link, 21 a GPU, 17/18 preflight).
    """
    from nodekit import doctor as doc
    from nodekit.errors import UsageError
    from nodekit.system.host import net

    if fleet:
        raise typer.Exit(_fleet(config, hostfile, image, master_port))
    started = time.monotonic()
    settings = load_settings(config, nnodes=nnodes, master_port=master_port)
    facts = doc.gather(settings, main=main, rank=node_rank)
    rows = doc.rows(facts)
    if listen and not facts.is_main:
        raise UsageError(
            "--listen is for main's doctor (--node-rank 0, or --main set to an address of this machine)",
            fix="drop --listen on workers; on main: nodekit doctor --main ADDR --node-rank 0 --listen 120",
        )
    elapsed = time.monotonic() - started
    if not as_json:
        _print_rows(rows)
        _summary(rows, elapsed)
    if listen:
        bind = facts.main_ip if facts.main_ip and net.is_loopback(facts.main_ip) else "0.0.0.0"
        row = doc.serve(
            settings,
            main_ip=facts.main_ip,
            seconds=listen,
            host=bind,
            on_ready=None if as_json else _ready(bind, settings.master_port, listen, facts.main_ip),
            on_arrival=None if as_json else _arrived,
        )
        rows.append(row)
        if not as_json:
            _print_rows([row])
    if as_json:
        payload = {"ok": doc.exit_code(rows) == 0, "seconds": round(elapsed, 2), "rows": doc.as_json(rows)}
        typer.echo(json.dumps(payload, indent=2))
    raise typer.Exit(doc.exit_code(rows))


def _fleet(config: Path | None, hostfile: Path | None, image: str | None, master_port: int | None) -> int:
    """``--fleet``: node 0's output in full (every node prints the same verdicts), the others' errors only."""
    from nodekit.backends.fleet.doctor import check_fleet
    from nodekit.backends.fleet.hosts import hosts_of
    from nodekit.cli.ui import JobLog, RichReporter

    settings = load_settings(config, master_port=master_port)
    hosts = hosts_of(settings, hostfile)
    log = JobLog()

    def emit(rank: int, line: str) -> None:
        if rank != 0 and not line.startswith("nodekit: error"):
            return
        log(rank, line)

    try:
        return check_fleet(settings, hosts, RichReporter(verbose=True), emit, image=image)
    finally:
        log.close()


def _print_rows(rows: list[CheckRow]) -> None:
    from rich.markup import escape

    from nodekit.cli.ui import out

    width = max((len(r.check) for r in rows), default=10) + 2
    for r in rows:
        status = r.status.value
        out.print(f"[{_STYLE[status]}]{status}[/]  {escape(r.check.ljust(width))}{escape(r.detail)}", soft_wrap=True)
        if r.fix:
            out.print(f"{'':6}{'':{width}}[bold]fix:[/] {escape(r.fix)}", soft_wrap=True)


def _summary(rows: list[CheckRow], elapsed: float) -> None:
    from nodekit.cli.ui import out

    counts = {s: sum(1 for r in rows if r.status.value == s) for s in _STYLE}
    parts = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    out.print(f"[dim]{len(rows)} checks in {elapsed:.1f} s: {parts}[/]")


def _ready(bind: str, port: int, seconds: int, main_ip: str | None) -> Callable[[], None]:
    from nodekit.cli.ui import out
    from nodekit.launcher.contract import preflight_port_for

    def ready() -> None:
        who, preflight = main_ip or "MAIN_ADDR", preflight_port_for(port)
        out.print(
            f"listening on {bind}:{port} and :{preflight} for up to {seconds} s; on each worker run: "
            f"nodekit doctor --main {who} --node-rank R",
            markup=False,
            soft_wrap=True,
        )

    return ready


def _arrived(arrival: Arrival) -> None:
    from nodekit.cli.ui import out

    f = arrival.fields
    out.print(
        f"  node {f.get('rank', '?')} ({f.get('host', '?')} at {arrival.peer}, iface {f.get('iface', '?')}, "
        f"MTU {f.get('mtu', '?')}) reached port {arrival.port}",
        markup=False,
        soft_wrap=True,
    )
