"""A wheel cache that outlives the clone, for the tests and benchmarks of the CUDA stack (about 3 GB of wheels).

CI runs a fresh clone each time, on a machine whose Docker engine (and so the base image) and apt cache of the
engine's .debs (/var/cache/nodekit-engine) persist between runs. The locked wheels of the big examples are kept the
same way, outside the clone: in ``/var/cache/nodekit-wheels`` (``NODEKIT_WHEEL_CACHE`` moves it), one flat
directory of wheel files, shared by every project. A project's wheelhouse (``.nodekit/wheelhouse``) is filled from
it before a build (hard links: no copy, no download) with the wheels its lock names, and the wheels the build had to
fetch are put back afterwards. ``nodekit build`` still checks every wheel against the lock's sha256, so a damaged
cache entry is fetched again, never installed.

The project's blob store (``.nodekit/blobs``: every layer above the base, configs and manifests nodekit wrote, and
its small indexes) is kept beside the wheels, in ``<cache>/blobs``, for the same reason: a fresh checkout then finds
every unchanged package layer there and builds none of them again (BuildKit runs only for a layer whose inputs
changed), whichever engine and image store it builds on. Blobs are content-addressed and verified on every read,
so a stale or damaged one is never used.

Not part of nodekit: a user's machine keeps its wheelhouse in the project (or sets pip's find-links to a cache).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from nodekit.image.blobs import BLOBS
from nodekit.image.lock import WHEELHOUSE, parse_lock

CACHE = Path(os.environ.get("NODEKIT_WHEEL_CACHE", "/var/cache/nodekit-wheels"))


def _pins(project: Path) -> set[tuple[str, str, str]]:
    """(name, version, python) of every locked package: the cache holds wheels of several Pythons (cp311 and
    cp313 torch share name and version), and only the lock's own are linked."""
    lock = parse_lock((project / "nodekit.lock").read_text())
    python = "cp" + lock.python_version.replace(".", "")
    return {(p.name, str(Version(p.version)), python) for p in lock.packages}


def _key(path: Path, python: str) -> tuple[str, str, str] | None:
    """The wheel's (name, version, python) when it installs on CPython ``python`` (``cp311``), else None."""
    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    if not any(t.interpreter == python or t.interpreter.startswith("py") for t in tags):
        return None
    return canonicalize_name(name), str(version), python


def _link(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.part")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:  # another file system
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def _link_missing(files: list[Path], dest: Path, *, best_effort: bool = False) -> int:
    """Link each of ``files`` into the folder ``dest`` where it lacks one by that name; returns how many were linked.
    ``best_effort`` (writing into the cache): stop at the first file it cannot write, as a read-only cache is not an
    error; a project's own wheelhouse or store that cannot be written is."""
    n = 0
    try:
        if files:
            dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            if not (dest / f.name).exists():
                _link(f, dest / f.name)
                n += 1
    except OSError:
        if not best_effort:
            raise
    return n


def _locked_wheels(project: Path, folder: Path) -> list[Path]:
    """The wheels in ``folder`` that ``project``'s lock pins (for its Python)."""
    pins = _pins(project)
    python = next(iter(pins))[2] if pins else ""
    return [w for w in sorted(folder.glob("*.whl")) if _key(w, python) in pins]


BLOB_FOLDERS = ("sha256", "layers", "images", "bases")
"""The blob store's folders: the blobs, and the indexes of package layers, images and base layers."""


def _blob_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*") if p.is_file() and len(p.name) == 64)


def prefill(project: Path, cache: Path = CACHE) -> int:
    """Link every cached wheel that ``project``'s lock pins into its wheelhouse; returns how many were linked."""
    return _link_missing(_locked_wheels(project, cache), project / WHEELHOUSE) if cache.is_dir() else 0


def prefill_blobs(project: Path, cache: Path = CACHE) -> int:
    """Link the kept blobs and indexes into ``project``'s blob store; returns how many were linked."""
    return sum(_link_missing(_blob_files(cache / "blobs" / f), project / BLOBS / f) for f in BLOB_FOLDERS)


def keep(project: Path, cache: Path = CACHE) -> int:
    """Put the wheels of ``project``'s wheelhouse that the cache lacks into it (when it can be written); returns
    how many. Only locked wheels: the wheelhouse was verified against the lock by the build that used it."""
    house = project / WHEELHOUSE
    if not house.is_dir() or (cache.is_dir() and not os.access(cache, os.W_OK)):
        return 0
    return _link_missing(_locked_wheels(project, house), cache, best_effort=True)


def keep_blobs(project: Path, cache: Path = CACHE) -> int:
    """Put ``project``'s blobs and indexes that the cache lacks into it; returns how many."""
    return sum(
        _link_missing(_blob_files(project / BLOBS / f), cache / "blobs" / f, best_effort=True) for f in BLOB_FOLDERS
    )


def warm(project: Path, cache: Path = CACHE) -> None:
    """Before a test's build: the project's locked wheels and the kept blobs, from the cache."""
    prefill(project, cache)
    prefill_blobs(project, cache)


def kept(project: Path, cache: Path = CACHE) -> None:
    """After a test's build: what it fetched and wrote, into the cache for the next run."""
    keep(project, cache)
    keep_blobs(project, cache)
