"""A wheel cache that outlives the clone, for the tests and benchmarks of the CUDA stack (about 3 GB of wheels).

CI runs a fresh clone each time, on a machine whose Docker engine (and so the base image) and apt cache of the
engine's .debs (/var/cache/nodekit-engine) persist between runs. The locked wheels of the big examples are kept the
same way, outside the clone: in ``/var/cache/nodekit-wheels`` (``NODEKIT_WHEEL_CACHE`` moves it), one flat
directory of wheel files, shared by every project. A project's wheelhouse (``.nodekit/wheelhouse``) is filled from
it before a build (hard links: no copy, no download) with the wheels its lock names, and the wheels the build had to
fetch are put back afterwards. ``nodekit build`` still checks every wheel against the lock's sha256, so a damaged
cache entry is fetched again, never installed.

Not part of nodekit: a user's machine keeps its wheelhouse in the project (or sets pip's find-links to a cache).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from nodekit.lock import WHEELHOUSE, parse_lock

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


def prefill(project: Path, cache: Path = CACHE) -> int:
    """Link every cached wheel that ``project``'s lock pins into its wheelhouse; returns how many were linked."""
    if not cache.is_dir():
        return 0
    pins = _pins(project)
    python = next(iter(pins))[2] if pins else ""
    house = project / WHEELHOUSE
    house.mkdir(parents=True, exist_ok=True)
    n = 0
    for wheel in sorted(cache.glob("*.whl")):
        if _key(wheel, python) in pins and not (house / wheel.name).exists():
            _link(wheel, house / wheel.name)
            n += 1
    return n


def keep(project: Path, cache: Path = CACHE) -> int:
    """Put the wheels of ``project``'s wheelhouse that the cache lacks into it (when it can be written); returns
    how many. Only locked wheels: the wheelhouse was verified against the lock by the build that used it."""
    house = project / WHEELHOUSE
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return 0
    if not os.access(cache, os.W_OK) or not house.is_dir():
        return 0
    pins = _pins(project)
    python = next(iter(pins))[2] if pins else ""
    n = 0
    for wheel in sorted(house.glob("*.whl")):
        if _key(wheel, python) in pins and not (cache / wheel.name).exists():
            _link(wheel, cache / wheel.name)
            n += 1
    return n
