"""The source's manifest, read on the machine that runs nodekit, with its hash cache kept in the project's
``.nodekit/data-cache/`` (one file per source directory): a dataset whose files did not change costs a walk and a
``stat`` per file, not a read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from nodekit.errors import UsageError
from nodekit.launcher.datasync.scan import Cache, Manifest, hashed, source_files

CACHE_DIR = Path(".nodekit") / "data-cache"


def _cache_file(project_dir: Path, source: Path) -> Path:
    return project_dir / CACHE_DIR / (hashlib.sha256(str(source).encode()).hexdigest()[:24] + ".json")


def _load(path: Path) -> Cache:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, cache: Cache) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, separators=(",", ":")))
        tmp.replace(path)
    except OSError:
        pass  # a read-only project: the next push reads the files again


class Holders(Mapping[str, Path]):
    """For each content hash, a source file that holds it, made a Path only when asked for: a push sends few
    contents, and a Path per file of 100,000 cost a no-change push about a third of its source scan."""

    def __init__(self, base: Path, names: dict[str, str]) -> None:
        self.base, self.names = base, names

    def __getitem__(self, h: str) -> Path:
        return self.base / self.names[h]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def manifest(project_dir: Path, source: Path, *, mount: str) -> tuple[Manifest, Holders]:
    """``source``'s manifest, and for each content hash one file that holds it; a file source's manifest is its
    one name. UsageError (exit 2) naming the mount when the source is missing, neither a directory nor a regular
    file, or holds what cannot be sent (see :func:`nodekit.launcher.datasync.scan.source_files`)."""
    if source.is_file():  # a link to a file is sent as the file, as inside a directory
        return _manifest(project_dir, source, source.parent, [(source.name, source.stat())])
    if not source.is_dir():
        what = "does not exist" if not source.exists() else "is neither a directory nor a regular file"
        raise UsageError(
            f"[[mounts]] {mount}: source {source} {what}",
            fix="point source at the dataset's directory or file (relative to the project, or absolute)",
        )
    files, problems = source_files(str(source))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"[[mounts]] {mount}: source {source}: {problems[0]}{more}",
                         fix="make it a regular file inside the source (cp -L), or remove it")  # fmt: skip
    return _manifest(project_dir, source, source, files)


def _manifest(
    project_dir: Path, source: Path, base: Path, files: list[tuple[str, os.stat_result]]
) -> tuple[Manifest, Holders]:
    """The manifest of ``files`` (names under ``base``) through ``source``'s hash cache."""
    cache_file = _cache_file(project_dir, source)
    old = _load(cache_file)
    entries, cache = hashed(str(base), files, old)
    if cache != old:  # a no-change push of 100,000 files writes no cache
        _save(cache_file, cache)
    names: dict[str, str] = {}
    for name, (_, h) in entries.items():
        names.setdefault(h, name)
    return entries, Holders(base, names)
