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
from nodekit.image.archive import chains_of
from nodekit.image.blobs import BlobStore
from nodekit.image.plan import LABEL_BASE
from nodekit.ship.disk import TargetDisk, target_disk
from nodekit.ship.plan import Layer, Source, Target, TargetState, sized_layers
from nodekit.system import docker


def source_of(ref: str, endpoint: str | None = None, *, store: Path | None = None) -> Source:
    """The image to push, on the source engine, with its layers (diff ids, sizes). ImageError when it is not
    there. With ``store`` (a project's :class:`~nodekit.image.blobs.BlobStore` root), the layers that store holds for
    this image (``nodekit build`` wrote its config and code layer there) are noted: they travel without a
    ``docker save``."""
    info = docker.require_image(ref, endpoint)
    blobs = BlobStore(store) if store is not None else None
    image = blobs.image(info.id) if blobs is not None else None
    with ThreadPoolExecutor(max_workers=2) as asks:  # independent queries: at once, not one after the other
        f_facts = asks.submit(docker.engine_facts, endpoint)
        f_sizes = asks.submit(docker.history_sizes, info.id, endpoint) if image is None else None
    facts = f_facts.result()
    if image is not None and blobs is not None:
        # An image nodekit wrote: its layers and their sizes are exact, and every layer above the base is a blob here.
        layers = tuple(Layer(d, desc.size) for d, desc in zip(image.diff_ids, image.layers, strict=True))
        cached = frozenset(d for d, desc in zip(image.diff_ids, image.layers, strict=True) if blobs.has(desc.digest))
        base = _base_here(info.labels.get(LABEL_BASE) or None, image.diff_ids[: image.base_layers], endpoint)
        return Source(blob_store=store, cached_layers=cached, ref=ref, image_id=info.id, size=info.size,
                      engine_id=facts.engine_id, endpoint=endpoint, layers=layers,
                      containerd_store=facts.containerd_store, identity=info.identity,
                      ids=(image.config_digest, image.manifest_digest), base_ref=base)  # fmt: skip
    assert f_sizes is not None
    return Source(
        ref=ref,
        image_id=info.id,
        size=info.size,
        engine_id=facts.engine_id,
        endpoint=endpoint,
        layers=sized_layers(info.layers, f_sizes.result()),
        containerd_store=facts.containerd_store,
        identity=info.identity,
    )


def layers_held(endpoint: str | None = None) -> frozenset[str]:
    """Every layer chain id the engine at ``endpoint`` holds (what ``nodekit layers`` reports)."""
    return chains_of(docker.layer_lists(endpoint))


def _base_here(base: str | None, lower: Sequence[str], endpoint: str | None) -> str | None:
    """``base`` when the source engine holds it with exactly the image's ``lower`` layers (its base layers then come
    out of a ``docker save`` of the base alone); else None, and a target lacking base layers gets ``docker save`` of
    the image. An engine that received the image by a push has no base tag: the head of a fleet that is itself a node
    is such an engine."""
    if base is None:
        return None
    try:
        got = docker.image_info(base, endpoint)
    except NodekitError:
        return None
    return base if got is not None and tuple(got.layers) == tuple(lower) else None


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
            own_id = source.id_on(facts.containerd_store)
            f_id = asks.submit(docker.image_info, own_id, t.endpoint) if own_id else None
            f_layers = asks.submit(docker.layer_lists, t.endpoint)
            # An engine elsewhere: its free disk over SSH (df under its data root), for the plan's room check.
            f_remote = asks.submit(target_disk, t.endpoint, facts.root_dir) if t.endpoint.startswith("ssh://") else None
        try:
            at_ref, by_id = f_ref.result(), (f_id.result() if f_id is not None else None)
            has_image = by_id is not None and by_id.id == own_id
            chains = None
            # Both stores reuse a layer whose chain they hold (the classic layer store by chain id, the containerd
            # store's snapshotter by the same chain id): those layers are left out of the archive.
            if not has_image:
                chains = chains_of(f_layers.result())
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        remote = f_remote.result() if f_remote is not None else TargetDisk(None, False)
        return TargetState(
            target=t,
            engine_id=facts.engine_id,
            server_version=facts.server_version,
            ref_id=at_ref.id if at_ref else None,
            ref_identity=at_ref.identity if at_ref else None,
            has_image=has_image,
            free_bytes=facts.free_bytes if remote.free_bytes is None else remote.free_bytes,
            zstd=remote.zstd,
            chains=chains,
            containerd_store=facts.containerd_store,
        )

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return list(pool.map(one, targets))
