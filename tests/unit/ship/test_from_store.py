"""A push composed from the blob store ``nodekit build`` keeps (nodekit/ship/layers.py, ``from_store``): only the
layers a target lacks travel, and no ``docker save`` of the image is ever needed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from pytest import MonkeyPatch

from nodekit import ship
from nodekit.image.archive import Image, layer_descriptor
from nodekit.image.blobs import BlobStore
from nodekit.ship.layers import from_store

BASE_LAYER = "sha256:" + "a" * 64


def stored(tmp_path: Path, *, base_ref: str | None = None) -> tuple[ship.Source, str, str]:
    """A store holding an image's layers above its base (a package layer and a code layer) and the image."""
    store = BlobStore(tmp_path / "blobs")
    pkg, code = store.put_bytes(b"package layer"), store.put_bytes(b"code layer")
    diff_ids = [BASE_LAYER, pkg, code]
    history = [{"created_by": "mmdebstrap"}, {"created_by": "RUN pip install", "comment": "nodekit"},
               {"created_by": "COPY . /workspace/", "comment": "nodekit"}]  # fmt: skip
    cfg = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}).encode()
    image = Image(config=cfg, layers=(layer_descriptor(BASE_LAYER, 100), layer_descriptor(pkg, 13),
                                      layer_descriptor(code, 10)))  # fmt: skip
    store.keep_image(image)
    src = ship.Source(ref="nodekit/demo:2", image_id=image.config_digest, size=123, engine_id="e",
                      layers=tuple(ship.Layer(d, 1) for d in diff_ids), blob_store=store.root,
                      cached_layers=frozenset({pkg, code}), ids=(image.config_digest, image.manifest_digest),
                      base_ref=base_ref)  # fmt: skip
    return src, pkg, code


def names(stream: object) -> list[str]:
    assert stream is not None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:  # type: ignore[arg-type]
        return sorted(n for n in tar.getnames() if n.startswith("blobs/"))


def test_a_target_lacking_only_the_code_layer_is_sent_it_and_the_image_metadata(tmp_path: Path) -> None:
    src, pkg, code = stored(tmp_path)
    got = names(from_store(src, frozenset({BASE_LAYER, pkg})))
    assert got == sorted(f"blobs/sha256/{d[7:]}" for d in (code, *src.ids))


def test_a_target_lacking_the_base_needs_the_base_image_never_the_whole_image(tmp_path: Path) -> None:
    src, pkg, _ = stored(tmp_path)
    # Without a base to read the base layer from, the caller falls back to docker save of the image.
    assert from_store(src, frozenset({pkg})) is None
    src, pkg, _ = stored(tmp_path / "b", base_ref="nodekit/base:bookworm")
    assert src.from_store(frozenset({pkg}))


def test_a_damaged_layer_of_nodekit_goes_through_docker_save_never_through_the_base(tmp_path: Path) -> None:
    src, pkg, code = stored(tmp_path, base_ref="nodekit/base:bookworm")
    assert src.blob_store is not None
    BlobStore(src.blob_store).path(code).write_bytes(b"damaged")
    assert from_store(src, frozenset({BASE_LAYER, pkg})) is None


def test_the_base_is_read_from_the_source_engine_only_when_it_holds_that_very_base(monkeypatch: MonkeyPatch) -> None:
    """An engine that received the image by a push (a fleet's head that is one of its nodes) has no base tag: a target
    lacking base layers is then sent ``docker save`` of the image, not a failing save of a base that is not there."""
    from nodekit.ship import engines
    from nodekit.system import docker

    lower = (BASE_LAYER,)
    held = {
        "nodekit/base:bookworm": docker.ImageInfo(id="b", tags=(), labels={}, size=1, layers=lower),
        "nodekit/base:rebuilt": docker.ImageInfo(id="c", tags=(), labels={}, size=1, layers=("sha256:" + "c" * 64,)),
    }
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: held.get(ref))
    assert engines._base_here("nodekit/base:bookworm", lower, "ssh://root@h0") == "nodekit/base:bookworm"
    assert engines._base_here("nodekit/base:trixie", lower, "ssh://root@h0") is None  # not on that engine
    assert engines._base_here("nodekit/base:rebuilt", lower, None) is None  # the tag names another base now
    assert engines._base_here(None, lower, None) is None
