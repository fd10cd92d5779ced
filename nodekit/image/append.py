"""The image's last stage, written by nodekit: the project's code as one layer on top of the environment image,
plus the image's labels, in Docker's own archive format.

Why nodekit writes it rather than BuildKit: a layer BuildKit made can only be got back out of the engine with
``docker save`` of the whole image (10-15 s for the 1.1 GB demo image on the test machine, however small the
change), so a code-only push could never take about a second. Writing the last layer itself, nodekit holds its
bytes and the image config (:mod:`nodekit.image.blobs`), and a push of a code change sends just those (see
:func:`nodekit.ship.fanout.push`). The same technique as ko, Jib or ``crane append``.

- :func:`write_code_layer`: the staged code tree (modes normalized, mtimes clamped by
  :func:`nodekit.image.builder.hash_tree`)
  as a tar under ``workspace/``, entries sorted, owner root: the same bytes on every machine, so the same diff id.
- :func:`appended_config`: pure; the environment image's configuration (as ``docker image inspect`` gives it) with
  the code layer appended to ``rootfs.diff_ids``, the labels and environment variables added, the history kept, and
  a fixed creation time. Canonical JSON: the image id (its sha256) depends only on the inputs.
- :func:`archive`: pure stream; a ``docker save``-format tar (``manifest.json``, the config, the layer files given),
  which ``docker load`` turns into exactly that image id. Layers whose chain the engine holds may be left out: the
  classic store's load opens a layer file only when the chain is missing (see :mod:`nodekit.ship.layers`).
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

CODE_ROOT = "workspace"
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"
"""The diff id of an empty layer (a tar of two zero blocks), which BuildKit makes for e.g. WORKDIR."""
BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20

# What ``docker image inspect`` reports in Config that belongs to a container, not an image; and the keys an image
# config carries.
_IMAGE_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels", "StopSignal",
               "ArgsEscaped", "Healthcheck", "OnBuild", "Shell")  # fmt: skip


class _Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


def _info(name: str, st: os.stat_result, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_code_layer(src: Path, out: _Writable, *, mtime: int, root: str = CODE_ROOT) -> int:
    """Write the tree under ``src`` as a layer tar (``root/`` and everything below it, depth first in name order,
    owner root, every mtime ``mtime``) to ``out``; the number of entries. Files, directories and symbolic links
    only (what the staged tree holds)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        top = _info(root, src.stat(), mtime)
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        return 1 + _add_tree(tar, src, root, mtime)


def _add_tree(tar: tarfile.TarFile, directory: Path, prefix: str, mtime: int) -> int:
    entries = 0
    for name in sorted(os.listdir(directory)):
        path = directory / name
        st = path.lstat()
        info = _info(f"{prefix}/{name}", st, mtime)
        if stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(path)
            tar.addfile(info)
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
            entries += _add_tree(tar, path, info.name, mtime)
        elif stat.S_ISREG(st.st_mode):
            info.size = st.st_size
            with path.open("rb") as f:
                tar.addfile(info, f)
        else:
            continue
        entries += 1
    return entries


