"""The build plan for the project as it is now, and the fingerprint an image of it would have (pure apart
from reading files and the base image id; see :mod:`nodekit.image.plan`)."""

from __future__ import annotations

from pathlib import Path

from nodekit import __version__
from nodekit.config.settings import Settings
from nodekit.errors import ConfigError, ImageError, NodekitError
from nodekit.image.builder.tree import code_rules, hash_tree, launcher_tree
from nodekit.image.lock import Lock, check_lock, ensure_lock, inputs_drifted
from nodekit.image.plan import STAGE_CODE, STAGE_DOCKERFILE, STAGE_LAUNCHER, BuildPlan, plan_build
from nodekit.image.probe import WheelTarget
from nodekit.image.probe import target as probe_target
from nodekit.system import docker
from nodekit.system.assets import images_dir
from nodekit.system.progress import Reporter

STAGE_DIR = Path(".nodekit") / "build"


def dockerfile_text() -> str:
    return (images_dir() / "Dockerfile").read_text()


def plan_for(
    settings: Settings, lock: Lock, base_id: str, tgt: WheelTarget, *, no_cache: bool, stage: Path | None
) -> BuildPlan:
    stage_dir = settings.project_dir / STAGE_DIR
    text = dockerfile_text()
    if stage:
        stage.mkdir(parents=True, exist_ok=True)
        (stage / STAGE_DOCKERFILE).write_text(text)
    return plan_build(
        name=settings.image_name,
        base_image=settings.base_image,
        base_id=base_id,
        lock_text=lock.text(),
        torch=lock.torch_version,
        packages=len(lock.packages),
        python=tgt.python_version,
        dockerfile_text=text,
        launcher=launcher_tree(stage / STAGE_LAUNCHER if stage else None),
        code=hash_tree(settings.project_dir, code_rules(settings), stage=stage / STAGE_CODE if stage else None),
        stage_dir=stage_dir,
        version=__version__,
        no_cache=no_cache,
        base_python=tgt.stack.python if tgt.stack else "python3",
        base_site=tgt.stack.site if tgt.stack else (),
    )


def plan(settings: Settings, reporter: Reporter, *, no_cache: bool = False) -> BuildPlan:
    """The build plan for the project as it is now (reads files and the base image id; writes nothing)."""
    base = require_base(settings)
    tgt = probe_target(settings, require_probe=True)
    lock, _ = ensure_lock(settings, reporter, dry_run=True, target=tgt)
    return plan_for(settings, lock, base.identity, tgt, no_cache=no_cache, stage=None)


def require_base(settings: Settings) -> docker.ImageInfo:
    base = docker.image_info(settings.base_image)
    if base is None:
        raise ImageError(
            f"base image {settings.base_image} is not in the local Docker engine, and nodekit does not pull "
            "blindly (no registry may be reachable)",
            fix="nodekit base (creates a minimal Debian base), or docker load the base you use",
        )
    return base


def project_fingerprint(settings: Settings, *, cached_only: bool = False) -> tuple[str | None, str]:
    """The fingerprint an image of the project as it is now would have, without resolving or building anything:
    ``(fingerprint, "")``, or ``(None, why it cannot be known here)`` (no usable lock, no base image; with
    ``cached_only``, a dry run's, also a base never probed here: no probe container is started)."""
    # On the path of every `nodekit up`: the base is inspected once, for the lock check's target and the probe
    # (cached by the base's image id), instead of twice each.
    base = docker.image_info(settings.base_image)
    try:
        lock = check_lock(settings, base=base)
    except ConfigError as e:
        return None, e.message
    if inputs_drifted(lock, settings):
        return None, "nodekit.lock was made from other packages than nodekit.toml lists"
    if base is None:
        return None, f"base image {settings.base_image} is not here"
    try:
        tgt = probe_target(settings, require_probe=True, base=base, cached_only=cached_only)  # cached by image id
    except NodekitError as e:
        return None, e.message
    return plan_for(settings, lock, base.identity, tgt, no_cache=False, stage=None).fingerprint, ""
