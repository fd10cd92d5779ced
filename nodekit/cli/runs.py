"""``nodekit runs``: the records of the runs started here (``.nodekit/runs/``): the list, one run, its report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from nodekit.cli.common import ConfigOpt, app, handled, load_settings

runs_app = typer.Typer(
    help="The runs started here (nodekit run, up, slurm --submit), newest first; show one; write its report.",
    no_args_is_help=False,
)
app.add_typer(runs_app, name="runs")

RunIdArg = Annotated[str, typer.Argument(help="a run id, a unique start of one, or last")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON instead of text")]


def _root(config: Path | None) -> Path:
    from nodekit.runs import store

    return store.runs_dir(load_settings(config).project_dir)


def _took(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else (f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h")


def _failed(r: Any) -> str:
    if r.failed_rank is None:
        return str(r.signal)
    return f"node {r.failed_rank} ({r.failed_host})" + (f" {r.signal}" if r.signal else "")


@runs_app.callback(invoke_without_command=True)
@handled
def runs(ctx: typer.Context, as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Every run recorded here, newest first: id, command, start (UTC), duration, nodes, state, exit code, and the
    failing node with its signal."""
    if ctx.invoked_subcommand is not None:
        return
    from nodekit.cli import ui
    from nodekit.cli.ui import out
    from nodekit.runs import store

    def bad(path: Path, why: str) -> None:
        ui.warn(f"{path} is not a nodekit run record ({why}): left out (remove it unless you want to look into it)")

    now = time.time()
    found = [r for _, r in store.records(_root(config), bad)]
    if as_json:
        out.print(json.dumps([_summary(r, now) for r in found]), markup=False)
        return
    out.print(f"{'ID':<21}{'COMMAND':<8}{'STARTED (UTC)':<21}{'TOOK':<7}{'NODES':<6}{'STATE':<12}{'EXIT':<6}FAILED",
              markup=False)  # fmt: skip
    for r in found:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.started))
        code = "" if r.exit_code is None else str(r.exit_code)
        out.print(f"{r.id:<21}{r.command:<8}{started:<21}{_took(r.duration(now)):<7}{len(r.nodes):<6}"
                  f"{r.state(store.alive):<12}{code:<6}{_failed(r)}", markup=False)  # fmt: skip


def _summary(r: Any, now: float) -> dict[str, Any]:
    from nodekit.runs import store

    return {"id": r.id, "command": r.command, "started": r.started, "duration_s": round(r.duration(now), 1),
            "nodes": len(r.nodes), "state": r.state(store.alive), "exit_code": r.exit_code,
            "failed_rank": r.failed_rank, "failed_host": r.failed_host or None, "signal": r.signal or None}  # fmt: skip


@runs_app.command("show")
@handled
def show(
    run_id: RunIdArg = "last",
    log: Annotated[bool, typer.Option("--log", help="also print the merged log")] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """One run: what ran where (settings and lock digests, image id and fingerprint), each node's phase times,
    exit codes, the failing node, rank and signal, its last lines; --log adds the merged log."""
    from nodekit.cli.ui import out
    from nodekit.runs import store
    from nodekit.runs.events import PHASES

    d = store.find(_root(config), run_id)
    r = store.load(d)
    if as_json:
        out.print(json.dumps({**r.to_dict(), "state": r.state(store.alive)}, indent=1), markup=False)
        return
    now = time.time()
    lines = [
        f"run      {r.id} (nodekit {r.command}, pid {r.pid}) in {r.project}",
        f"state    {r.state(store.alive)}"
        + ("" if r.exit_code is None else f", exit code {r.exit_code}")
        + f", {_took(r.duration(now))} from {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(r.started))}"
        + (f", {r.attempts} attempts" if r.attempts > 1 else ""),
        f"image    {r.image or '?'} ({r.image_id[:19] or '?'}), fingerprint {r.fingerprint[:12] or '?'}",
        f"digests  settings {r.settings_digest[:12]}, lock {r.lock_digest[:12] or '?'}",
    ]
    if r.job_id:
        lines.append(f"slurm    job {r.job_id}")
    if r.refused:
        lines.append(f"refused  {r.reason}")
    elif r.exit_code not in (None, 0):
        lines.append(f"failed   {_failed(r) or 'the run'}: {r.reason}")
    lines.append("")
    lines.append(f"{'NODE':<6}{'HOST':<26}" + "".join(f"{p:<12}" for p in PHASES) + "EXIT")
    for n in r.nodes:
        cells = "".join(f"{'+%.1fs' % (n.phases[p] - r.started) if p in n.phases else '-':<12}" for p in PHASES)
        code = "lost" if n.lost else ("" if n.exit_code is None else str(n.exit_code))
        lines.append(f"{n.rank:<6}{n.host[:25]:<26}{cells}{code}")
    if r.log_tail:
        lines += ["", f"last lines of node {r.failed_rank}:", *(f"  {t}" for t in r.log_tail)]
    out.print("\n".join(lines), markup=False)
    if log:
        path = d / store.LOG
        out.print(f"\n--- {path}", markup=False)
        out.print(path.read_text(errors="replace") if path.is_file() else "(no output was recorded)", markup=False,
                  end="")  # fmt: skip


@runs_app.command("report")
@handled
def report(
    run_id: RunIdArg = "last",
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="where (default: the run's report.html)")] = None,
    config: ConfigOpt = None,
) -> None:
    """One self-contained HTML page of a run (no network needed to open it): a timeline per node with its phases
    and the failure marked, the phase times, and charts of what nodekit top sampled during the run."""
    from nodekit.runs import report as html
    from nodekit.runs import store

    root = _root(config)
    d = store.find(root, run_id)
    r = store.load(d)
    page = html.render(r, store.read_samples(d), state=r.state(store.alive), now=time.time())
    typer.echo(html.write(out_path, page) if out_path else html.write(d / "report.html", page, within=root))