def created_at(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def history_entries(
    history: Sequence[tuple[str, str, int]], diff_ids: Sequence[str], created: str
) -> list[dict[str, Any]] | None:
    """Pure: the image config's history for ``docker history``'s rows ``(created by, comment, size)``, oldest
    first, with ``empty_layer`` set on the rows that made no layer; None when the rows cannot be matched to
    ``diff_ids``. A row with a size made a layer; a row of size 0 made one only where an empty layer is next in
    ``diff_ids`` and the layers left outnumber the sized rows left (BuildKit's WORKDIR)."""
    sized_after = [0] * (len(history) + 1)
    for i in range(len(history) - 1, -1, -1):
        sized_after[i] = sized_after[i + 1] + (history[i][2] > 0)
    out: list[dict[str, Any]] = []
    at = 0
    for i, (by, comment, size) in enumerate(history):
        layer = size > 0 or (
            at < len(diff_ids) and diff_ids[at] == EMPTY_LAYER and len(diff_ids) - at > sized_after[i + 1]
        )
        entry: dict[str, Any] = {"created": created, "created_by": by}
        if comment:
            entry["comment"] = comment
        if layer:
            at += 1
        else:
            entry["empty_layer"] = True
        out.append(entry)
    return out if at == len(diff_ids) else None


def appended_config(
    base: Mapping[str, Any],
    history: Sequence[tuple[str, str, int]],
    diff_id: str,
    *,
    labels: Mapping[str, str],
    env: Mapping[str, str],
    created: str,
    created_by: str,
) -> bytes:
    """Pure: the config of the image ``base`` (``docker image inspect`` output) with the layer ``diff_id`` on top,
    ``labels`` added to its labels and ``env`` to its environment (replacing variables of the same name); canonical
    JSON (sorted keys, no spaces), so equal inputs give an equal image id."""
    cfg = {k: v for k in _IMAGE_KEYS if (v := (base.get("Config") or {}).get(k)) not in (None, "", [], {}, False)}
    cfg["Labels"] = {**(cfg.get("Labels") or {}), **labels}
    names = set(env)
    cfg["Env"] = [e for e in cfg.get("Env") or [] if e.partition("=")[0] not in names] + [
        f"{k}={v}" for k, v in env.items()
    ]
    diff_ids = list((base.get("RootFS") or {}).get("Layers") or [])
    rows = history_entries(history, diff_ids, created)
    if rows is None:
        # The environment's history cannot be matched to its layers: one row per layer, so the image stays valid.
        rows = [{"created": created, "created_by": f"layer {i + 1} of the environment"} for i in range(len(diff_ids))]
    rows.append({"created": created, "created_by": created_by, "comment": "nodekit"})
    doc: dict[str, Any] = {
        "architecture": base.get("Architecture") or "amd64",
        "os": base.get("Os") or "linux",
        "created": created,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [*diff_ids, diff_id]},
        "history": rows,
    }
    if base.get("Variant"):
        doc["variant"] = base["Variant"]
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def blob_name(digest: str) -> str:
    """Where a ``docker save`` archive (Docker >= 25, OCI layout) keeps the blob ``digest``: a layer under its diff
    id, the config under the image id."""
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


def archive(config: bytes, image_id: str, ref: str | None, files: Mapping[str, Path]) -> Iterator[bytes]:
    """A ``docker save``-format archive of the image whose config is ``config`` (``image_id`` its sha256): the
    manifest (naming ``ref`` when given), the config, and the layer files ``files`` (diff id -> uncompressed layer
    tar). Layers of the config not in ``files`` are left out: it loads on an engine that holds their chain."""
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    manifest = [{"Config": blob_name(image_id), "RepoTags": [ref] if ref else None,
                 "Layers": [blob_name(d) for d in diff_ids]}]  # fmt: skip
    small = {blob_name(image_id): config, "manifest.json": json.dumps(manifest).encode()}
    seen = set()
    for d in diff_ids:
        if d in files and d not in seen:
            seen.add(d)
            path = files[d]
            size = path.stat().st_size
            yield _member(blob_name(d), size)
            with path.open("rb") as f:
                left = size
                while left:
                    piece = f.read(min(CHUNK, left))
                    if not piece:
                        raise OSError(f"{path} ends early")
                    left -= len(piece)
                    yield piece
            if pad := -size % BLOCK:
                yield bytes(pad)
    for name, data in small.items():
        yield _member(name, len(data))
        yield data
        if pad := -len(data) % BLOCK:
            yield bytes(pad)
    yield bytes(2 * BLOCK)


__all__ = [
    "CODE_ROOT",
    "EMPTY_LAYER",
    "appended_config",
    "archive",
    "blob_name",
    "created_at",
    "history_entries",
    "write_code_layer",
]
