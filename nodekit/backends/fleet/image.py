"""The image on every host of a fleet run: asked of each host right after its check, over the connection the check
opened (:func:`image_there`), and shipped through nodekit push's code only where it is missing (:func:`ship_image`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import NodekitError
from nodekit.system import docker
from nodekit.system.progress import Reporter

if TYPE_CHECKING:
    from nodekit.ship.relay import RelayMode


def image_there(ref: str, info: docker.ImageInfo, host: FleetHost) -> bool:
    """Whether ``host``'s engine has ``ref`` as this very image: the survey's own test for a host it skips (the same
    id, or the same identity across the two image stores), one question over the connection the host's check
    opened. False when it cannot tell: the ship path then surveys that host and says why."""
    try:
        got = docker.image_info(ref, host.url)
    except NodekitError:
        return False
    return got is not None and (got.id == info.id or (bool(info.identity) and got.identity == info.identity))


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
