"""The base image's layers as its manifest names them, read from one docker save (nodekit/image/builder/bases.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest

from nodekit.errors import ImageError
from nodekit.image.builder.bases import saved_layers


def save(blobs: dict[str, bytes], index: dict[str, object]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [*((f"blobs/sha256/{d[7:]}", b) for d, b in sorted(blobs.items())),
                           ("index.json", json.dumps(index).encode())]:  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def image(compressed: bool) -> tuple[bytes, str, str]:
    """A one-layer base as docker save writes it: the layer as the engine holds it (gzip from a registry on the
    containerd store, a plain tar otherwise)."""
    layer_tar = b"\0" * 1024
    blob = gzip.compress(layer_tar, mtime=0) if compressed else layer_tar
    cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]}}).encode()
    kind = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compressed else "")
    layer = {"mediaType": kind, "digest": digest(blob), "size": len(blob)}
    manifest = json.dumps({"schemaVersion": 2, "config": {"digest": digest(cfg), "size": len(cfg)},
                           "layers": [layer]}).encode()  # fmt: skip
    index = {"manifests": [{"digest": digest(manifest), "size": len(manifest)}]}
    return save({digest(blob): blob, digest(cfg): cfg, digest(manifest): manifest}, index), digest(layer_tar), kind


@pytest.mark.parametrize("compressed", [False, True])
def test_the_base_layers_are_named_as_the_engine_holds_them(compressed: bool) -> None:
    data, diff_id, kind = image(compressed)
    (layer,) = saved_layers([data[:3000], data[3000:]], (diff_id,))
    assert layer.media_type == kind
    assert (layer.digest == diff_id) is not compressed


def test_a_save_without_an_index_or_with_other_layers_is_refused() -> None:
    data, diff_id, _ = image(False)
    with pytest.raises(ImageError, match="lists 1 layers, its config 2"):
        saved_layers([data], (diff_id, diff_id))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("manifest.json")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ImageError, match="no OCI index"):
        saved_layers([buf.getvalue()], ())
