"""The image on every host of a fleet run: asked of each host in its check (nodekit/backends/fleet/remote.py, the
same SSH command), compared here (:func:`is_this_image`), and shipped through nodekit push's code only where it is
missing (:func:`ship_image`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.system import docker
from nodekit.system.progress import Reporter

if TYPE_CHECKING:
    from nodekit.ship.relay import RelayMode


def is_this_image(local: docker.ImageInfo, there: docker.ImageInfo | None) -> bool:
    """Pure: whether a host's answer ``there`` (its engine's inspect of the run's reference, in the host's check) is
    the image ``local`` is: the survey's own test for a host it skips (the same id, or the same identity across the
    two image stores). None (not there, or it could not tell) is not: the ship path then surveys that host and says
    why."""
    return there is not None and (there.id == local.id or (bool(local.identity) and there.identity == local.identity))


def ship_image(
    ref: str,
    hosts: Sequence[FleetHost],
    reporter: Reporter,
    *,
    store: Path | None = None,
    relay: RelayMode = "auto",
) -> None:
    """Put ``ref`` on every host that lacks it, through nodekit push's code (only the layers each lacks; from the
    project's blob ``store`` alone when the hosts lack only what it holds, e.g. after a code change; relayed from
    host to host when ``relay`` says so)."""
    from nodekit import ship

    src = ship.source_of(ref, None, store=store)
    targets = [ship.Target(name=f"node {h.rank}", endpoint=h.url) for h in hosts]
    with ship.SharedSsh():  # one SSH connection per host for the survey, the loads and the checks
        plan = ship.plan_push(src, ship.survey(src, targets), here_zstd=ship.zstd_here())
        missing = [s.target.name for s in plan.steps if s.action != "skip"]
        if not missing:
            reporter.done(f"{ref} is already on every host")
            return
        reporter.step(f"shipping {ref} to {', '.join(missing)}")
        ship.push(plan, reporter, relay=relay)
    reporter.done(f"{ref} is on every host (image id verified)")
