"""What the engines have: the source image, and each target engine's state, as data for
:func:`nodekit.ship.plan.plan_push`.

:func:`source_of` raises ImageError when the image is not on the source engine. :func:`survey` asks every target in
parallel and never raises: a target that cannot be asked comes back with ``TargetState.error`` set, and the plan
refuses it. Docker is reached only through :mod:`nodekit.docker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodekit import docker
from nodekit.blobs import BlobStore
from nodekit.errors import NodekitError
from nodekit.ship.plan import Source, Target, TargetState, chains_of, sized_layers


def source_of(ref: str, endpoint: str | None = None, *, store: Path | None = None) -> Source:
    """The image to push, on the source engine, with its layers (diff ids, sizes). ImageError when it is not
    there. With ``store`` (a project's :class:`~nodekit.blobs.BlobStore` root), the layers that store holds for
    this image (``nodekit build`` wrote its config and code layer there) are noted: they travel without a
    ``docker save``."""
    info = docker.require_image(ref, endpoint)
    facts = docker.engine_facts(endpoint)
    layers = sized_layers(docker.image_layers(info.id, endpoint), docker.history_sizes(info.id, endpoint))
    blobs = BlobStore(store) if store is not None else None
    cached = frozenset(layer.diff_id for layer in layers if blobs is not None and blobs.has(layer.diff_id))
    return Source(
        blob_store=store if blobs is not None and blobs.has(info.id) and not facts.containerd_store else None,
        cached_layers=cached,
        ref=ref,
        image_id=info.id,
        size=info.size,
        engine_id=facts.engine_id,
        endpoint=endpoint,
        layers=layers,
        containerd_store=facts.containerd_store,
    )


def layers_held(endpoint: str | None = None) -> frozenset[str]:
    """Every layer chain id the engine at ``endpoint`` holds (what ``nodekit layers`` reports)."""
    return chains_of(docker.layer_lists(endpoint))


def survey(source: Source, targets: Sequence[Target]) -> list[TargetState]:
    """Ask every target, in parallel, what it has: the image, its free disk and the layer chains its engine holds
    (only asked when the image must travel). Never raises: failures land in ``TargetState.error``."""

    def one(t: Target) -> TargetState:
        try:
            facts = docker.engine_facts(t.endpoint)
            at_ref = docker.image_info(source.ref, t.endpoint)
            by_id = (
                at_ref if at_ref and at_ref.id == source.image_id else docker.image_info(source.image_id, t.endpoint)
            )
            has_image = by_id is not None and by_id.id == source.image_id
            chains = None
            # Leaving layers out relies on the classic layer store's load (chain ids); the containerd store loads
            # differently, so it gets the whole image.
            if not has_image and facts.engine_id != source.engine_id and not facts.containerd_store:
                chains = chains_of(docker.layer_lists(t.endpoint))
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        return TargetState(
            target=t,
            engine_id=facts.engine_id,
            server_version=facts.server_version,
            ref_id=at_ref.id if at_ref else None,
            has_image=has_image,
            free_bytes=facts.free_bytes,
            chains=chains,
            containerd_store=facts.containerd_store,
        )

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return list(pool.map(one, targets))
