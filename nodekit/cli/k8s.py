"""``nodekit k8s``: the project's job as Kubernetes manifests (a headless Service and an Indexed Job, or a TrainJob)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodekit.cli.common import ConfigOpt, DryRunOpt, app, handled, job_flags, load_settings

if TYPE_CHECKING:
    from nodekit.config.settings import Settings


def _with_k8s(settings: Settings, **given: Any) -> Settings:
    """``settings`` with the [k8s] keys a flag gave (the flag wins over the file, as everywhere)."""
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return settings
    return settings.model_copy(update={"k8s": settings.k8s.model_copy(update=given)})


@app.command("k8s")
@handled
@job_flags
def k8s(
    trainjob: Annotated[
        bool, typer.Option("--trainjob", help="a Kubeflow Trainer TrainJob instead of the Service and Indexed Job")
    ] = False,
    image: Annotated[
        str | None, typer.Option("--image", help="the image as the cluster pulls it (default: [k8s] image, last build)")
    ] = None,
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="where the manifests go (default: k8s/)")] = None,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="namespace of every manifest")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="nvidia.com/gpu per pod (one node's GPUs)")] = None,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
    **job: Any,
) -> None:
    """Write Kubernetes manifests for the project's job: a headless Service and an Indexed Job (or, with
    --trainjob, a Kubeflow Trainer TrainJob) running the launcher in every pod, and the job secret as a Secret.

    Apply them with `kubectl apply -f k8s/`. The image must reach the cluster: a registry it pulls from, or
    preloaded on every node.
    """
    import os

    from nodekit.backends.k8s import plan as planner
    from nodekit.cli.ui import show_plan
    from nodekit.image.builder import last_build
    from nodekit.job import secret

    settings = _with_k8s(load_settings(config, **job), namespace=namespace, gpus=gpus)
    launch = planner.script_exists(settings)  # the job's launch, built once for this command
    ref, fingerprint = planner.choose_image(settings, image, last_build(settings))
    # Relative to here when under it, so the files' "kubectl apply -f" line reads as the user would type it.
    target = Path(planner.shown(out_dir or settings.resolve(settings.k8s.out_dir)))
    kind: planner.Kind = "trainjob" if trainjob else "job"
    # Planned before the secret is asked for: a refused plan must not leave a new secret file behind.
    job_plan = planner.k8s_job(settings, image=ref, fingerprint=fingerprint, kind=kind, launch=launch)
    value = secret.for_node(os.environ, settings.project_dir, create=not dry_run)
    plan = planner.plan(settings, job_plan, secret=value, kind=kind, out_dir=target)
    if dry_run:
        show_plan(plan)
        return
    for path in planner.write(plan.detail):
        typer.echo(path)
    for note in plan.notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"next: kubectl apply -f {target}/", err=True)
