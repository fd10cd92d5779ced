"""The layers and the config nodekit writes (nodekit/image/layers.py): the same bytes on every machine. The real
engines loading them are tested in tests/integration (both image stores) and tests/cluster."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

from nodekit.image.layers import EMPTY_LAYER, Runtime, history_entries, image_config, normalize_layer, write_tree_layer

EPOCH = 1735689600
BASE = {
    "Config": {"Env": ["PATH=/usr/local/bin:/usr/bin", "LANG=C.UTF-8"], "Cmd": ["/bin/bash"],
               "Labels": {"from.base": "yes"}, "Hostname": "", "AttachStdout": False, "Image": ""},
    "Architecture": "amd64",
    "Os": "linux",
    "RootFS": {"Type": "layers", "Layers": ["sha256:" + "a" * 64]},
}  # fmt: skip
BASE_HISTORY = (("mmdebstrap", "", 172_000_000),)


def tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hello')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    (root / "pkg" / "run.sh").chmod(0o755)
    os.symlink("pkg/util.py", root / "link.py")
    return root


def layer_bytes(src: Path, root: str = "workspace") -> bytes:
    buf = io.BytesIO()
    write_tree_layer(src, buf, mtime=EPOCH, root=root)
    return buf.getvalue()


def test_a_tree_layer_is_the_same_bytes_wherever_and_whenever_it_is_written(tmp_path: Path) -> None:
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    os.utime(b / "train.py", (time.time() + 1000, time.time() + 1000))  # mtimes are clamped, not copied
    assert layer_bytes(a) == layer_bytes(b)
    (b / "train.py").write_text("print('changed')\n")
    assert layer_bytes(a) != layer_bytes(b)


def test_a_tree_layer_holds_the_tree_at_its_root_with_the_directories_leading_there(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_bytes(tree(tmp_path / "a"), "opt/nodekit/nodekit"))) as tar:
        members = tar.getmembers()
        by = {m.name: m for m in members}
        assert [m.name for m in members] == [
            "opt", "opt/nodekit", "opt/nodekit/nodekit", "opt/nodekit/nodekit/link.py", "opt/nodekit/nodekit/pkg",
            "opt/nodekit/nodekit/pkg/run.sh", "opt/nodekit/nodekit/pkg/util.py", "opt/nodekit/nodekit/train.py",
        ]  # fmt: skip
        assert all(m.uid == 0 and m.gid == 0 and m.mtime == EPOCH and not m.uname for m in members)
        assert by["opt"].isdir() and by["opt"].mode == 0o755
        assert by["opt/nodekit/nodekit/link.py"].linkname == "pkg/util.py"
        assert by["opt/nodekit/nodekit/pkg/run.sh"].mode == 0o755


def buildkit_tar() -> bytes:
    """A tree as BuildKit's tar exporter hands one out: the builder's owners, build-time mtimes, extended
    attributes, a hard link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = (("opt", tarfile.DIRTYPE, b""), ("opt/venv", tarfile.DIRTYPE, b""),
                   ("opt/venv/a.py", tarfile.REGTYPE, b"A = 1\n"), ("opt/venv/b.py", tarfile.LNKTYPE, b""),
                   ("opt/venv/py", tarfile.SYMTYPE, b""))  # fmt: skip
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.type, info.uid, info.gid, info.uname, info.mtime = kind, 1000, 1000, "builder", 1_800_000_000
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            info.pax_headers = {"SCHILY.xattr.user.x": "1"}
            if kind == tarfile.LNKTYPE:
                info.linkname = "opt/venv/a.py"
            if kind == tarfile.SYMTYPE:
                info.linkname = "/usr/bin/python3"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def test_an_exported_tree_is_rewritten_owned_by_root_with_one_mtime_and_nothing_else() -> None:
    raw = buildkit_tar()
    out = io.BytesIO()
    n = normalize_layer([raw[:700], raw[700:]], out, mtime=EPOCH)
    assert n == 5
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["opt", "opt/venv", "opt/venv/a.py", "opt/venv/b.py", "opt/venv/py"]
        assert all(m.uid == 0 and m.mtime == EPOCH and not m.uname and not m.pax_headers for m in members)
        assert members[3].islnk() and members[3].linkname == "opt/venv/a.py"
        assert members[4].linkname == "/usr/bin/python3"
        assert tar.extractfile("opt/venv/a.py").read() == b"A = 1\n"  # type: ignore[union-attr]
    again = io.BytesIO()
    normalize_layer([raw], again, mtime=EPOCH)
    assert again.getvalue() == out.getvalue()


