"""The layers and the image config nodekit writes itself, byte for byte the same on every machine.

Every layer of a nodekit image above its base is a blob nodekit holds (:mod:`nodekit.image.blobs`), so a push sends
exactly the layers a node lacks without reading the image back out of an engine (``docker save`` of a whole image
takes minutes for a CUDA image, whatever the size of the change), on either of Docker's image stores:

- the package layers (the Python environment with the CUDA libraries, the framework, the other packages) are
  installed by BuildKit, one Dockerfile stage each, and exported as plain file trees (``--output type=tar``);
  :func:`normalize_layer` rewrites such a tree into a layer tar (owner root, every mtime the build's epoch, no
  extended attributes), so its diff id depends on the files alone;
- the launcher and the project's code are written from the staged trees by :func:`write_tree_layer`, as ko, Jib or
  ``crane append`` write an application layer;
- :func:`image_config` writes the configuration (the base's, plus the environment, working directory, entrypoint
  and labels nodekit's Dockerfile declares) in canonical JSON, so the config digest depends only on its inputs.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nodekit.image.archive import ChunkReader, Writable

BLOCK = tarfile.BLOCKSIZE
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"
"""The diff id of an empty layer (a tar of two zero blocks), which BuildKit makes for e.g. WORKDIR."""

# What ``docker image inspect`` reports in Config that belongs to a container, not an image; and the keys an image
# config carries.
IMAGE_KEYS = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels", "StopSignal",
              "ArgsEscaped", "Healthcheck", "OnBuild", "Shell")  # fmt: skip


def _clean(info: tarfile.TarInfo, mtime: int) -> tarfile.TarInfo:
    out = tarfile.TarInfo(info.name)
    out.type, out.linkname, out.size = info.type, info.linkname, info.size
    out.mode = stat.S_IMODE(info.mode)
    out.mtime = mtime
    out.uid = out.gid = 0
    out.uname = out.gname = ""
    return out


def normalize_layer(chunks: Iterable[bytes], out: Writable, *, mtime: int) -> int:
    """Rewrite the file tree BuildKit exported as a tar (``--output type=tar``, walked in name order) into a layer
    tar on ``out``: every entry owned by root, its mtime ``mtime``, its mode, type, link target and bytes kept,
    extended attributes and BuildKit's own headers dropped. Entries keep BuildKit's order, which is the order of a
    sorted walk. Returns the number of entries. tarfile.TarError when the stream is not a tar archive."""
    n = 0
    with (
        tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as source,  # type: ignore[call-overload]
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,  # type: ignore[call-overload]
    ):
        for member in source:
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                continue  # devices and fifos have no place in a Python environment
            info = _clean(member, mtime)
            data = source.extractfile(member) if member.isfile() else None
            tar.addfile(info, data)
            n += 1
    return n


def _info(name: str, st: os.stat_result, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_tree_layer(src: Path, out: Writable, *, mtime: int, root: str) -> int:
    """Write the tree under ``src`` as a layer tar placing it at ``root`` (e.g. ``workspace`` or
    ``opt/nodekit/nodekit``): the directories leading there (mode 0755), ``root/`` and everything below it, depth
    first in name order, owner root, every mtime ``mtime``. Files, directories and symbolic links only (what a
    staged tree holds). Returns the number of entries."""
    parts = root.strip("/").split("/")
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for i in range(1, len(parts)):
            parent = tarfile.TarInfo("/".join(parts[:i]))
            parent.type, parent.mode, parent.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(parent)
        top = _info("/".join(parts), src.stat(), mtime)
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        return len(parts) + _add_tree(tar, src, "/".join(parts), mtime)


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
    """Pure: an image config's history for ``docker history``'s rows ``(created by, comment, size)``, oldest
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


@dataclass(frozen=True)
class Runtime:
    """What the Dockerfile's ENV, WORKDIR, ENTRYPOINT and LABEL lines give the image, on top of its base."""

    env: Mapping[str, str]
    """Set in this order; ``${PATH}`` in a value is the base's PATH, as in a Dockerfile."""
    workdir: str
    entrypoint: tuple[str, ...]
    labels: Mapping[str, str]


def image_config(
    base: Mapping[str, Any],
    base_history: Sequence[tuple[str, str, int]],
    layers: Sequence[tuple[str, str]],
    runtime: Runtime,
    *,
    created: str,
) -> bytes:
    """Pure: the config of the image made of the base (``docker image inspect`` of it, and its ``docker history``
    rows) and ``layers`` on top (``(diff id, what made it)``, lowest first), with ``runtime`` applied as the
    Dockerfile would (ENV replaces variables of the same name, ENTRYPOINT clears the base's CMD); canonical JSON
    (sorted keys, no spaces), so equal inputs give an equal config digest."""
    cfg = {k: v for k in IMAGE_KEYS if (v := (base.get("Config") or {}).get(k)) not in (None, "", [], {}, False)}
    base_env = [str(e) for e in cfg.get("Env") or []]
    base_path = next((e.partition("=")[2] for e in base_env if e.startswith("PATH=")), "")
    names = set(runtime.env)
    env = [e for e in base_env if e.partition("=")[0] not in names]
    env += [f"{k}={v.replace('${PATH}', base_path)}" for k, v in runtime.env.items()]
    cfg["Env"] = env
    cfg["WorkingDir"] = runtime.workdir
    cfg["Entrypoint"] = list(runtime.entrypoint)
    cfg.pop("Cmd", None)
    cfg["Labels"] = {**(cfg.get("Labels") or {}), **runtime.labels}
    base_ids = list((base.get("RootFS") or {}).get("Layers") or [])
    rows = history_entries(base_history, base_ids, created)
    if rows is None:
        # The base's history cannot be matched to its layers: one row per layer, so the image stays valid.
        rows = [{"created": created, "created_by": f"layer {i + 1} of the base"} for i in range(len(base_ids))]
    rows += [{"created": created, "created_by": by, "comment": "nodekit"} for _, by in layers]
    doc: dict[str, Any] = {
        "architecture": base.get("Architecture") or "amd64",
        "os": base.get("Os") or "linux",
        "created": created,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [*base_ids, *(d for d, _ in layers)]},
        "history": rows,
    }
    if base.get("Variant"):
        doc["variant"] = base["Variant"]
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


__all__ = [
    "EMPTY_LAYER",
    "Runtime",
    "created_at",
    "history_entries",
    "image_config",
    "normalize_layer",
    "write_tree_layer",
]
