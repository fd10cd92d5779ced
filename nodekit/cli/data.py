"""``nodekit data push``: the datasets of ``[[mounts]]`` entries with a ``source``, onto every host."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nodekit.cli.common import ConfigOpt, DryRunOpt, app, handled, load_settings

if TYPE_CHECKING:
    from nodekit.backends.fleet.hosts import FleetHost
    from nodekit.config.settings import Settings

data_app = typer.Typer(help="Datasets: a [[mounts]] source made identical on every host.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.callback()
def data() -> None:
    """Datasets: a [[mounts]] entry's source (a directory or file here) made identical on every host's host path."""


@data_app.command("push")
@handled
def push(
    to: Annotated[
        list[str] | None,
        typer.Option(
            "--to",
            help="target host: ssh://user@host, optionally named (node1=ssh://user@host), or unix:///var/run/"
            "docker.sock for this machine; repeat for several [default: the project's hosts]",
        ),
    ] = None,
    hostfile: Annotated[
        Path | None, typer.Option("--hostfile", help="DeepSpeed/MPI hostfile: 'host slots=N' per line (rank = line)")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="after the push, every host reads every file of its copy back from disk (no hash cache trusted) "
            "and compares it with the source's manifest; a difference exits 1 naming the host and the files",
        ),
    ] = False,
    relay: Annotated[
        str | None,
        typer.Option(
            help="ssh:// hosts pass the dataset's stream on to each other in a tree, so this machine sends each "
            "content once: auto (when the copies it spares, (hosts - 1) x what travels, are 108 MiB or more), "
            "always or never [default: nodekit.toml's relay]",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Make every host's host path of each [[mounts]] entry with a source identical to that source: only contents
    a host lacks travel (a renamed file is copied there, not sent), names the source no longer has are deleted, each
    host checks its copy against the source's manifest. Files nodekit did not put there are never touched: a host
    path holding ones that differ from the source is refused. Hosts that lack the same contents take them through a
    relay tree (each feeding at most two others), so each content leaves this machine once."""
    from nodekit import ship
    from nodekit.cli.common import reporter
    from nodekit.cli.ui import out
    from nodekit.data import push as pushing
    from nodekit.errors import UsageError

    settings = load_settings(config)
    relay = relay or settings.relay
    if relay not in ship.RELAY_MODES:
        raise UsageError(f"--relay {relay!r} is not one of {', '.join(ship.RELAY_MODES)}", fix="--relay auto")
    if not any(m.source for m in settings.mounts):
        raise UsageError("no [[mounts]] entry names a source", fix='add source = "data" to a [[mounts]] entry')
    jobs = pushing.jobs_of(settings, targets(settings, hostfile, to or []))
    rep = reporter()
    with ship.SharedSsh():  # the scan and the stream to a host ride one connection
        done = pushing.push(settings, jobs, rep, dry_run=dry_run, verify=verify, relay=relay)
    if dry_run:
        out.print(pushing.dry_run_text([d.job for d in done], [d.plan for d in done], relay), markup=False)
        return
    rep.done(pushing.report_line(done, verified=verify))


def targets(
    settings: Settings, hostfile: Path | None, to: Sequence[str] | None = None
) -> list[tuple[FleetHost, int | None]]:
    """The hosts a data command works on, each with its rank where it is one of the job's (whose ``[nodes.R]``
    settings then apply): ``--to`` targets (``None``: the command has no ``--to``), else ``--hostfile``'s, else the
    project's ``hosts``. UsageError (exit 2) naming every way to give them when there are none."""
    from nodekit.backends.fleet.hosts import HOSTS_FIX, hosts_of
    from nodekit.errors import UsageError

    if to:
        return to_hosts(settings, to)
    if not settings.hosts and hostfile is None:
        raise UsageError("no hosts: name them in nodekit.toml, or with --hostfile" + (", or --to" if to is not None
                         else ""), fix=HOSTS_FIX + (", or --to ssh://user@host" if to is not None else ""))  # fmt: skip
    return [(h, h.rank) for h in hosts_of(settings, hostfile)]


def to_hosts(settings: Settings, to: Sequence[str]) -> list[tuple[FleetHost, int | None]]:
    """``--to`` targets as ``nodekit push`` takes them (``[name=]ssh://user@host``, ``unix://...`` for this
    machine), each with its rank where it is one of the project's hosts (whose ``[nodes.R] mounts`` then apply)."""
    from nodekit.backends.fleet.hosts import parse_host

    known = {h.strip(): r for r, h in enumerate(settings.hosts)}
    out = []
    for i, spec in enumerate(to):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            url = spec
        out.append((parse_host(url, i), known.get(url.strip())))
    return out


@data_app.command("gather")
@handled
def gather(
    path: Annotated[
        str | None, typer.Option("--path", help="a directory inside each host's output_dir, not all of it")
    ] = None,
    into: Annotated[
        Path | None,
        typer.Option("--into", help="where node-<rank>/ directories are made [default: gathered/ in the project]"),
    ] = None,
    hostfile: Annotated[
        Path | None, typer.Option("--hostfile", help="DeepSpeed/MPI hostfile: 'host slots=N' per line (rank = line)")
    ] = None,
    dry_run: DryRunOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Bring every host's output_dir (or --path inside it) back here, all hosts at once: one node-<rank>/ directory
    per host, each file checked against the host's listing as it arrives, files identical across hosts stored once
    (hard links to one copy). Run it again to finish one cut short: what arrived whole is kept. Nothing here is
    deleted or written outside --into."""
    from nodekit import ship
    from nodekit.cli.common import reporter
    from nodekit.cli.ui import out
    from nodekit.data import gather as gathering

    settings = load_settings(config)
    hosts = [h for h, _ in targets(settings, hostfile)]
    dest = into.absolute() if into is not None else settings.project_dir / "gathered"
    sources = gathering.sources_of(settings, hosts, path, Path.cwd())
    rep = reporter()
    rep.step(f"gathering from {len(sources)} host(s) into {dest}")
    with ship.SharedSsh():  # the listing and the stream from a host ride one connection
        plans = gathering.plan_all(sources, dest)
        if dry_run:
            out.print(gathering.dry_run_text(plans, dest), markup=False)
            return
        done = gathering.gather(plans, dest)
    for d in done:
        for s in d.plan.skipped[:3]:
            rep.warn(f"{d.plan.source.shown}: not gathered: {s}")
    rep.done(gathering.report_line(done, dest))
