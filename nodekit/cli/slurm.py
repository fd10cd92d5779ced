"""``nodekit slurm``: the project's job as an sbatch script; with --submit, submitted and followed to its end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from nodekit.cli.common import (
    ConfigOpt,
    DebugOpt,
    DryRunOpt,
    ImageOpt,
    app,
    handled,
    job_flags,
    load_settings,
    reporter,
)

ContainerOpt = Annotated[
    str | None,
    typer.Option("--container", help="docker, charliecloud or pyxis (default: slurm.container in nodekit.toml)"),
]
OutOpt = Annotated[Path | None, typer.Option("--out", help="where the script goes (default: compose/slurm.sbatch)")]


@app.command()
@handled
@job_flags
def slurm(
    submit: Annotated[bool, typer.Option("--submit", help="submit it and follow the job to its end")] = False,
    container: ContainerOpt = None,
    image: ImageOpt = None,
    out: OutOpt = None,
    debug: DebugOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    **job: Any,
) -> None:
    """Write an sbatch script that runs the job on N Slurm nodes (one task per node, the same launcher, preflight
    and watchdog as nodekit up), making the image reachable first (a SquashFS on the shared path, or a push to the
    nodes' engines). --submit submits it, streams the job's log and exits with the failing node's code; Ctrl-C
    cancels the job."""
    import os

    from nodekit.backends.slurm import submit as slurm_submit
    from nodekit.job import secret

    settings = load_settings(config, **job)

    def job_secret() -> str:
        return secret.for_node(os.environ, settings.project_dir, create=not dry_run)

    plan = slurm_submit.plan(
        settings, mode=container, image=image, out=out, job_secret=job_secret, environ=os.environ, debug=debug
    )
    if dry_run:
        from nodekit.cli.ui import show_plan

        show_plan(plan)
        return
    prepared = plan.detail
    if submit:
        slurm_submit.check_submit(prepared)
    rep = reporter()
    for warning in plan.warnings:
        rep.warn(warning)
    slurm_submit.prepare_image(prepared.job, settings, rep)
    path = slurm_submit.write(prepared)
    if not submit:
        typer.echo(path)
        return
    from nodekit.backends.slurm.follow import labelled
    from nodekit.runs.recorder import recording

    nnodes = prepared.job.sbatch.nodes
    with recording(settings, "slurm", [(r, "") for r in range(nnodes)], warn=rep.warn) as rec:
        rec.image(prepared.job.image.ref, prepared.job.image.id, {})

        def on_line(line: str) -> None:
            rank, text = labelled(line)
            if rank is None:
                rec.raw(line)
            else:
                rec.line(rank, text)
            typer.echo(line)

        code = slurm_submit.run_job(path, rep, on_line, nnodes=nnodes, events=rec)
        rec.finish(code)
    raise typer.Exit(code)
