"""Shipping commands: push (to other nodes' Docker engines), save and load (through a shared file system)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from nodekit.cli.common import ConfigOpt, DryRunOpt, app, handled, load_settings

ImageArg = Annotated[str | None, typer.Argument(help="image to ship (default: the last one built here)")]
FromOpt = Annotated[
    str | None,
    typer.Option("--from", help="Docker endpoint that has the image (default: DOCKER_HOST, else the local engine)"),
]
COMPRESS = ("auto", "zstd", "gzip", "none")


def _image(image: str | None, config: Path | None) -> str:
    if image:
        return image
    from nodekit.image import builder as building

    ref: str = building.current_image(load_settings(config))
    return ref


def _blob_store(config: Path | None) -> Path | None:
    """The project's blob store (where ``nodekit build`` keeps the code layers it wrote), when there is a project
    here; pushes of its images then need no ``docker save`` for a code change."""
    from nodekit.errors import NodekitError
    from nodekit.image.blobs import BLOBS

    try:
        root: Path = load_settings(config).project_dir / BLOBS
    except NodekitError:
        return None
    return root if root.is_dir() else None


def _configured_relay(config: Path | None) -> str:
    """nodekit.toml's ``relay`` when there is a project here (a broken file is refused), else auto."""
    import os

    from nodekit.config.settings import config_path

    if config is None and not config_path(None, os.environ).is_file():
        return "auto"
    relay: str = load_settings(config).relay
    return relay


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """Per-target transfer bars on a terminal; None elsewhere (the reporter then prints progress lines)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from nodekit.cli.ui import err

    bars = Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )
    tasks: dict[str, Any] = {}

    def update(name: str, sent: int, total: int) -> None:
        if name not in tasks:
            tasks[name] = bars.add_task(name, total=total)
        bars.update(tasks[name], completed=sent)

    with bars:
        yield update


@app.command()
@handled
def push(
    image: ImageArg = None,
    to: Annotated[
        list[str] | None,
        typer.Option(
            "--to",
            help="target Docker endpoint: ssh://user@host, tcp://host:2376 or unix:///path, optionally named "
            "(node1=ssh://user@host); repeat for several nodes",
        ),
    ] = None,
    source: FromOpt = None,
    compress: Annotated[
        str,
        typer.Option(
            help="stream compression: auto (none over a local socket; zstd to an ssh:// node where both ends have the "
            "zstd command; else gzip), zstd (refused, before anything moves, where an end lacks it), gzip or none"
        ),
    ] = "auto",
    relay: Annotated[
        str | None,
        typer.Option(
            help="ssh:// targets pass the stream on to each other, so this machine sends it once: auto (when 64 MiB "
            "or more travels), always or never [default: nodekit.toml's relay, else auto]",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Put the image on other nodes' Docker engines without a registry: only the layers a target lacks travel,
    compressed, into docker load there; ssh:// targets relay the stream to each other. Targets that already have
    the image are skipped; the image id on every target is checked against the source's afterwards."""
    from nodekit import ship
    from nodekit.cli.ui import RichReporter, err, out
    from nodekit.errors import UsageError

    if not to:
        raise UsageError("no target: name at least one with --to", fix="nodekit push --to ssh://user@node1")
    if compress not in COMPRESS:
        raise UsageError(f"--compress {compress!r} is not one of {', '.join(COMPRESS)}", fix="--compress auto")
    relay = relay or _configured_relay(config)
    if relay not in ship.RELAY_MODES:
        raise UsageError(f"--relay {relay!r} is not one of {', '.join(ship.RELAY_MODES)}", fix="--relay auto")
    targets = [ship.parse_target(t) for t in to]
    src = ship.source_of(_image(image, config), source, store=_blob_store(config))
    how = cast("ship.Compress", compress)
    with ship.SharedSsh():  # one SSH connection per node for the survey, the loads and the checks
        plan = ship.plan_push(src, ship.survey(src, targets), compress=how, here_zstd=ship.zstd_here())
        if dry_run:
            out.print("\n".join([plan.to_text(), *ship.relay_text(plan, relay)]), markup=False)
            return
        rep = RichReporter(verbose=True)
        try:
            with _progress_bars(err.is_terminal) as bars:
                ship.push(plan, rep, on_progress=bars, relay=relay)
        except Exception:
            rep.fail()
            raise
    loaded = [s.target.name for s in plan.steps if s.action != "skip"]
    if loaded:
        rep.done(f"{src.ref} is on {len(plan.steps)} node(s), image id verified on {', '.join(loaded)}")


@app.command()
@handled
def save(
    file: Annotated[Path, typer.Argument(help="where to write: .tar, .tar.gz or .tar.zst (picks the compression)")],
    image: ImageArg = None,
    source: FromOpt = None,
    have: Annotated[
        Path | None,
        typer.Option(
            "--have",
            help="incremental: leave out the layers listed in this file (written by `nodekit layers` on the node "
            "that will load it)",
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Write the image to a file (for nodes that share a file system); nodekit load reads it on each node."""
    from nodekit import ship
    from nodekit.cli.common import reporter
    from nodekit.errors import UsageError

    chains = None
    if have is not None:
        try:
            chains = ship.parse_layer_list(have.read_text(), str(have))
        except OSError as e:
            raise UsageError(
                f"cannot read {have}: {e.strerror or e}", fix="nodekit layers > FILE on the node"
            ) from None
    ship.save(_image(image, config), file, reporter(), endpoint=source, have=chains, store=_blob_store(config))
    typer.echo(file)


@app.command()
@handled
def layers(
    to: Annotated[
        str | None, typer.Option("--to", help="Docker endpoint to ask (default: DOCKER_HOST, else local)")
    ] = None,
) -> None:
    """Print the layers this node's Docker engine holds (chain ids), for `nodekit save --have` elsewhere."""
    from nodekit import ship

    typer.echo(ship.format_layer_list(ship.layers_held(to), to or "this engine"), nl=False)


@app.command()
@handled
def load(
    file: Annotated[Path, typer.Argument(help="a file written by nodekit save (or docker save)")],
    to: Annotated[
        str | None, typer.Option("--to", help="Docker endpoint to load into (default: DOCKER_HOST, else local)")
    ] = None,
    expect: Annotated[
        str | None,
        typer.Option(
            "--expect",
            help="refuse the file, loading nothing, unless it holds exactly this image (12 or more hex digits of "
            "the id nodekit save printed)",
        ),
    ] = None,
) -> None:
    """Load an image file into this node's Docker engine; a corrupt or truncated file changes nothing."""
    from nodekit import ship
    from nodekit.cli.common import reporter

    result = ship.load(file, reporter(), endpoint=to, expect_id=expect)
    for name, image_id in result.images:
        typer.echo(f"{name} {image_id}")
