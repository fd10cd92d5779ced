"""What the receiver's tests feed it: a plan for files sent whole to an empty target, the stream (the plan's block,
then each content's frame, then END), and a snapshot of a directory to compare before and after."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from nodekit.launcher.datasync import receive


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def snapshot(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_bytes()
    return out


def stream(plan: dict[str, Any], frames: list[tuple[str, bytes]] | None = None, *, end: bool = True) -> bytes:
    body = json.dumps(plan).encode()
    out = f"{len(body)}\n".encode() + body
    for h, data in frames or []:
        out += f"{h} {len(data)}\n".encode() + data
    return out + (b"END\n" if end else b"")


def plan_for(files: dict[str, bytes], *, kind: str = "f", **extra: Any) -> dict[str, Any]:
    """A plan that sends ``files`` whole to an empty target."""
    return {
        "want": {n: [len(d), sha(d), kind] for n, d in files.items()},
        "place": {n: sha(d) for n, d in files.items()},
        "incoming": {sha(d): len(d) for d in files.values()},
        "copy": {},
        "delete": [],
        "adopt": [],
        **extra,
    }


def run(target: Path, data: bytes) -> int:
    return receive.main(["apply", str(target)], io.BytesIO(data), io.StringIO())
