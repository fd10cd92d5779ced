"""Pure: Docker's ``.dockerignore`` rules (patterns, ``!`` re-inclusion, which directories may hold an included
path), plus nodekit's default exclusions. Nothing here reads a file: callers pass the text."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nodekit.errors import ConfigError

# Always left out of the user's code tree, before the user's own .dockerignore (whose `!` lines can override).
# .nodekit holds the staging area and the wheelhouse; .dockerignore is filtering input, not code; nodekit.toml says
# how the job runs (nodes, hosts, timeouts, environment), not what the container holds, so changing it never
# changes the image (what the image holds from it, the packages and the base, enters through the lock and the
# base). The lock is deliberately NOT excluded: the image carries the lock it was built from.
DEFAULT_EXCLUDES: tuple[str, ...] = (".git", ".nodekit", ".dockerignore", "nodekit.toml", "**/__pycache__", "**/*.pyc")


@dataclass(frozen=True)
class _Pattern:
    text: str
    exclusion: bool  # True for `!pattern`: re-includes what earlier patterns excluded
    regex: re.Pattern[str]
    prefix: str  # the literal part before the first wildcard, for deciding whether to walk into a directory


def _compile(pattern: str) -> re.Pattern[str]:
    """moby/patternmatcher's translation: `**` spans directories (also none), `*` and `?` stay in one."""
    out = ["^"]
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        ch = pattern[i]
        if in_class and ch not in "]\\":
            out.append(ch)  # inside [...] ranges and negation pass through, as in Go's regexp
        elif ch == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                out.append(".*" if i >= n else "(.*/)?")
                continue
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\":
            if i + 1 < n:
                i += 1
                out.append(re.escape(pattern[i]))
            else:
                out.append(r"\\")
        elif ch in "[]":
            in_class = ch == "["
            out.append(ch)
        else:
            out.append(re.escape(ch))
        i += 1
    out.append("$")
    return re.compile("".join(out), re.DOTALL)


def _literal_prefix(pattern: str) -> str:
    m = re.search(r"[*?\[\\]", pattern)
    return pattern if m is None else pattern[: m.start()]


def parse_dockerignore(text: str) -> list[str]:
    """The patterns of a ``.dockerignore`` file, normalized the way Docker does.

    A line whose first character is ``#`` is a comment; surrounding whitespace is trimmed; a leading ``!``
    marks an exception; each pattern is cleaned like Go's ``filepath.Clean`` and a leading ``/`` dropped
    (patterns are always relative to the context root, unlike ``.gitignore``).
    """
    patterns: list[str] = []
    for number, raw in enumerate(text.splitlines()):
        line = raw.removeprefix("\ufeff") if number == 0 else raw
        if line.startswith("#"):
            continue
        line = line.strip()
        if not line:
            continue
        invert = line.startswith("!")
        if invert:
            line = line[1:].strip()
        if line:
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line.lstrip("/") or "/"
        patterns.append(("!" if invert else "") + line)
    return patterns


class IgnoreRules:
    """Docker's matching: a path is excluded when the last pattern matching it or one of its parents excludes.

    Patterns apply in order; ``!`` patterns re-include. Matching a directory excludes all below it unless a
    later exception matches something inside.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        compiled: list[_Pattern] = []
        for p in patterns:
            exclusion = p.startswith("!")
            body = p[1:] if exclusion else p
            if not body or body == ".":
                continue
            try:
                regex = _compile(body)
            except re.error as e:
                raise ConfigError(
                    f".dockerignore pattern {p!r} is invalid ({e})", fix="fix it in .dockerignore"
                ) from None
            compiled.append(_Pattern(p, exclusion, regex, _literal_prefix(body)))
        self._patterns = tuple(compiled)
        self._exceptions = tuple(p for p in compiled if p.exclusion)

    @property
    def patterns(self) -> tuple[str, ...]:
        return tuple(p.text for p in self._patterns)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (relative, ``/``-separated) is left out of the context."""
        parts = path.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        matched = False
        for pattern in self._patterns:
            # As in patternmatcher: an exclusion only matters once something matched, and vice versa.
            if pattern.exclusion != matched:
                continue
            if any(pattern.regex.match(c) for c in candidates):
                matched = not pattern.exclusion
        return matched

    def may_include_below(self, directory: str) -> bool:
        """Whether some exception could re-include a path under the excluded ``directory`` (walk into it)."""
        below = directory + "/"
        for p in self._exceptions:
            prefix = p.prefix
            if prefix.startswith(below) or below.startswith(prefix) or p.text[1:].startswith("**"):
                return True
        return False


def ignore_rules(dockerignore: str | None, *, extra_excludes: Sequence[str] = ()) -> IgnoreRules:
    """nodekit's defaults, then ``extra_excludes`` (generated compose files, outputs), then the user's file."""
    user = parse_dockerignore(dockerignore) if dockerignore is not None else []
    return IgnoreRules([*DEFAULT_EXCLUDES, *extra_excludes, *user])