def test_history_rows_are_matched_to_the_layers_empty_ones_included() -> None:
    history = (("mmdebstrap", "", 172_000_000), ("ARG X=1", "buildkit.dockerfile.v0", 0),
               ("RUN pip install", "buildkit.dockerfile.v0", 949_000_000), ("WORKDIR /workspace", "b", 0))  # fmt: skip
    layers = ["sha256:" + "a" * 64, "sha256:" + "b" * 64, EMPTY_LAYER]
    rows = history_entries(history, layers, "t")
    assert rows is not None
    assert [r["created_by"] for r in rows if not r.get("empty_layer")] == ["mmdebstrap", "RUN pip install",
                                                                          "WORKDIR /workspace"]  # fmt: skip
    assert history_entries(history[:1], layers, "t") is None


def config(**runtime: object) -> dict[str, object]:
    rt = Runtime(**{"env": {"PATH": "/opt/venv/bin:${PATH}", "NODEKIT_FINGERPRINT": "new"}, "workdir": "/workspace",
                    "entrypoint": ("/opt/venv/bin/python", "-m", "nodekit.launcher"),
                    "labels": {"org.nodekit.fingerprint": "new"}, **runtime})  # type: ignore[arg-type]  # fmt: skip
    layers = [("sha256:" + "b" * 64, "RUN pip install (packages)"), ("sha256:" + "c" * 64, "COPY . /workspace/")]
    doc: dict[str, object] = json.loads(image_config(BASE, BASE_HISTORY, layers, rt, created="2025-01-01T00:00:00Z"))
    return doc


def test_the_config_is_the_base_with_the_dockerfile_runtime_applied() -> None:
    doc = config()
    cfg = doc["config"]
    assert isinstance(cfg, dict)
    # ENV as a Dockerfile applies it: ${PATH} is the base's, a variable of the same name is replaced.
    assert cfg["Env"] == ["LANG=C.UTF-8", "PATH=/opt/venv/bin:/usr/local/bin:/usr/bin", "NODEKIT_FINGERPRINT=new"]
    # ENTRYPOINT clears the base's CMD; container-only keys and empty values are not carried into an image config.
    assert cfg["Entrypoint"] == ["/opt/venv/bin/python", "-m", "nodekit.launcher"] and "Cmd" not in cfg
    assert not {"Hostname", "AttachStdout", "Image"} & set(cfg)
    assert cfg["WorkingDir"] == "/workspace"
    assert cfg["Labels"] == {"from.base": "yes", "org.nodekit.fingerprint": "new"}
    assert doc["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + "a" * 64, "sha256:" + "b" * 64,
                                                             "sha256:" + "c" * 64]}  # fmt: skip
    history = doc["history"]
    assert isinstance(history, list) and len(history) == 3  # one row per layer: Docker checks this
    assert history[-1] == {"created": "2025-01-01T00:00:00Z", "created_by": "COPY . /workspace/",
                           "comment": "nodekit"}  # fmt: skip


def test_the_config_is_canonical_so_equal_inputs_give_one_digest() -> None:
    one = config(labels={"b": "2", "a": "1"})
    assert one == config(labels={"a": "1", "b": "2"})
    assert config(labels={"org.nodekit.fingerprint": "other"}) != config()
