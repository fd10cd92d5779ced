"""``nodekit.lock``: the image's Python packages, resolved for the image's Python and platform, hash-pinned.

The lock is a pip requirements file, one ``name==version --hash=sha256:...`` line per package, sorted, after a
header recording what it was resolved from (the input requirements, the Python version, the wheel platform), so
drift between ``nodekit.toml`` and the lock is detected instead of built.

Resolution runs the host's pip as ``pip install --dry-run --report`` with ``--platform/--python-version/--abi``:
pip (rather than uv) because it is already on every host that has nodekit, it honours the user's pip
configuration (find-links, mirrors, credentials) unchanged, and its report carries every wheel's sha256, so
nothing is downloaded to lock. Re-locking prefers the previous pins (passed as constraints), so changing one
package changes only that package's lines unless the new requirement forces its dependencies to move.

The wheelhouse (``<project>/.nodekit/wheelhouse``) is a cache of the locked wheels, refilled from the lock with
``pip download --no-deps --require-hashes`` when files are missing; the image installs from it with
``--no-index``.

The package, by responsibility:

- :mod:`~nodekit.image.lock.format`: the lock file (models, exact text, parsing, drift and diffs), pure
- :mod:`~nodekit.image.lock.pip`: the pip commands as data, and the one place that runs them
- :mod:`~nodekit.image.lock.resolution`: resolution from pip's dry-run report
- :mod:`~nodekit.image.lock.project`: the project's lock file: check, lock, ensure
- :mod:`~nodekit.image.lock.wheelhouse`: the wheel cache the image is built from
"""

from __future__ import annotations

from nodekit.image.lock.format import (
    LOCK_FILE,
    LOCK_FIX,
    BuiltWheel,
    Lock,
    LockDiff,
    LockedPackage,
    LockResult,
    diff_locks,
    normalize_inputs,
    parse_lock,
    target_environment,
    unsatisfied,
)
from nodekit.image.lock.pip import (
    PIP_RUNNER,
    compatible_platforms,
    download_argv,
    redact,
    resolve_argv,
    source_options,
    sources,
    target_options,
)
from nodekit.image.lock.project import check_lock, ensure_lock, inputs_drifted, lock, lock_path, read_lock
from nodekit.image.lock.resolution import base_conflicts, read_report, resolve, stub_wheel
from nodekit.image.lock.wheelhouse import WHEELHOUSE, ensure_wheelhouse, wheelhouse_dir

__all__ = [
    "LOCK_FILE",
    "LOCK_FIX",
    "PIP_RUNNER",
    "WHEELHOUSE",
    "BuiltWheel",
    "Lock",
    "LockDiff",
    "LockResult",
    "LockedPackage",
    "base_conflicts",
    "check_lock",
    "compatible_platforms",
    "diff_locks",
    "download_argv",
    "ensure_lock",
    "ensure_wheelhouse",
    "inputs_drifted",
    "lock",
    "lock_path",
    "normalize_inputs",
    "parse_lock",
    "read_lock",
    "read_report",
    "redact",
    "resolve",
    "resolve_argv",
    "source_options",
    "sources",
    "stub_wheel",
    "target_environment",
    "target_options",
    "unsatisfied",
    "wheelhouse_dir",
]
