"""What changed since the image built here last: the files and packages a user changed, named, so that a stale image
is refused with the change that made it stale, the same way on every host.

A build records its inputs beside its image (``.nodekit/last-build.json``: the code tree's digests, the lock's
pins, the base's identity, the launcher's digest). :func:`current_inputs` reads the same from the project as it is
now; the base is optional (a node that only received a pushed image has none, yet its code and lock still tell
whether the image is the project's). :func:`changes` is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError
from nodekit.image.builder.tree import code_rules, hash_tree, launcher_tree
from nodekit.image.fingerprint import TreeEntry
from nodekit.image.lock import LOCK_FILE, parse_lock
from nodekit.system.frozen import FROZEN


class Inputs(BaseModel):
    """What an image is made from, as far as a user changes it: ``code`` path -> digest (a directory: ""),
    ``packages`` name -> version, the base's identity ("" when unknown) and the launcher tree's digest."""

    model_config = FROZEN

    code: dict[str, str]
    packages: dict[str, str]
    base: str = ""
    launcher: str = ""


def tree_digest(entries: Sequence[TreeEntry]) -> str:
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        h.update(f"{e.path}\0{e.kind}\0{e.mode:o}\0{e.digest}\n".encode())
    return h.hexdigest()


def current_inputs(settings: Settings, *, base: str = "") -> Inputs | None:
    """The project's inputs as they are now (None when its lock cannot be read: the fingerprint check says why)."""
    try:
        lock = parse_lock((settings.project_dir / LOCK_FILE).read_text())
    except (OSError, ConfigError):
        return None
    code = hash_tree(settings.project_dir, code_rules(settings))
    return Inputs(
        code={e.path: e.digest for e in code},
        packages={p.name: p.version for p in lock.packages},
        base=base,
        launcher=tree_digest(launcher_tree()),
    )


def recorded_inputs(record: Mapping[str, Any] | None) -> Inputs | None:
    """The inputs a build record holds (None for a record written before it held them)."""
    raw = record.get("inputs") if record else None
    if not isinstance(raw, dict):
        return None
    try:
        return Inputs.model_validate(raw)
    except ValueError:
        return None


def changes(old: Inputs, new: Inputs, *, most: int = 4) -> list[str]:
    """Pure: what differs from ``old`` to ``new``, in a user's words, at most ``most`` items (then "and N more"):
    files changed, added or removed; packages added, removed or upgraded; a new base; a new nodekit."""
    out: list[str] = []
    for path in sorted(set(old.code) | set(new.code)):
        if path not in new.code:
            out.append(f"{path} removed")
        elif path not in old.code:
            out.append(f"{path} added")
        elif old.code[path] != new.code[path]:
            out.append(f"{path} changed")
    for name in sorted(set(old.packages) | set(new.packages)):
        if name not in new.packages:
            out.append(f"package {name} removed")
        elif name not in old.packages:
            out.append(f"package {name}=={new.packages[name]} added")
        elif old.packages[name] != new.packages[name]:
            out.append(f"package {name} {old.packages[name]} -> {new.packages[name]}")
    if old.base and new.base and old.base != new.base:
        out.append("the base image")
    if old.launcher and new.launcher and old.launcher != new.launcher:
        out.append("nodekit itself (another version)")
    if len(out) > most:
        out = [*out[:most], f"and {len(out) - most} more"]
    return out
