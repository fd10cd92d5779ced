"""Image commands: lock, base, build, inspect."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from nodekit.cli.common import ConfigOpt, DryRunOpt, VerboseOpt, app, handled, load_settings, reporter


@app.command()
@handled
def lock(
    upgrade: Annotated[
        bool, typer.Option("--upgrade", help="re-resolve everything, ignoring the current pins")
    ] = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Resolve the image's packages into nodekit.lock (hash-locked, for the image's Python and platform).

    Re-locking keeps every pin that still satisfies the config, so changing one package changes only its lines.
    """
    from nodekit.image import lock as locking

    settings = load_settings(config)
    result = locking.lock(settings, reporter(), dry_run=dry_run, upgrade=upgrade)
    typer.echo(result.lock.text() if dry_run else result.path)


@app.command()
@handled
def base(
    suite: Annotated[
        str | None,
        typer.Option(help="Debian suite: bookworm (Python 3.11) or trixie (3.13); default: base_image's suite"),
    ] = None,
    if_missing: Annotated[bool, typer.Option("--if-missing", help="do nothing when the image exists")] = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Create nodekit/base:<suite>, a minimal Debian image with Python from Debian packages (no registry needed).

    It never makes any other image: with base_image naming another image and no --suite, it refuses.
    """
    from nodekit.image import debian as basing

    settings = load_settings(config)
    own = suite is not None or basing.own_suite(settings.base_image) is not None
    tag, _ = basing.choose_base(settings.base_image, suite, present=own or not basing.missing_base(settings))
    basing.create_base(tag, reporter(), dry_run=dry_run, if_missing=if_missing)


def base_when_missing(settings: Any, rep: Any, create: bool | None = None) -> None:
    """Make nodekit's own base image (``nodekit/base:<suite>``) when the engine lacks it, with progress, unless
    ``create`` is False: a fresh head builds without a separate ``nodekit base``. Any other missing base is left to
    the build, which names it and the fix (a vendor image is never replaced by plain Debian under its name)."""
    from nodekit.image import debian as basing

    if create is False or not basing.missing_base(settings):
        return
    if create is None and basing.own_suite(settings.base_image) is None:
        return
    rep.step(f"base image {settings.base_image} is not in this engine: making it (once per machine; nodekit base)")
    basing.create_base(settings.base_image, rep, dry_run=False, if_missing=True)


@app.command()
@handled
def build(
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild every layer")] = False,
    create_base: Annotated[
        bool | None,
        typer.Option(
            "--create-base/--no-create-base",
            help="make nodekit/base:<suite> when it is missing (default: yes for nodekit's own base)",
        ),
    ] = None,
    verbose: VerboseOpt = False,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Lock, then build the pinned image with BuildKit; a no-op when nothing changed."""
    from nodekit.cli.ui import out
    from nodekit.image import builder as building

    settings = load_settings(config)
    rep = reporter(verbose=verbose)
    try:
        if not dry_run:
            base_when_missing(settings, rep, create_base)
        result = building.build(settings, rep, dry_run=dry_run, no_cache=no_cache)
        if not dry_run:
            # The by-hand flow copies it to every worker next (docs/guides/one-node-by-hand.md): it must exist now.
            from nodekit.job import secret

            secret.for_node(os.environ, settings.project_dir, create=True)
    except Exception:
        rep.fail()
        raise
    if dry_run:
        out.print(result, markup=False)
        return
    out.print(result.summary(), markup=False)


@app.command()
@handled
def inspect(
    image: Annotated[str | None, typer.Argument(help="image (default: the last one built here)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    config: ConfigOpt = None,
) -> None:
    """Show the image's stack: fingerprint, base, Python, torch, CUDA/cuDNN/NCCL, size, locked packages."""
    from nodekit.cli.ui import out
    from nodekit.image import builder as building

    ref = image or building.current_image(load_settings(config))
    report = building.inspect_image(ref)
    if json_out:
        typer.echo(report.to_json())  # not through rich: it would wrap long strings and break the JSON
    else:
        out.print(report.to_text(), markup=False)
