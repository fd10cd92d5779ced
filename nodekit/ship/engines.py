"""What the engines have: the source image, and each target engine's state, as data for
:func:`nodekit.ship.plan.plan_push`.

:func:`source_of` raises ImageError when the image is not on the source engine. :func:`survey` asks every target in
parallel and never raises: a target that cannot be asked comes back with ``TargetState.error`` set, and the plan
refuses it. Docker is reached only through :mod:`nodekit.docker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from nodekit import docker
from nodekit.errors import NodekitError
from nodekit.ship.plan import Source, Target, TargetState


def source_of(ref: str, endpoint: str | None = None) -> Source:
    """The image to push, on the source engine. ImageError when it is not there."""
    info = docker.require_image(ref, endpoint)
    facts = docker.engine_facts(endpoint)
    return Source(ref=ref, image_id=info.id, size=info.size, engine_id=facts.engine_id, endpoint=endpoint)


def survey(source: Source, targets: Sequence[Target]) -> list[TargetState]:
    """Ask every target, in parallel, what it has. Never raises: failures land in ``TargetState.error``."""

    def one(t: Target) -> TargetState:
        try:
            facts = docker.engine_facts(t.endpoint)
            at_ref = docker.image_info(source.ref, t.endpoint)
            by_id = (
                at_ref if at_ref and at_ref.id == source.image_id else docker.image_info(source.image_id, t.endpoint)
            )
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        return TargetState(
            target=t,
            engine_id=facts.engine_id,
            server_version=facts.server_version,
            ref_id=at_ref.id if at_ref else None,
            has_image=by_id is not None and by_id.id == source.image_id,
            free_bytes=facts.free_bytes,
        )

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return list(pool.map(one, targets))
