"""The wheelhouse (``<project>/.nodekit/wheelhouse``): a cache of exactly the locked wheels, hash-verified.

Missing wheels are fetched with ``pip download --no-deps --require-hashes`` (the host's pip configuration
applies); the image installs from the staged copy with ``--no-index``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from nodekit.errors import BuildError
from nodekit.fsutil import write_atomic
from nodekit.lock import pip as pipcmd
from nodekit.lock.format import LOCK_FIX, Lock, LockedPackage
from nodekit.lock.resolution import sources
from nodekit.progress import Reporter
from nodekit.settings import Settings

WHEELHOUSE = Path(".nodekit") / "wheelhouse"
_INDEX = ".index.json"


def wheelhouse_dir(settings: Settings) -> Path:
    return settings.project_dir / WHEELHOUSE


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _scan(wheelhouse: Path, index: dict[str, list[Any]]) -> dict[tuple[str, str], list[tuple[Path, str]]]:
    """Wheels by (name, version), each with its sha256; hashes are cached by (size, mtime, inode)."""
    found: dict[tuple[str, str], list[tuple[Path, str]]] = {}
    seen = set()
    for path in sorted(wheelhouse.glob("*.whl")):
        try:
            name, version, _build, _tags = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        cached = index.get(path.name)
        if cached and cached[:3] == key:
            digest = str(cached[3])
        else:
            digest = sha256_file(path)
            index[path.name] = [*key, digest]
        seen.add(path.name)
        found.setdefault((str(name), str(version)), []).append((path, digest))
    for stale in set(index) - seen:
        del index[stale]
    return found


def _match(
    lock: Lock, found: Mapping[tuple[str, str], list[tuple[Path, str]]]
) -> tuple[dict[str, Path], list[LockedPackage]]:
    wheels: dict[str, Path] = {}
    missing = []
    for pkg in lock.packages:
        candidates = found.get((pkg.name, str(Version(pkg.version))), [])
        hit = next((p for p, d in candidates if d in pkg.hashes), None)
        if hit is None:
            missing.append(pkg)
        else:
            wheels[pkg.name] = hit
    return wheels, missing


def _download(settings: Settings, lock: Lock, missing: list[LockedPackage], house: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="nodekit-wheels-") as tmp:
        req = Path(tmp) / "missing.txt"
        req.write_text("".join(p.line() + "\n" for p in missing))
        argv = pipcmd.download_argv(
            sys.executable,
            req,
            house,
            python_version=lock.python_version,
            platform=lock.platform,
            sources=sources(settings),
        )
        proc = pipcmd.run(
            argv,
            what="pip downloading the locked wheels",
            fix="check access to your package index (pip config, proxy), then build again",
        )
    if proc.returncode != 0:
        raise BuildError(
            f"cannot fetch locked wheels ({', '.join(p.name for p in missing)}): "
            f"{pipcmd.redact(pipcmd.pip_error(proc.stderr))}",
            fix="check access to your package index (pip config), or nodekit lock",
        )


def ensure_wheelhouse(settings: Settings, lock: Lock, reporter: Reporter) -> dict[str, Path]:
    """Every locked wheel, present and hash-verified in the wheelhouse: package name -> wheel file.

    Missing wheels are downloaded with ``pip download --no-deps --require-hashes`` (the host's pip configuration
    applies). Raises BuildError when pip cannot provide one.
    """
    house = wheelhouse_dir(settings)
    house.mkdir(parents=True, exist_ok=True)
    index_path = house / _INDEX
    try:
        index: dict[str, list[Any]] = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    wheels, missing = _match(lock, _scan(house, index))
    if missing:
        reporter.step(f"fetching {len(missing)} wheel(s) into {house}")
        _download(settings, lock, missing, house)
        wheels, missing = _match(lock, _scan(house, index))
        if missing:
            raise BuildError(
                f"pip fetched no wheel matching the lock's hash for {', '.join(p.name for p in missing)}",
                fix=LOCK_FIX,
            )
        reporter.done(f"wheelhouse complete: {len(wheels)} wheels")
    write_atomic(index_path, json.dumps(index, indent=1, sort_keys=True))
    return wheels
