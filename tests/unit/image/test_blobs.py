"""The blob store nodekit keeps per project (nodekit/image/blobs.py): content-addressed, checked on every read,
with its two indexes (package layers by their inputs, images by either id)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from nodekit.image.archive import Image, layer_descriptor
from nodekit.image.blobs import BlobStore, LayerRecord
from nodekit.launcher.datacheck.filehash import file_sha256


def test_blobs_are_stored_under_their_digest_and_checked_when_read(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    digest = store.put_bytes(b"config")
    assert digest == "sha256:" + hashlib.sha256(b"config").hexdigest()
    assert store.has(digest) and store.read_verified(digest) == b"config"
    assert store.verified_path(digest) == store.path(digest)
    store.path(digest).write_bytes(b"damaged")
    # A damaged blob is removed and reported missing: it is made again, never used.
    assert store.read_verified(digest) is None and not store.has(digest)
    other = store.put_bytes(b"layer")
    store.path(other).write_bytes(b"layeR")
    assert store.verified_path(other) is None and not store.has(other)


def test_an_interrupted_write_leaves_no_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")

    def fails(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.put(fails)
    assert list((tmp_path / "blobs" / "sha256").iterdir()) == []


def test_prune_removes_old_blobs_but_keeps_the_ones_named(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    old, kept, new = store.put_bytes(b"old"), store.put_bytes(b"kept"), store.put_bytes(b"new")
    long_ago = time.time() - 30 * 86400
    for d in (old, kept):
        os.utime(store.path(d), (long_ago, long_ago))
    assert store.prune(keep=frozenset({kept})) == 1
    assert (store.has(old), store.has(kept), store.has(new)) == (False, True, True)
    with pytest.raises(ValueError, match="not a sha256 digest"):
        store.path("md5:00")


def test_a_package_layer_is_found_by_its_inputs_while_its_blob_is_whole(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    digest = store.put_bytes(b"layer tar")
    record = LayerRecord(diff_id=digest, size=9, entries=3, created_by="RUN pip install (packages)")
    store.set_layer("ab" * 32, record)
    assert store.layer("ab" * 32) == record and store.layer("cd" * 32) is None
    store.path(digest).write_bytes(b"damaged")
    assert store.layer("ab" * 32) is None  # built again rather than loaded damaged


def test_an_image_is_found_by_the_id_either_store_gives_it(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    layer = store.put_bytes(b"layer tar")
    cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": [layer]}}).encode()
    image = Image(config=cfg, layers=(layer_descriptor(layer, 9),))
    assert store.image(image.config_digest) is None
    store.keep_image(image)
    assert store.image(image.config_digest) == image == store.image(image.manifest_digest)
    assert store.image("sha256:" + "0" * 64) is None


def test_a_blob_is_hashed_once_until_its_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.image import blobs

    hashed: list[Path] = []

    def counting(path: Path) -> str:
        hashed.append(Path(path))
        return file_sha256(path)

    monkeypatch.setattr(blobs, "file_sha256", counting)
    store = BlobStore(tmp_path / "blobs")
    digest = store.put_bytes(b"layer tar " * 1000)  # hashed as it was written
    assert store.verified_path(digest) == store.verified_path(digest) == store.path(digest) and hashed == []
    (tmp_path / "blobs" / "verified" / digest[7:]).unlink()  # a blob from before the stamps: hashed once
    assert store.verified_path(digest) and store.verified_path(digest) and len(hashed) == 1
    time.sleep(0.05)  # past the file system's clock tick
    store.path(digest).write_bytes(b"LAYER TAR " * 1000)  # damaged, the same size
    assert store.verified_path(digest) is None and not store.has(digest) and len(hashed) == 2
    assert store.prune() == 0 and not (tmp_path / "blobs" / "verified" / digest[7:]).exists()
