"""Pure: the stack fingerprint (sha256 of a canonical encoding of everything that defines the image) and the
tag made from it. Trees are :class:`TreeEntry` tuples gathered by the caller (:mod:`nodekit.image.builder.tree`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel

from nodekit.image.locklayers import split_lock
from nodekit.system.frozen import FROZEN

# Bump when the encoding below changes: old and new fingerprints must never collide.
FINGERPRINT_SCHEME = "nodekit-stack-v3"
TAG_LENGTH = 12


class TreeEntry(BaseModel):
    """One path of a tree shipped into the image.

    ``mode`` is normalized (0644/0755 files, 0755 directories, 0777 links) so a different umask on another
    machine gives the same fingerprint and the same image; ``digest`` is the sha256 of a file's content or of a
    link's target. ``size`` is informational and not part of the fingerprint (the digest covers it).
    """

    model_config = FROZEN

    path: str
    kind: Literal["file", "link", "dir"]
    mode: int
    digest: str = ""
    size: int = 0


def normal_mode(kind: Literal["file", "link", "dir"], st_mode: int) -> int:
    """The mode shipped for a path: only the executable bit of a file survives, as in git."""
    if kind == "dir":
        return 0o755
    if kind == "link":
        return 0o777
    return 0o755 if st_mode & 0o111 else 0o644


class StackInputs(BaseModel):
    """Everything that defines the stack. Equal inputs give equal fingerprints; nothing else enters."""

    model_config = FROZEN

    base_id: str
    lock_text: str
    dockerfile_text: str
    build_args: tuple[tuple[str, str], ...]
    launcher: tuple[TreeEntry, ...]
    code: tuple[TreeEntry, ...]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(entries: Iterable[TreeEntry]) -> list[list[object]]:
    return [[e.path, e.kind, f"{e.mode:o}", e.digest] for e in sorted(entries, key=lambda e: e.path)]


def fingerprint(inputs: StackInputs) -> str:
    """The full stack fingerprint: sha256 (hex) of a canonical JSON encoding of ``inputs``.

    Trees are sorted by path and build arguments by name, so neither walk order nor argument order matters;
    mtimes, owners and sizes are not inputs.
    """
    doc = {
        "scheme": FINGERPRINT_SCHEME,
        "base_id": inputs.base_id,
        "lock": sha256_text(inputs.lock_text),
        # Which pins the lower layers hold (split_lock's rule is code, not an input file): a change of the rule
        # changes the layers, so it changes the fingerprint.
        "framework": sha256_text(split_lock(inputs.lock_text).framework),
        "cuda_libs": sha256_text(split_lock(inputs.lock_text).cuda_libs),
        "dockerfile": sha256_text(inputs.dockerfile_text),
        "build_args": sorted([k, v] for k, v in inputs.build_args),
        "launcher": _tree(inputs.launcher),
        "code": _tree(inputs.code),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def image_tag(name: str, fp: str) -> str:
    """``nodekit/<name>:<first 12 hex digits of the fingerprint>``."""
    return f"nodekit/{name}:{fp[:TAG_LENGTH]}"
