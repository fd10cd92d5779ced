"""The wheelhouse (``<project>/.nodekit/wheelhouse``): a cache of exactly the locked wheels, hash-verified.

Missing wheels are fetched with ``pip download --no-deps --require-hashes`` (the host's pip configuration
applies); the image installs from the staged copy with ``--no-index``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from nodekit.config.settings import Settings
from nodekit.errors import BuildError, ConfigError
from nodekit.image.lock import pip as pipcmd
from nodekit.image.lock.format import LOCK_FIX, Lock, LockedPackage
from nodekit.image.lock.sdist import Builder
from nodekit.launcher.datacheck.filehash import file_sha256
from nodekit.system.files import write_atomic
from nodekit.system.progress import Reporter

WHEELHOUSE = Path(".nodekit") / "wheelhouse"
_INDEX = ".index.json"


def wheelhouse_dir(settings: Settings) -> Path:
    return settings.project_dir / WHEELHOUSE


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
            digest = file_sha256(path)
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


def find_wheel(house: Path, pkg: LockedPackage) -> Path | None:
    """The wheel in ``house`` that ``pkg`` pins (name, version and hash), if there is one."""
    found = _scan(house, {}) if house.is_dir() else {}
    return _match(Lock(python_version="", platform="", inputs=(), packages=(pkg,)), found)[0].get(pkg.name)


def _rebuild(settings: Settings, lock: Lock, pkg: LockedPackage, house: Path) -> None:
    """Build ``pkg``'s wheel again from the source distribution and backend the lock records; the bytes must
    hash to the lock's pin, or the build is not reproducible here and the wheel is not kept."""
    record = lock.built_from(pkg.name)
    assert record is not None
    where = f"Python {lock.python_version} on {lock.platform}"
    with tempfile.TemporaryDirectory(prefix="nodekit-rebuild-", dir=house) as tmp:
        try:
            wheel, _ = Builder(pipcmd.sources(settings), where).build(
                pkg.name, pkg.version, record.sdist_sha256, Path(tmp), record.backend
            )
        except ConfigError as e:
            raise BuildError(e.message, fix=e.fix) from None
        got = file_sha256(wheel)
        if got not in pkg.hashes:
            raise BuildError(
                f"{pkg.name} {pkg.version} built again from its source distribution (with "
                f"{' '.join(record.backend) or 'no build requirements'}) hashes to {got}, the lock pins "
                f"{pkg.hashes[0]}: the build is not reproducible on this host",
                fix="nodekit lock (builds it here and locks that hash), then commit nodekit.lock",
            )
        wheel.replace(house / wheel.name)


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
            sources=pipcmd.sources(settings),
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
    applies); those the lock built from source are built again and must give the locked bytes. Raises BuildError
    when pip cannot provide one.
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
        built = [p for p in missing if lock.built_from(p.name) is not None]
        fetch = [p for p in missing if p not in built]
        if fetch:
            reporter.step(f"fetching {len(fetch)} wheel(s) into {house}")
            _download(settings, lock, fetch, house)
        for pkg in built:
            reporter.step(f"building {pkg.name} {pkg.version} again from its source distribution")
            _rebuild(settings, lock, pkg, house)
        wheels, missing = _match(lock, _scan(house, index))
        if missing:
            raise BuildError(
                f"pip fetched no wheel matching the lock's hash for {', '.join(p.name for p in missing)}",
                fix=LOCK_FIX,
            )
        reporter.done(f"wheelhouse complete: {len(wheels)} wheels")
    write_atomic(index_path, json.dumps(index, indent=1, sort_keys=True))
    return wheels
