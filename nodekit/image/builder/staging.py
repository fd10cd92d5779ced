"""Staging the build contexts under ``<project>/.nodekit/build/`` (wheels, code, launcher), one build at a
time per project."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.image.builder.planning import STAGE_DIR, plan_for
from nodekit.image.lock import Lock, ensure_wheelhouse
from nodekit.image.plan import (
    CUDA_LIBS_LOCK,
    CUDA_LIBS_PACKAGE,
    FRAMEWORK_LOCK,
    FRAMEWORK_PACKAGE,
    PACKAGES_LOCK,
    STAGE_CUDA_LIBS,
    STAGE_FRAMEWORK,
    STAGE_WHEELS,
    BuildPlan,
    split_lock,
)
from nodekit.image.probe import WheelTarget
from nodekit.system.files import write_atomic
from nodekit.system.progress import Reporter


def _fresh(path: Path) -> Path:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # another file system, or no hard links there
        shutil.copy2(src, dest)


def _sync_wheels(wheel_dir: Path, wheels: Mapping[str, Path], files: Mapping[str, str]) -> None:
    """Make ``wheel_dir`` hold exactly ``wheels`` and the text ``files`` (name -> content), touching nothing that
    is already right."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in wheels.values()}
    for present in wheel_dir.iterdir():
        if present.name not in files and (present.name not in wanted or not present.samefile(wanted[present.name])):
            present.unlink()
    for name, src in wanted.items():
        if not (wheel_dir / name).exists():
            # Hard links: wheels are immutable, and pip checks their hashes again inside the build.
            _link_or_copy(src, wheel_dir / name)
    for name, text in files.items():
        path = wheel_dir / name
        if not path.is_file() or path.read_text() != text:
            write_atomic(path, text)  # never through a link (config refuses one in .nodekit/build/ itself)


def _stage_wheels(root: Path, wheels: Mapping[str, Path], lock: Lock) -> None:
    """The three wheel contexts, one per layer (see :func:`nodekit.image.plan.split_lock`): the CUDA libraries'
    wheels (nvidia-*, cuda-*), the framework's (torch and its companions), each with its own lock file, so that a
    layer's cache key depends on its wheels alone; and the other packages' wheels with the whole lock."""
    layers = split_lock(lock.text())
    cuda = {n: w for n, w in wheels.items() if CUDA_LIBS_PACKAGE.match(f"{n}==")}
    framework = {n: w for n, w in wheels.items() if FRAMEWORK_PACKAGE.match(f"{n}==")}
    others = {n: w for n, w in wheels.items() if n not in framework and n not in cuda}
    _sync_wheels(root / STAGE_CUDA_LIBS, cuda, {CUDA_LIBS_LOCK: layers.cuda_libs})
    _sync_wheels(root / STAGE_FRAMEWORK, framework, {FRAMEWORK_LOCK: layers.framework})
    _sync_wheels(root / STAGE_WHEELS, others, {"nodekit.lock": lock.text(), PACKAGES_LOCK: layers.packages})


def stage_contexts(
    settings: Settings, lock: Lock, base_id: str, tgt: WheelTarget, reporter: Reporter, *, no_cache: bool
) -> BuildPlan:
    """Stage the contexts (code and launcher copied and hashed at once) and return the plan for exactly them."""
    wheels = ensure_wheelhouse(settings, lock, reporter)
    reporter.step("staging build contexts")
    root = settings.project_dir / STAGE_DIR
    _stage_wheels(root, wheels, lock)
    tmp = _fresh(root / ".staging")
    staged = plan_for(settings, lock, base_id, tgt, no_cache=no_cache, stage=tmp)
    final = staged.context.parent
    # Only the current staging directory is kept; earlier ones are the contexts of earlier builds.
    for old in root.iterdir():
        if old.is_dir() and re.fullmatch(r"[0-9a-f]{12}", old.name):
            shutil.rmtree(old)
    tmp.rename(final)
    return staged


@contextlib.contextmanager
def build_lock(project_dir: Path, reporter: Reporter) -> Iterator[None]:
    """One build of a project at a time: staging replaces ``.nodekit/build/`` (and removes earlier contexts), so
    a second build running at once would delete the context the first is sending to BuildKit. The second waits.
    An flock: released by the kernel when the holder dies, so a killed build never leaves it stuck."""
    import fcntl

    path = project_dir / ".nodekit" / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            reporter.step("another build of this project is running here; waiting for it to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
