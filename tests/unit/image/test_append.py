"""The image's last stage written by nodekit (nodekit/image/append.py) and the blob store it keeps
(nodekit/image/blobs.py):
pure functions and files only; the real engine loading what they write is tested in tests/integration and
tests/cluster (test_code_push.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from nodekit import ship
from nodekit.image import append
from nodekit.image.blobs import BlobStore

EPOCH = 1735689600
ENV_IMAGE = {
    "Config": {
        "Env": ["PATH=/opt/venv/bin:/usr/bin", "NODEKIT_FINGERPRINT=old"],
        "Entrypoint": ["/opt/venv/bin/python", "-m", "nodekit.launcher"],
        "WorkingDir": "/workspace",
        "Labels": {"from.base": "yes"},
        "Hostname": "",
        "AttachStdout": False,
        "Cmd": None,
        "Image": "",
    },
    "Architecture": "amd64",
    "Os": "linux",
    "RootFS": {"Type": "layers", "Layers": ["sha256:" + "a" * 64, "sha256:" + "b" * 64, append.EMPTY_LAYER]},
}
# docker history of such an image (oldest first): the base, two metadata rows, the RUN, an ARG, the WORKDIR that
# made an empty layer (size 0, like a row that made none), the ENTRYPOINT.
HISTORY = (
    ("mmdebstrap", "", 172_000_000),
    ("ARG SOURCE_DATE_EPOCH=1735689600", "buildkit.dockerfile.v0", 0),
    ("ENV VIRTUAL_ENV=/opt/venv", "buildkit.dockerfile.v0", 0),
    ("RUN pip install", "buildkit.dockerfile.v0", 949_000_000),
    ("WORKDIR /workspace", "buildkit.dockerfile.v0", 0),
    ("ENTRYPOINT [...]", "buildkit.dockerfile.v0", 0),
)


def tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hello')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    (root / "pkg" / "run.sh").chmod(0o755)
    os.symlink("pkg/util.py", root / "link.py")
    return root


def layer_bytes(src: Path) -> bytes:
    buf = io.BytesIO()
    append.write_code_layer(src, buf, mtime=EPOCH)
    return buf.getvalue()


def test_the_code_layer_is_the_same_bytes_wherever_and_whenever_it_is_written(tmp_path: Path) -> None:
    a = tree(tmp_path / "a")
    b = tree(tmp_path / "b")
    os.utime(b / "train.py", (time.time() + 1000, time.time() + 1000))  # mtimes are clamped, not copied
    assert layer_bytes(a) == layer_bytes(b)
    (b / "train.py").write_text("print('changed')\n")
    assert layer_bytes(a) != layer_bytes(b)


def test_the_code_layer_holds_the_tree_under_workspace_owned_by_root(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_bytes(tree(tmp_path / "a")))) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names == ["workspace", "workspace/link.py", "workspace/pkg", "workspace/pkg/run.sh",
                         "workspace/pkg/util.py", "workspace/train.py"]  # fmt: skip
        by = {m.name: m for m in members}
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == EPOCH for m in members)
        assert by["workspace/link.py"].issym() and by["workspace/link.py"].linkname == "pkg/util.py"
        assert by["workspace/pkg/run.sh"].mode == 0o755 and by["workspace/pkg"].isdir()
        f = tar.extractfile("workspace/train.py")
        assert f is not None and f.read() == b"print('hello')\n"


def test_history_rows_are_matched_to_the_layers_empty_ones_included() -> None:
    layers = ENV_IMAGE["RootFS"]["Layers"]  # type: ignore[index]
    rows = append.history_entries(HISTORY, layers, "2025-01-01T00:00:00Z")
    assert rows is not None
    made_layer = [r["created_by"] for r in rows if not r.get("empty_layer")]
    # The WORKDIR row made the empty layer; the ARG/ENV/ENTRYPOINT rows of size 0 made none.
    assert made_layer == ["mmdebstrap", "RUN pip install", "WORKDIR /workspace"]
    assert rows[1] == {"created": "2025-01-01T00:00:00Z", "created_by": HISTORY[1][0],
                       "comment": "buildkit.dockerfile.v0", "empty_layer": True}  # fmt: skip


def test_history_that_cannot_be_matched_is_refused() -> None:
    assert append.history_entries(HISTORY[:1], ENV_IMAGE["RootFS"]["Layers"], "x") is None  # type: ignore[index]


def config(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "labels": {"org.nodekit.fingerprint": "new"},
        "env": {"NODEKIT_FINGERPRINT": "new"},
        "created": "2025-01-01T00:00:00Z",
        "created_by": "COPY . /workspace/",
    }
    args.update(kw)
    doc: dict[str, object] = json.loads(append.appended_config(ENV_IMAGE, HISTORY, "sha256:" + "c" * 64, **args))  # type: ignore[arg-type]
    return doc


def test_the_config_appends_the_layer_and_adds_labels_and_environment() -> None:
    doc = config()
    assert doc["rootfs"] == {"type": "layers", "diff_ids": [*ENV_IMAGE["RootFS"]["Layers"], "sha256:" + "c" * 64]}  # type: ignore[index]
    cfg = doc["config"]
    assert isinstance(cfg, dict)
    assert cfg["Labels"] == {"from.base": "yes", "org.nodekit.fingerprint": "new"}
    # Replaced, not repeated: Docker would keep both and the job would see the old one first.
    assert cfg["Env"] == ["PATH=/opt/venv/bin:/usr/bin", "NODEKIT_FINGERPRINT=new"]
    assert cfg["WorkingDir"] == "/workspace" and cfg["Entrypoint"][0] == "/opt/venv/bin/python"
    # What belongs to a container, and empty values, are not carried into an image config.
    assert not {"Hostname", "AttachStdout", "Cmd", "Image"} & set(cfg)
    history = doc["history"]
    assert isinstance(history, list)
    assert history[-1]["created_by"] == "COPY . /workspace/" and "empty_layer" not in history[-1]
    assert sum(not h.get("empty_layer") for h in history) == 4  # one row per layer: Docker checks this
    assert (doc["architecture"], doc["os"], doc["created"]) == ("amd64", "linux", "2025-01-01T00:00:00Z")


def test_the_config_is_canonical_so_equal_inputs_give_one_image_id() -> None:
    one = append.appended_config(ENV_IMAGE, HISTORY, "sha256:" + "c" * 64, labels={"b": "2", "a": "1"}, env={},
                                 created="t", created_by="x")  # fmt: skip
    two = append.appended_config(ENV_IMAGE, HISTORY, "sha256:" + "c" * 64, labels={"a": "1", "b": "2"}, env={},
                                 created="t", created_by="x")  # fmt: skip
    assert one == two == json.dumps(json.loads(one), sort_keys=True, separators=(",", ":")).encode()
    assert config(labels={"org.nodekit.fingerprint": "other"}) != config()


def test_the_archive_is_docker_save_format_with_only_the_files_given(tmp_path: Path) -> None:
    code = layer_bytes(tree(tmp_path / "a"))
    diff_id = "sha256:" + hashlib.sha256(code).hexdigest()
    (tmp_path / "code.tar").write_bytes(code)
    cfg = append.appended_config(ENV_IMAGE, HISTORY, diff_id, labels={}, env={}, created="t", created_by="x")
    image_id = "sha256:" + hashlib.sha256(cfg).hexdigest()
    data = b"".join(append.archive(cfg, image_id, "nodekit/demo:1", {diff_id: tmp_path / "code.tar"}))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
        assert tar.extractfile(f"blobs/sha256/{image_id[7:]}").read() == cfg  # type: ignore[union-attr]
        assert tar.extractfile(f"blobs/sha256/{diff_id[7:]}").read() == code  # type: ignore[union-attr]
    assert sorted(names) == sorted([f"blobs/sha256/{diff_id[7:]}", f"blobs/sha256/{image_id[7:]}", "manifest.json"])
    (entry,) = manifest
    assert entry["Config"] == f"blobs/sha256/{image_id[7:]}" and entry["RepoTags"] == ["nodekit/demo:1"]
    # Every layer is named (the engine looks up the ones it has by chain and never opens their files).
    assert entry["Layers"] == [f"blobs/sha256/{d[7:]}" for d in json.loads(cfg)["rootfs"]["diff_ids"]]


# --- the blob store -----------------------------------------------------------------------------------------


def test_blobs_are_stored_under_their_digest_and_checked_when_read(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    digest = store.put_bytes(b"config")
    assert digest == "sha256:" + hashlib.sha256(b"config").hexdigest()
    assert store.has(digest) and store.read_verified(digest) == b"config"
    assert store.verified_path(digest) == store.path(digest)
    store.path(digest).write_bytes(b"damaged")
    # A damaged blob is removed and reported missing: the push then falls back to docker save.
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


# --- a push from the store ----------------------------------------------------------------------------------


def stored_image(tmp_path: Path) -> tuple[BlobStore, ship.Source, str]:
    """A store holding an image's config and its code layer (not its base layers), and the image as a Source."""
    store = BlobStore(tmp_path / "blobs")
    diff_id, _ = store.put(lambda f: append.write_code_layer(tree(tmp_path / "code"), f, mtime=EPOCH))
    cfg = append.appended_config(ENV_IMAGE, HISTORY, diff_id, labels={}, env={}, created="t", created_by="x")
    image_id = store.put_bytes(cfg)
    layers = tuple(ship.Layer(d, 1) for d in json.loads(cfg)["rootfs"]["diff_ids"])
    src = ship.Source(ref="nodekit/demo:2", image_id=image_id, size=9, engine_id="e", layers=layers,
                      blob_store=store.root, cached_layers=frozenset({diff_id}))  # fmt: skip
    return store, src, diff_id


def test_a_target_lacking_only_the_code_layer_is_sent_it_from_the_store(tmp_path: Path) -> None:
    from nodekit.ship.layers import from_store

    store, src, diff_id = stored_image(tmp_path)
    base = frozenset(layer.diff_id for layer in src.layers[:-1])
    stream = from_store(src, base)
    assert stream is not None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        assert sorted(tar.getnames()) == sorted(
            ["manifest.json", f"blobs/sha256/{src.image_id[7:]}", f"blobs/sha256/{diff_id[7:]}"]
        )
        assert json.loads(tar.extractfile("manifest.json").read())[0]["RepoTags"] == ["nodekit/demo:2"]  # type: ignore[union-attr]
    # A target that also lacks a base layer needs docker save: the store does not hold it.
    assert from_store(src, base - {src.layers[0].diff_id}) is None
    # Nor does a damaged store give anything (and it loses the damaged blob).
    store.path(diff_id).write_bytes(b"x" * 10)
    assert from_store(src, base) is None and not store.has(diff_id)
