"""What a name in a dataset may be, on the node and at the source. Pure.

A name is a relative, ``/``-separated path of valid UTF-8 without ``.``, ``..`` or empty components and without
NUL; the first component is never :data:`STATE_DIR` (nodekit's own state under the target). A content hash is the
datacheck manifest's: 64 hex digits (sha256), or ``p:`` and 64 hex digits (sha256 over 32 MiB pieces).
"""

from __future__ import annotations

import re

from nodekit.launcher.datacheck.manifest import STATE_DIR as STATE_DIR

_HASH = re.compile(r"(p:)?[0-9a-f]{64}")
_PLAIN = frozenset(("", ".", ".."))
"""Components a name never has."""


def name_problem(name: object) -> str | None:
    """Why ``name`` may not be written under a target, or None when it may."""
    if not isinstance(name, str) or not name:
        return "an empty or non-text name"
    if not name.isascii():  # checked per file of a source of 100,000: the common case costs no encode
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return f"{name.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8"
    if "\x00" in name:
        return f"{name!r} holds a NUL byte"
    if name.startswith("/"):
        return f"{name!r} is an absolute path"
    parts = name.split("/")
    if not _PLAIN.isdisjoint(parts):
        return f"{name!r} has an empty, '.' or '..' component"
    if parts[0] == STATE_DIR:
        return f"{name!r} is inside nodekit's own {STATE_DIR}"
    return None


def hash_problem(h: object) -> str | None:
    if not isinstance(h, str) or not _HASH.fullmatch(h):
        return f"{h!r} is not a content hash"
    return None
