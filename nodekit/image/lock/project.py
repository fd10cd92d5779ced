"""The project's lock file: read it, check it against the config and the image, (re)write it.

``lock`` is ``nodekit lock``; ``ensure_lock`` and ``check_lock`` are what ``nodekit build`` and ``up`` use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nodekit.config.settings import Settings
from nodekit.errors import ConfigError
from nodekit.image.lock.format import (
    LOCK_FILE,
    LOCK_FIX,
    Lock,
    LockResult,
    diff_locks,
    normalize_inputs,
    parse_lock,
    unsatisfied,
)
from nodekit.image.lock.resolution import resolve
from nodekit.image.probe import INSPECT
from nodekit.system.files import write_atomic
from nodekit.system.progress import Reporter

if TYPE_CHECKING:
    from nodekit.image.probe import BaseGiven, WheelTarget


def lock_path(settings: Settings) -> Path:
    """``nodekit.lock`` next to ``nodekit.toml``."""
    return settings.project_dir / LOCK_FILE


def read_lock(settings: Settings) -> Lock | None:
    """The project's lock, or None when there is no lock file."""
    path = lock_path(settings)
    if not path.is_file():
        return None
    return parse_lock(path.read_text(), source=str(path))


def _target(settings: Settings, target: WheelTarget | None, base: BaseGiven = INSPECT) -> WheelTarget:
    from nodekit.image.probe import target as probe_target

    return target if target is not None else probe_target(settings, base=base)


def check_lock(settings: Settings, target: WheelTarget | None = None, *, base: BaseGiven = INSPECT) -> Lock:
    """The lock, when it exists, was resolved for this image's Python and platform (``target``, by default
    probed from the base: ``base`` as for :func:`nodekit.image.probe.probe_base`), still matches what the base provides,
    and satisfies the config.

    Raises ConfigError (fix: ``nodekit lock``) otherwise. A lock whose recorded inputs differ from the config
    but that still satisfies it passes; see :func:`inputs_drifted`.
    """
    path = lock_path(settings)
    lock = read_lock(settings)
    if lock is None:
        raise ConfigError(f"no {LOCK_FILE} next to {settings.project_dir / 'nodekit.toml'}", fix=LOCK_FIX)
    tgt = _target(settings, target, base)
    if (lock.python_version, lock.platform) != (tgt.python_version, tgt.wheel_platform):
        raise ConfigError(
            f"{path} was resolved for Python {lock.python_version} on {lock.platform}, the image has Python "
            f"{tgt.python_version} on {tgt.wheel_platform}",
            fix=LOCK_FIX,
        )
    if tgt.stack is not None:
        have = tgt.stack.provided()
        gone = [f"{n} {v}" for n, v in lock.provided_versions().items() if have.get(n) != v]
        if gone:
            raise ConfigError(
                f"{path} relies on the base image providing {gone[0]}, and base {settings.base_image} does not",
                fix=LOCK_FIX,
            )
    problems = unsatisfied(lock, settings.packages)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{path} does not match nodekit.toml: {problems[0]}{more}", fix=LOCK_FIX)
    return lock


def inputs_drifted(lock: Lock, settings: Settings) -> bool:
    """The config's packages differ from those the lock was made from (though the lock may still satisfy them)."""
    return sorted(lock.inputs) != sorted(normalize_inputs(settings.packages))


def lock(
    settings: Settings,
    reporter: Reporter,
    *,
    dry_run: bool = False,
    upgrade: bool = False,
    target: WheelTarget | None = None,
) -> LockResult:
    """``nodekit lock``: resolve ``settings.packages`` and write ``nodekit.lock`` (unless ``dry_run``).

    Keeps previous pins where possible (``upgrade`` resolves everything afresh). ``target`` (default: probed
    from the base) is the image's Python, platform and what its base provides. Raises ConfigError when a package
    cannot be resolved for the image's Python and platform.
    """
    path = lock_path(settings)
    previous = None
    try:
        previous = read_lock(settings)
    except ConfigError:
        reporter.warn(f"{path} is unreadable; resolving from scratch")
    normalize_inputs(settings.packages)  # a malformed requirement is named before the base is probed
    new, kept = resolve(
        settings, reporter, _target(settings, target), previous=previous, upgrade=upgrade, keep_built=not dry_run
    )
    diff = diff_locks(previous, new)
    unchanged = previous is not None and previous.text() == new.text() and path.read_text() == new.text()
    written = not dry_run and not unchanged
    if written:
        write_atomic(path, new.text(), within=settings.project_dir)
    what = "would write" if dry_run else ("wrote" if written else "kept")
    summary = ", ".join(
        f"{len(v)} {k}" for k, v in (("added", diff.added), ("removed", diff.removed), ("changed", diff.changed)) if v
    )
    detail = f"{summary}: " + "; ".join([*diff.changed, *diff.added, *diff.removed]) if summary else "no changes"
    reporter.done(f"{what} {path.name}: {len(new.packages)} packages, {detail}"[:300])
    return LockResult(path=path, lock=new, created=previous is None, written=written, diff=diff, kept_pins=kept)


def ensure_lock(
    settings: Settings, reporter: Reporter, *, dry_run: bool = False, target: WheelTarget | None = None
) -> tuple[Lock, bool]:
    """The checked lock; when there is no lock file yet, create it first (and say so). Returns (lock, created).

    With ``dry_run`` a missing lock is resolved but not written.
    """
    if not lock_path(settings).is_file():
        reporter.warn(f"no {LOCK_FILE} yet: creating it as nodekit lock would (commit it next to nodekit.toml)")
        return lock(settings, reporter, dry_run=dry_run, target=target).lock, True
    checked = check_lock(settings, target)
    if inputs_drifted(checked, settings):
        reporter.warn(
            f"nodekit.toml's packages changed since {LOCK_FILE} was made; it still satisfies them "
            "(nodekit lock refreshes it)"
        )
    return checked, False
