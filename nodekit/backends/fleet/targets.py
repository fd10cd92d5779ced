"""The nodes ``nodekit exec`` and ``nodekit top`` reach: with hosts configured (``hosts`` or ``--hostfile``), each
rank on its host's engine through the same endpoint (and so the same SSH configuration) as ``nodekit run``;
without, each rank of ``nnodes`` on this machine's engine (nodes started here with ``nodekit up``). A node's
container is found by its compose project, the name every backend gives it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodekit.backends.compose.render import project_name
from nodekit.backends.fleet.hosts import FleetHost
from nodekit.config.settings import Settings
from nodekit.errors import UsageError


@dataclass(frozen=True)
class Target:
    """Node ``rank``: its compose project and its host (None: this machine's default engine)."""

    rank: int
    project: str
    host: FleetHost | None = None

    @property
    def url(self) -> str | None:
        return self.host.url if self.host else None

    @property
    def where(self) -> str:
        return self.host.where if self.host else "this machine"

    @property
    def name(self) -> str:
        return f"node {self.rank} ({self.where})"


def targets(settings: Settings, hostfile: Path | None = None) -> list[Target]:
    if settings.hosts or hostfile is not None:
        from nodekit.backends.fleet.hosts import hosts_of

        return [Target(h.rank, project_name(settings.image_name, h.rank), h) for h in hosts_of(settings, hostfile)]
    return [Target(r, project_name(settings.image_name, r)) for r in range(settings.nnodes)]


def pick(found: Sequence[Target], rank: int | None) -> list[Target]:
    """Node ``rank`` (UsageError when the job has no such node), or every node for None."""
    if rank is None:
        return list(found)
    chosen = [t for t in found if t.rank == rank]
    if not chosen:
        last = len(found) - 1
        raise UsageError(f"node {rank} is not one of this job's nodes 0..{last}", fix=f"-r 0..{last}")
    return chosen
