"""What the engines have: the source image, and each target engine's state, as data for
:func:`nodekit.ship.plan.plan_push`.

:func:`source_of` raises ImageError when the image is not on the source engine. :func:`survey` asks every target in
parallel and never raises: a target that cannot be asked comes back with ``TargetState.error`` set, and the plan
refuses it. Docker is reached only through :mod:`nodekit.system.docker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nodekit.errors import NodekitError
from nodekit.image.blobs import BlobStore
from nodekit.ship.disk import remote_free
from nodekit.ship.plan import Source, Target, TargetState, chains_of, sized_layers
from nodekit.system import docker


def source_of(ref: str, endpoint: str | None = None, *, store: Path | None = None) -> Source:
    """The image to push, on the source engine, with its layers (diff ids, sizes). ImageError when it is not
    there. With ``store`` (a project's :class:`~nodekit.image.blobs.BlobStore` root), the layers that store holds for
    this image (``nodekit build`` wrote its config and code layer there) are noted: they travel without a
    ``docker save``."""
    info = docker.require_image(ref, endpoint)
    with ThreadPoolExecutor(max_workers=3) as asks:  # independent queries: at once, not one after the other
        f_facts = asks.submit(docker.engine_facts, endpoint)
        f_ids = asks.submit(docker.image_layers, info.id, endpoint)
        f_sizes = asks.submit(docker.history_sizes, info.id, endpoint)
    facts = f_facts.result()
    layers = sized_layers(f_ids.result(), f_sizes.result())
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
    """Ask every target, in parallel, what it has: the image, its free disk (statvfs for an engine on this machine,
    ``df`` over SSH for an ``ssh://`` one, unknown for ``tcp://``) and the layer chains its engine holds (only asked
    when the image must travel). Never raises: failures land in ``TargetState.error``."""

    def one(t: Target) -> TargetState:
        # The engine's facts first: under SharedSsh (nodekit/ship/mux.py) that call opens the node's one SSH
        # connection, and the other three questions then go out at once over it, without handshakes of their own.
        # The layer list is asked before it is known to be needed; it is dropped when the target has the image.
        try:
            facts = docker.engine_facts(t.endpoint)
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        with ThreadPoolExecutor(max_workers=4) as asks:
            f_ref = asks.submit(docker.image_info, source.ref, t.endpoint)
            f_id = asks.submit(docker.image_info, source.image_id, t.endpoint)
            f_layers = asks.submit(docker.layer_lists, t.endpoint)
            # An engine elsewhere: its free disk over SSH (df under its data root), for the plan's room check.
            f_free = asks.submit(remote_free, t.endpoint, facts.root_dir) if facts.free_bytes is None else None
        try:
            at_ref, by_id = f_ref.result(), f_id.result()
            has_image = by_id is not None and by_id.id == source.image_id
            chains = None
            # Leaving layers out relies on the classic layer store's load (chain ids); the containerd store loads
            # differently, so it gets the whole image. (No engine-ID test here: two engines can share one.)
            if not has_image and not facts.containerd_store:
                chains = chains_of(f_layers.result())
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        return TargetState(
            target=t,
            engine_id=facts.engine_id,
            server_version=facts.server_version,
            ref_id=at_ref.id if at_ref else None,
            has_image=has_image,
            free_bytes=facts.free_bytes if f_free is None else f_free.result(),
            chains=chains,
            containerd_store=facts.containerd_store,
        )

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return list(pool.map(one, targets))
