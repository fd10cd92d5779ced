"""The base image's layers as a manifest names them (media type, digest of the blob as stored, size).

An image nodekit writes lists its base's layers in its manifest as the engine holds them: uncompressed on the
classic store (the blob is the layer tar, digest = diff id), as pulled on the containerd store (a registry's gzip
blobs, or the uncompressed tars a ``docker load`` brought). The engine tells these only through ``docker save``:
so the base is saved once, its blob sizes and digests read as the stream passes (nothing is kept), and the answer
is cached in the project's blob store under the base's identity (the same base on any engine, any store).
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image.archive import ChunkReader, Descriptor
from nodekit.image.blobs import BlobStore
from nodekit.image.builder.record import human_size
from nodekit.system import docker
from nodekit.system.progress import Reporter

_SMALL = 4 << 20
"""Blobs up to this size are kept while the save streams (the index, manifests and configs are among them)."""


def saved_layers(chunks: Iterable[bytes], diff_ids: tuple[str, ...]) -> tuple[Descriptor, ...]:
    """Pure but for reading ``chunks``: the layer descriptors of the one image in a ``docker save`` archive (Docker
    >= 25: the OCI layout), each blob's digest checked as it passes. ImageError when the archive has no OCI index,
    names several images, or does not match ``diff_ids`` (the base's layers as the engine reports them)."""
    small: dict[str, bytes] = {}
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            if not member.isfile():
                continue
            f = tar.extractfile(member)
            assert f is not None
            if member.name.startswith("blobs/sha256/"):
                h = hashlib.sha256()
                kept = bytearray() if member.size <= _SMALL else None
                while piece := f.read(1 << 20):
                    h.update(piece)
                    if kept is not None:
                        kept += piece
                digest = "sha256:" + h.hexdigest()
                if digest != "sha256:" + member.name.rsplit("/", 1)[1]:
                    raise ImageError(f"docker save of the base gave a damaged blob {member.name}", fix=ENGINE_FIX)
                if kept is not None:
                    small[digest] = bytes(kept)
            elif member.name == "index.json":
                small["index.json"] = f.read()
    if "index.json" not in small:
        raise ImageError("docker save of the base has no OCI index (Docker older than 25?)", fix=ENGINE_FIX)
    manifests = json.loads(small["index.json"]).get("manifests") or []
    if len(manifests) != 1:
        raise ImageError(f"docker save of the base names {len(manifests)} images, not one", fix=ENGINE_FIX)
    doc = json.loads(small[manifests[0]["digest"]])
    if doc.get("mediaType", "").endswith("index.v1+json") or "manifests" in doc:
        # A multi-platform base: the manifest of the platform the engine unpacked is the one whose config's
        # layers are the base's.
        doc = _platform_manifest(doc, small, diff_ids)
    layers = tuple(Descriptor.from_json(d) for d in doc["layers"])
    if len(layers) != len(diff_ids):
        raise ImageError(f"the base's manifest lists {len(layers)} layers, its config {len(diff_ids)}", fix=ENGINE_FIX)
    return layers


def _platform_manifest(
    index: dict[str, object], small: dict[str, bytes], diff_ids: tuple[str, ...]
) -> dict[str, object]:
    for m in index.get("manifests") or []:  # type: ignore[attr-defined]
        raw = small.get(str(m.get("digest")))
        if raw is None:
            continue
        doc = json.loads(raw)
        config = small.get(str(doc.get("config", {}).get("digest")))
        if config is not None and tuple(json.loads(config)["rootfs"]["diff_ids"]) == diff_ids:
            return dict(doc)
    raise ImageError("no manifest in the base's index matches the layers the engine holds", fix=ENGINE_FIX)


ENGINE_FIX = "docker version (nodekit needs Docker Engine 25 or later)"


def base_descriptors(
    settings: Settings, base: docker.ImageInfo, store: BlobStore, rep: Reporter
) -> tuple[Descriptor, ...]:
    """The base's layer descriptors: from the cache, else read from one ``docker save`` of it (then cached)."""
    cache = store.root / "bases" / base.identity.removeprefix("sha256:")
    try:
        return tuple(Descriptor.from_json(d) for d in json.loads(cache.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rep.step(f"reading the layers of the base image {settings.base_image} once ({human_size(base.size)})")
    save = docker.SaveStream(base.id)
    try:
        layers = saved_layers(save, base.layers)
    finally:
        save.close()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps([d.to_json() for d in layers]))
    return layers
