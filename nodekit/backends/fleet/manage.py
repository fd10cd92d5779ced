"""The fleet from the head: ``status``, ``logs``, ``stacks`` and ``down`` of every node (or one), each host asked
in parallel through its own engine. A host that cannot be asked is never passed over in silence: ``status`` shows
it as a row, ``logs`` and ``down`` return it as a remote :class:`Problem` (one line naming it and the fix; the CLI
exits non-zero), because a host whose ``down`` failed may still run its container."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodekit.backends.compose import stacks as node_stacks
from nodekit.backends.compose.render import project_name
from nodekit.backends.fleet.alive import alive_interval, kept_alive
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.backends.fleet.remote import MAX_PARALLEL, Problem
from nodekit.config.settings import Settings
from nodekit.errors import NodekitError, UsageError
from nodekit.system import docker
from nodekit.system.merge import merged

LineFn = Callable[[int, str], None]


@dataclass(frozen=True)
class Row:
    rank: int
    host: str
    state: str
    image: str = ""
    since: str = ""
    exit_code: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.rank, "host": self.host, "state": self.state, "image": self.image, "since": self.since,
            "exit_code": self.exit_code,
        }  # fmt: skip


def _failure(host: FleetHost, e: NodekitError, fix: str) -> Problem:
    """A host the command could not act on: which node, what Docker (or ssh) said, and the fix."""
    return Problem(host, e.message.rstrip("."), fix)


def parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        return list(pool.map(fn, items))


def pick(hosts: Sequence[FleetHost], node: int | None) -> list[FleetHost]:
    if node is None:
        return list(hosts)
    chosen = [h for h in hosts if h.rank == node]
    if not chosen:
        raise UsageError(f"--node {node} is not one of 0..{len(hosts) - 1}", fix=f"--node 0..{len(hosts) - 1}")
    return chosen


def status(settings: Settings, hosts: Sequence[FleetHost], node: int | None = None) -> list[Row]:
    """One row per node (per container), asked of every host in parallel; an unreachable host is a row too."""

    def one(h: FleetHost) -> list[Row]:
        project = project_name(settings.image_name, h.rank)
        try:
            states = docker.compose_ps(None, project, host=h.url)
        except Exception as e:
            return [
                Row(h.rank, h.where, f"unreachable ({str(e).splitlines()[-1][:60] if str(e) else type(e).__name__})")
            ]
        if not states:
            return [Row(h.rank, h.where, "absent")]
        return [
            Row(h.rank, h.where, c.status, c.image.rsplit(":", 1)[-1][:12], c.started_at[:19], c.exit_code)
            for c in states
        ]

    chosen = pick(hosts, node)
    with kept_alive(alive_interval(settings.peer_timeout)):
        return [r for rows in parallel(one, chosen) for r in rows]


def logs(
    settings: Settings, hosts: Sequence[FleetHost], on_line: LineFn, *, node: int | None, follow: bool, tail: str | None
) -> list[Problem]:
    """Every node's output, merged (lines as they come), or one node's; the hosts whose log could not be read."""
    chosen = pick(hosts, node)

    def one(h: FleetHost) -> Callable[[], Iterator[str]]:
        project = project_name(settings.image_name, h.rank)
        return lambda: docker.compose_logs(None, project, follow=follow, tail=tail, host=h.url)

    with kept_alive(alive_interval(settings.peer_timeout)):
        failures = merged({h.rank: one(h) for h in chosen}, on_line)
    return [_failure(h, failures[h.rank], _reach_fix(h, failures[h.rank])) for h in chosen if h.rank in failures]


def stacks(settings: Settings, hosts: Sequence[FleetHost], node: int | None = None) -> node_stacks.Stacks:
    """Every rank's stack on every host (or one): each host's container read through its engine."""
    targets = [
        node_stacks.Target(h.rank, project_name(settings.image_name, h.rank), h.url, None, h.where)
        for h in pick(hosts, node)
    ]
    with kept_alive(alive_interval(settings.peer_timeout)):
        return node_stacks.gather(targets)


def down(
    settings: Settings, hosts: Sequence[FleetHost], node: int | None = None, timeout: int = 30
) -> tuple[list[FleetHost], list[Problem]]:
    """Stop and remove the job's container on every host (or one): the hosts done, and those that failed (their
    container may still run)."""

    def one(h: FleetHost) -> Problem | None:
        project = project_name(settings.image_name, h.rank)
        try:
            docker.compose_down(None, project, timeout=timeout, host=h.url)
        except NodekitError as e:
            fix = f"nodekit down --node {h.rank} once {_reach(h)} answers; its container may still run there"
            return _failure(h, e, fix)
        return None

    chosen = pick(hosts, node)
    with kept_alive(alive_interval(settings.peer_timeout)):
        results = parallel(one, chosen)
    done = [h for h, r in zip(chosen, results, strict=True) if r is None]
    return done, [r for r in results if r is not None]


def _reach(h: FleetHost) -> str:
    """The command that shows whether the head reaches ``h``."""
    if h.scheme != "ssh":
        return f"docker -H {shlex.quote(h.url)} info"
    return f"ssh {f'-p {h.port} ' if h.port else ''}{h.target} true"


def _reach_fix(h: FleetHost, e: NodekitError) -> str:
    return f"check that {h.where} is up ({_reach(h)}), then nodekit logs --node {h.rank}"
