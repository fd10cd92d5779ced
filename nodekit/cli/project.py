"""Project commands: init."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nodekit.cli.common import ConfigOpt, app, handled


@app.command()
@handled
def init(
    name: Annotated[str | None, typer.Option(help="image name (default: this directory's name)")] = None,
    script: Annotated[str, typer.Option(help="training script")] = "train.py",
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing nodekit.toml")] = False,
    config: ConfigOpt = None,
) -> None:
    """Write a commented starter nodekit.toml (packages from requirements.txt and pyproject.toml when present) and,
    unless there is one, a .dockerignore that keeps data, outputs and virtual environments out of the image."""
    from nodekit.cli import ui
    from nodekit.config.settings import Settings
    from nodekit.config.starter import DOCKERIGNORE, project_packages, starter_config
    from nodekit.errors import UsageError
    from nodekit.system.files import write_atomic

    path = config or Path("nodekit.toml")
    if path.exists() and not force:
        raise UsageError(f"{path} already exists", fix="nodekit init --force to overwrite it")
    project = path.absolute().parent
    default_name = Settings(project_dir=project).image_name

    def text(file: str) -> str | None:
        found = project / file
        return found.read_text(encoding="utf-8", errors="replace") if found.is_file() else None

    found = project_packages(text("requirements.txt"), text("pyproject.toml"))
    for warning in found.warnings:
        ui.warn(warning)
    write_atomic(path, starter_config(name or default_name, script, found.packages, found.found_in), within=project)
    where = f" (packages from {' and '.join(found.found_in)})" if found.found_in else ""
    typer.echo(f"wrote {path}{where}")
    ignore = project / ".dockerignore"
    if not ignore.exists():
        write_atomic(ignore, DOCKERIGNORE, within=project)
        typer.echo(f"wrote {ignore.relative_to(Path.cwd()) if ignore.is_relative_to(Path.cwd()) else ignore}")
    for data in ("data", "datasets"):
        if (project / data).is_dir():  # kept out of the image by the .dockerignore: say how the job sees it
            typer.echo(
                f"{data}/ stays out of the image; the job sees it through a mount: uncomment [[mounts]] in {path.name} "
                f'(host = "{data}", container = "/data")'
            )
