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
    """Write a commented starter nodekit.toml."""
    from nodekit.config.settings import Settings
    from nodekit.config.starter import starter_config
    from nodekit.errors import UsageError
    from nodekit.system.files import write_atomic

    path = config or Path("nodekit.toml")
    if path.exists() and not force:
        raise UsageError(f"{path} already exists", fix="nodekit init --force to overwrite it")
    default_name = Settings(project_dir=path.absolute().parent).image_name
    write_atomic(path, starter_config(name or default_name, script))
    typer.echo(f"wrote {path}")
