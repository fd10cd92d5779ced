"""The fleet's hosts, pure: parsed from ``hosts = [...]`` or a DeepSpeed/MPI hostfile, validated, ranked.

Bad input is a UsageError (exit 2) before anything is contacted: a URL that is not ``ssh://``, ``tcp://`` or
``unix://``, fewer hosts than ``nnodes``, the same host twice without distinct ports, ``min_nodes > nnodes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from nodekit.errors import UsageError

SCHEMES = ("ssh", "tcp", "unix")
HOSTS_FIX = 'hosts = ["ssh://user@10.0.0.5", "ssh://user@10.0.0.6"] in nodekit.toml, or --hostfile FILE'


@dataclass(frozen=True)
class FleetHost:
    """One node's machine: ``url`` is its Docker endpoint (also how SSH reaches it for ``ssh://``)."""

    rank: int
    url: str
    scheme: str
    hostname: str
    user: str | None = None
    port: int | None = None
    slots: int | None = None

    @property
    def name(self) -> str:
        """How messages call it: ``node R (user@host)``."""
        return f"node {self.rank} ({self.where})"

    @property
    def where(self) -> str:
        if self.scheme == "unix":
            return "this machine"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.hostname}{port}"

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.hostname.lower(), self.port)


def parse_host(url: str, rank: int, slots: int | None = None) -> FleetHost:
    """One ``hosts`` entry; UsageError naming it unless it is an ``ssh://``, ``tcp://`` or ``unix://`` URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in SCHEMES or (parts.scheme != "unix" and not parts.hostname):
        raise UsageError(
            f"host {rank} {url!r} is not an ssh://, tcp:// or unix:// Docker endpoint",
            fix="write it as ssh://user@host (or tcp://host:2376, unix:///var/run/docker.sock)",
        )
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"host {rank} {url!r} has a bad port", fix="ssh://user@host:22") from None
    hostname = parts.path if parts.scheme == "unix" else str(parts.hostname)
    return FleetHost(
        rank=rank, url=url.strip(), scheme=parts.scheme, hostname=hostname, user=parts.username, port=port, slots=slots
    )


def parse_hostfile(text: str, *, user: str | None = None) -> list[tuple[str, int | None]]:
    """A DeepSpeed/MPI hostfile: ``host slots=N`` per line, ``#`` comments; ``(ssh URL, slots)`` in order. A line
    may also be a full URL. ``user`` is put in front of bare host names."""
    entries = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, *opts = line.split()
        slots = None
        for opt in opts:
            key, _, value = opt.partition("=")
            if key in ("slots", "max_slots") and value.isdigit() and key == "slots":
                slots = int(value)
            elif key != "max_slots":
                raise UsageError(f"hostfile line {n}: {raw.strip()!r} is not 'host slots=N'", fix="host slots=8")
        url = host if "://" in host else f"ssh://{user + '@' if user and '@' not in host else ''}{host}"
        entries.append((url, slots))
    return entries


def fleet_hosts(
    urls: Sequence[str], nnodes: int, *, min_nodes: int | None = None, slots: Sequence[int | None] = ()
) -> list[FleetHost]:
    """The first ``nnodes`` hosts, ranked by position; UsageError on bad input (see the module docstring)."""
    if not urls:
        raise UsageError("no hosts configured for nodekit run", fix=HOSTS_FIX)
    hosts = [parse_host(u, r, slots[r] if r < len(slots) else None) for r, u in enumerate(urls)]
    if len(hosts) < nnodes:
        raise UsageError(
            f"{len(hosts)} host(s) for nnodes = {nnodes}",
            fix=f"list {nnodes} hosts, or set nnodes = {len(hosts)}",
        )
    if min_nodes is not None and min_nodes > nnodes:
        raise UsageError(f"min_nodes = {min_nodes} is more than nnodes = {nnodes}", fix=f"min_nodes <= {nnodes}")
    seen: dict[tuple[str, int | None], FleetHost] = {}
    for h in hosts[:nnodes]:
        if h.scheme == "unix":
            continue
        other = seen.get(h.key)
        if other is not None:
            raise UsageError(
                f"hosts {other.rank} and {h.rank} are the same machine ({h.where}) without distinct ports: two nodes "
                "would share one engine, one set of GPUs and the rendezvous ports",
                fix="list every machine once (or give each its own Docker endpoint port)",
            )
        seen[h.key] = h
    return hosts[:nnodes]


def main_address(host0: FleetHost, main: str | None) -> str:
    """Where the other nodes reach main: the configured ``main``, else host 0's own address (unix://: loopback)."""
    if main:
        return main
    if host0.scheme == "unix":
        return "127.0.0.1"
    return host0.hostname


def read_hostfile(path: Path, *, user: str | None = None) -> list[tuple[str, int | None]]:
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"cannot read hostfile {path}: {e.strerror}", fix="pass an existing --hostfile") from None
    return parse_hostfile(text, user=user)
