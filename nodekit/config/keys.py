"""Where a refused setting sits, for the one line that refuses it: the known key a typo was meant to be (``did you
mean``), and the line of nodekit.toml that holds it.

Both read only what they are handed (the settings model, the file's text), so they are tested without a file.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

Loc = Sequence[int | str]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds: ``Mount``, ``tuple[Mount, ...]``, ``dict[int, NodeOverride]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _container(annotation: Any) -> bool:
    """Whether a field holds several entries (a list of tables or a table of tables), so that the next part of a
    location is an index or a key, not a field name."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_container(a) for a in typing.get_args(annotation))
    return origin in (tuple, list, dict)


def known_keys(model: type[BaseModel], loc: Loc) -> tuple[str, ...]:
    """The key names a table at ``loc`` (the location of an unknown key, without the key) accepts: the top level's
    for ``()``, ``[[mounts]]``'s for ``("mounts", 0)``, ``[nodes.1]``'s for ``("nodes", "1")``."""
    current: type[BaseModel] | None = model
    parts = list(loc)
    while parts and current is not None:
        name = str(parts.pop(0))
        field = current.model_fields.get(name)
        if field is None:
            return ()
        inner = _models_in(field.annotation)
        current = inner[0] if inner else None
        if _container(field.annotation) and parts:
            parts.pop(0)  # the entry's index or key
    if current is None:
        return ()
    return tuple(n for n, f in current.model_fields.items() if not f.exclude)


# What users write for a key that nodekit spells otherwise: [environment] is [env] (too far apart for difflib).
_ALIASES = {"environment": "env", "environ": "env", "variables": "env", "mount": "mounts", "volumes": "mounts",
            "node": "nodes", "host": "hosts", "command": "script"}  # fmt: skip


def did_you_mean(word: str, known: Sequence[str]) -> str | None:
    """The known key closest to ``word`` (a typo, a plural, a dash for an underscore, or a typo of a name users
    give it elsewhere: ``[enviroment]`` for ``env``), or None when none is close."""
    cleaned = word.replace("-", "_").lower()
    if cleaned in known:
        return cleaned
    aliases = {a: k for a, k in _ALIASES.items() if k in known}
    close = difflib.get_close_matches(cleaned, [*known, *aliases], n=1, cutoff=0.6)
    return aliases.get(close[0], close[0]) if close else None


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_-]+)\s*(?:=|\.)""")


def _unquoted(part: str) -> str:
    part = part.strip()
    return part[1:-1] if len(part) >= 2 and part[0] == part[-1] and part[0] in "\"'" else part


def line_of(text: str, loc: Loc) -> int | None:
    """The 1-based line of ``text`` (nodekit.toml) where the setting at ``loc`` is written, or the line of its table
    when the key is not written there (a missing key, a value set in an inline table); None when the file does not
    hold it. ``loc`` is pydantic's: ``("nnodes",)``, ``("nodes", "1", "iface")``, ``("mounts", 0, "host")``."""
    parts = tuple(str(p) for p in loc if "[" not in str(p))
    if not parts:
        return None
    table: tuple[str, ...] = ()
    counts: dict[tuple[str, ...], int] = {}
    best: int | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            names = tuple(_unquoted(p) for p in header[2].split("."))
            if header[1] == "[[":
                index = counts.get(names, 0)
                counts[names] = index + 1
                table = (*names, str(index))
            else:
                table = names
            if table[: len(parts)] == parts:
                return number  # the table is the setting itself, or inside it: [[mount]] for mount
            if parts[: len(table)] == table:
                best = number  # the table that holds it: the line to show when the key itself is not written
            continue
        if _KEY.match(line) is None:
            continue
        written = (*table, *(_unquoted(p) for p in line.split("=", 1)[0].split(".")))
        if parts[: len(written)] == written or written[: len(parts)] == parts:
            return number
    return best
