"""``nodekit inspect``: an image's stack as its labels and installed wheels declare it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from nodekit.errors import ConfigError, ImageError
from nodekit.image.builder.record import human_size
from nodekit.image.lock import Lock, parse_lock
from nodekit.image.plan import (
    LABEL_BASE,
    LABEL_BASE_ID,
    LABEL_FINGERPRINT,
    LABEL_LOCK,
    LABEL_NAME,
    LABEL_PYTHON,
    LABEL_TORCH,
    LABEL_VERSION,
)
from nodekit.image.probe import DISTS_AND_TORCH
from nodekit.system import docker
from nodekit.system.frozen import FROZEN

# Runs in the image with its own Python; reads metadata only (importing torch would take seconds).
_PROBE = (
    "import ast, importlib.metadata as md, importlib.util, json, os, pathlib, platform, re\n"
    + DISTS_AND_TORCH
    + r"""lock = pathlib.Path("/opt/venv/nodekit.lock")
print(json.dumps({"python": platform.python_version(), "dists": dists, "torch": torch,
                  "lock": lock.read_text() if lock.is_file() else None}))
"""
)


class StackReport(BaseModel):
    """``nodekit inspect``: an image's stack as its labels and installed wheels declare it."""

    model_config = FROZEN

    ref: str
    image_id: str
    tags: tuple[str, ...]
    name: str | None
    fingerprint: str | None
    base: str | None
    python: str | None
    torch: str | None
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    size: int
    nodekit_version: str | None
    lock_sha256: str | None
    packages: dict[str, str]  # the image's lock: name -> version
    not_as_locked: tuple[str, ...] = ()  # locked packages installed at another version, or missing
    from_base: tuple[str, ...] = ()  # what the base image provides and the lock kept (name==version)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def to_text(self) -> str:
        none = "none (CPU-only torch)" if self.torch and not self.cuda else "-"
        rows = [
            ("image", ", ".join(self.tags) or self.ref),
            ("id", self.image_id),
            ("fingerprint", self.fingerprint or "- (not a nodekit image)"),
            ("base", self.base or "-"),
            ("python", self.python or "-"),
            ("torch", self.torch or "-"),
            ("cuda", self.cuda or none),
            ("cudnn", self.cudnn or none),
            ("nccl", self.nccl or none),
            ("size", human_size(self.size)),
            ("nodekit", self.nodekit_version or "-"),
            ("lock", f"{len(self.packages)} packages, sha256 {self.lock_sha256 or '-'}"),
        ]
        if self.from_base:
            rows.append(("from base", ", ".join(self.from_base)))
        if self.not_as_locked:
            rows.append(("NOT AS LOCKED", ", ".join(self.not_as_locked)))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"  {n}=={v}" for n, v in self.packages.items()]
        return "\n".join(lines)


def _first(dists: Mapping[str, str], matches: Callable[[str], bool]) -> str | None:
    return next((v for k, v in sorted(dists.items()) if matches(k)), None)


def stack_from_probe(probe: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the versions a probe of the image reports (see ``_PROBE``)."""
    dists: dict[str, str] = dict(probe.get("dists") or {})
    tv: dict[str, Any] = dict(probe.get("torch") or {})
    lock: Lock | None = None
    if probe.get("lock"):
        with contextlib.suppress(ConfigError):
            lock = parse_lock(str(probe["lock"]), source="the image's nodekit.lock")
    packages = {p.name: p.version for p in lock.packages} if lock else {}
    wrong = tuple(
        f"{n} (locked {v}, installed {dists.get(n, 'nothing')})" for n, v in packages.items() if dists.get(n) != v
    )
    return {
        "python": probe.get("python"),
        "torch": tv.get("__version__") or dists.get("torch"),
        "cuda": tv.get("cuda") or tv.get("hip"),
        "cudnn": _first(dists, lambda k: k.startswith("nvidia-cudnn")),
        "nccl": _first(dists, lambda k: k.startswith("nvidia-nccl")),
        "packages": packages,
        "not_as_locked": wrong,
        "from_base": lock.provided if lock else (),
    }


def inspect_image(ref: str) -> StackReport:
    """The stack of image ``ref``: labels, plus what a short metadata probe in a container of it reports.

    Raises ImageError when the image is not here. A non-nodekit image gets a report of what its labels say.
    """
    info = docker.require_image(ref)
    labels = info.labels
    found: dict[str, Any] = {}
    with contextlib.suppress(ImageError):
        out = docker.run_in_image(info.id, ["-c", _PROBE], entrypoint="/opt/venv/bin/python")
        found = stack_from_probe(json.loads(out.strip().splitlines()[-1]))
    base = labels.get(LABEL_BASE)
    if base and labels.get(LABEL_BASE_ID):
        base = f"{base} ({labels[LABEL_BASE_ID]})"
    return StackReport(
        ref=ref,
        image_id=info.id,
        tags=info.tags,
        name=labels.get(LABEL_NAME),
        fingerprint=labels.get(LABEL_FINGERPRINT),
        base=base,
        python=found.get("python") or labels.get(LABEL_PYTHON),
        torch=found.get("torch") or labels.get(LABEL_TORCH),
        cuda=found.get("cuda"),
        cudnn=found.get("cudnn"),
        nccl=found.get("nccl"),
        size=info.size,
        nodekit_version=labels.get(LABEL_VERSION),
        lock_sha256=labels.get(LABEL_LOCK),
        packages=found.get("packages", {}),
        not_as_locked=found.get("not_as_locked", ()),
        from_base=found.get("from_base", ()),
    )


def layers(ref: str) -> tuple[str, ...]:
    """The image's layer digests, base first (tests and benchmarks compare them across rebuilds)."""
    return docker.image_layers(ref)
