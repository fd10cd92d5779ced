"""Shell words for the sbatch script: every value nodekit puts in the script reaches the job byte for byte.

A :data:`Word` is a sequence of parts, each a literal string or a :class:`Var` that the task's shell expands at
run time (``"${nk_rank}"``); :func:`word` renders it as one bash word. Literals are single-quoted, or written as
ANSI-C ``$'...'`` strings when they hold a control character: the script then never contains a raw newline inside
a value, so no value can end the quoted here-document the task body travels in, and what is printed by
``--dry-run`` shows every byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Var:
    """A shell variable the task sets at run time (the node rank, main's address, the image id on the node)."""

    name: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a shell variable name")


@dataclass(frozen=True)
class Raw:
    """Shell text written as is (a command substitution of the script's own functions); never user data."""

    text: str


Part = str | Var | Raw
Word = tuple[Part, ...]


def quote(value: str) -> str:
    """``value`` as one bash word that expands to exactly ``value``."""
    if value and _PLAIN.match(value):
        return value
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "$'" + "".join(_ansi_c(c) for c in value) + "'"
    return "'" + value.replace("'", "'\\''") + "'"


def _ansi_c(c: str) -> str:
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}
    if c in named:
        return named[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02x}"
    return c


def word(parts: Part | Sequence[Part]) -> str:
    """One bash word from literal parts and variables: ``('--env=NODE_RANK=', Var('nk_rank'))`` ->
    ``--env=NODE_RANK="${nk_rank}"``."""
    if isinstance(parts, str | Var | Raw):
        parts = (parts,)
    out = []
    for p in parts:
        if isinstance(p, Raw):
            out.append(p.text)
        elif isinstance(p, Var):
            out.append(f'"${{{p.name}}}"')
        elif p:
            out.append(quote(p))
    return "".join(out) or "''"


def words(items: Iterable[Part | Sequence[Part]]) -> list[str]:
    return [word(i) for i in items]


def array(name: str, items: Iterable[Part | Sequence[Part]], *, indent: str = "", per_line: int = 1) -> str:
    """A bash array assignment, one element per line (readable in the printed script)."""
    rendered = words(items)
    if not rendered:
        return f"{indent}{name}=()"
    rows = [" ".join(rendered[i : i + per_line]) for i in range(0, len(rendered), per_line)]
    inner = "\n".join(f"{indent}    {r}" for r in rows)
    return f"{indent}{name}=(\n{inner}\n{indent})"
