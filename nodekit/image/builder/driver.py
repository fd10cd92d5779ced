"""``nodekit build``: lock, fingerprint, then build with BuildKit only when the stack changed.

Order: engine, base image, lock, plan (pure, :mod:`nodekit.image.plan`); if an image tagged with the
fingerprint exists the build is a no-op; otherwise the wheelhouse is completed, the three build contexts are
staged under ``<project>/.nodekit/build/`` and ``docker buildx build`` runs; the code layer and the labels are
appended by nodekit itself (:mod:`nodekit.image.append`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image.builder.planning import STAGE_DIR, plan_for, require_base
from nodekit.image.builder.record import BuildResult, build_result, human_size, write_record
from nodekit.image.builder.staging import build_lock, stage_contexts
from nodekit.image.lock import ensure_lock
from nodekit.image.plan import LABEL_FINGERPRINT, SOURCE_DATE_EPOCH, STAGE_CODE, BuildPlan
from nodekit.image.probe import target as probe_target
from nodekit.launcher.contract import Env
from nodekit.system import docker
from nodekit.system.progress import Reporter

ENV_STAGE = "env"  # images/Dockerfile's stage that BuildKit builds; nodekit writes the last one

_STEP = re.compile(r"^#(\d+) (\[(?!internal)[^\]]*\d+/\d+\] .*)$")


def build(settings: Settings, reporter: Reporter, *, dry_run: bool = False, no_cache: bool = False) -> BuildResult:
    """Build the project's image, or do nothing when an image with the same fingerprint exists.

    Raises EngineError (no engine), ImageError (base image missing: fix ``nodekit base``), ConfigError (lock does
    not match the config: fix ``nodekit lock``), BuildError (the build failed). With no lock file the lock is
    created first. ``dry_run`` returns the plan and changes nothing (a missing lock is resolved, not written).
    """
    t0 = time.monotonic()
    reporter.step("checking the Docker engine and the base image")
    docker.check_engine()
    base = require_base(settings)
    reporter.step(f"probing the base image {settings.base_image}")
    tgt = probe_target(settings, require_probe=True)
    if tgt.stack is not None:
        reporter.detail(f"base: {tgt.stack.describe()}")
    lock, created = ensure_lock(settings, reporter, dry_run=dry_run, target=tgt)
    reporter.step("fingerprinting the stack")
    planned = plan_for(settings, lock, base.id, tgt, no_cache=no_cache, stage=None)
    if dry_run:
        reporter.done(f"would build {planned.tag}")
        return build_result(planned, None, t0, skipped=False, dry_run=True, created=created)
    existing = docker.image_info(planned.tag)
    if existing is not None and existing.labels.get(LABEL_FINGERPRINT) == planned.fingerprint and not no_cache:
        if _in_store(settings, existing.id):
            result = build_result(planned, existing, t0, skipped=True, created=created)
            write_record(settings, result)
            reporter.done(f"{planned.tag} is up to date: nothing changed since it was built")
            return result
        # A fresh checkout on a machine that has the image, or a pruned store: built again (BuildKit's cache makes
        # that quick, the result is the same image id), so that pushes of it need no docker save.
        reporter.detail(f"{planned.tag} exists, but this project's blob store lacks its code layer: writing it")
    with build_lock(settings.project_dir, reporter):
        staged = stage_contexts(settings, lock, base.id, tgt, reporter, no_cache=no_cache)
        if staged.fingerprint != planned.fingerprint:
            reporter.warn("files changed while staging; building what was staged")
        reporter.step(f"building {staged.tag}")
        _run_build(staged, reporter, settings.project_dir / STAGE_DIR / "metadata.json")
        info = _append_code(staged, settings, reporter)
    result = build_result(staged, info, t0, skipped=False, created=created)
    write_record(settings, result)
    reporter.done(f"built {staged.tag} ({human_size(info.size)}) in {result.seconds:.1f} s")
    return result


def _in_store(settings: Settings, image_id: str) -> bool:
    """Whether the project's blob store holds the config of ``image_id`` (``nodekit build`` wrote it beside the
    code layer, under the image id it loaded)."""
    from nodekit.image.blobs import BlobStore

    return BlobStore.of_project(settings.project_dir).has(image_id)


def env_tag(plan: BuildPlan) -> str:
    """Where BuildKit's part of the image (every stage but the last, see images/Dockerfile) is kept: one tag per
    project, moved by every build; the final images hold its layers whether or not it is tagged."""
    return f"nodekit/{plan.name}:env"


def _run_build(plan: BuildPlan, reporter: Reporter, metadata: Path) -> None:
    seen: set[str] = set()
    for line in docker.buildx_build(
        plan.context,
        dockerfile=plan.dockerfile,
        tag=env_tag(plan),
        target=ENV_STAGE,
        build_contexts=dict(plan.build_contexts),
        build_args=dict(plan.build_args),
        metadata_file=metadata,
        no_cache=plan.no_cache,
    ):
        m = _STEP.match(line)
        if m and m[1] not in seen:
            seen.add(m[1])
            reporter.step(m[2])
        reporter.detail(line)


def _append_code(plan: BuildPlan, settings: Settings, reporter: Reporter) -> docker.ImageInfo:
    """The Dockerfile's last stage, written here (see :mod:`nodekit.image.append`): the staged code as one layer on the
    environment image BuildKit just made, plus the labels; loaded into the local engine as ``plan.tag``. The layer
    and the config stay in the project's blob store, so a push of this image to a node that has the environment
    sends them without a ``docker save``. Returns the loaded image; ImageError when the engine loaded something
    else.
    """
    from nodekit.image import append
    from nodekit.image.blobs import BlobStore

    code = dict(plan.build_contexts)[STAGE_CODE]
    reporter.step(f"adding the code layer ({plan.code_files} files) and the labels")
    env = env_tag(plan)
    base = docker.image_config(env)
    history = docker.image_history(env)
    store = BlobStore.of_project(settings.project_dir)
    diff_id, size = store.put(lambda f: append.write_code_layer(code, f, mtime=SOURCE_DATE_EPOCH))
    config = append.appended_config(
        base,
        history,
        diff_id,
        labels=dict(plan.labels),
        env={Env.FINGERPRINT: plan.fingerprint},
        created=append.created_at(SOURCE_DATE_EPOCH),
        created_by=f"COPY . /{append.CODE_ROOT}/ and LABEL org.nodekit.* (written by nodekit build)",
    )
    image_id = store.put_bytes(config)
    sink = docker.LoadSink()
    try:
        for chunk in append.archive(config, image_id, plan.tag, {diff_id: store.path(diff_id)}):
            sink.write(chunk)
        sink.finish()
    except BaseException:
        sink.abort()
        raise
    got = docker.image_info(plan.tag)
    if got is None or got.id != image_id:
        raise ImageError(
            f"the engine loaded {plan.tag} as {got.id if got else 'nothing'}, not {image_id} as written",
            fix="nodekit build --no-cache; if it repeats, report it with `docker version`",
        )
    store.prune(keep=frozenset({diff_id, image_id}))
    reporter.detail(f"code layer {diff_id[7:19]} ({human_size(size)}), image {image_id[7:19]}")
    return got
