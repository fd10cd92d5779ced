"""``nodekit build``: lock, fingerprint, then build with BuildKit only when the stack changed.

Order: engine, base image, lock, plan (pure, :mod:`nodekit.render.image`); if an image tagged with the
fingerprint exists the build is a no-op; otherwise the wheelhouse is completed, the three build contexts are
staged under ``<project>/.nodekit/build/`` and ``docker buildx build`` runs. The staged trees are hashed while
they are copied, so the fingerprint describes exactly what BuildKit receives.

Also here: :func:`current_image` (what ``up``/``inspect`` use by default) and :func:`inspect_image`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from nodekit import __version__, docker
from nodekit.assets import images_dir, launcher_dir
from nodekit.errors import ConfigError, ImageError, NodekitError
from nodekit.fsutil import write_atomic
from nodekit.lock import Lock, check_lock, ensure_lock, ensure_wheelhouse, inputs_drifted, parse_lock
from nodekit.probe import DISTS_AND_TORCH, WheelTarget
from nodekit.probe import target as probe_target
from nodekit.progress import Reporter
from nodekit.render.image import (
    CUDA_LIBS_LOCK,
    CUDA_LIBS_PACKAGE,
    FRAMEWORK_LOCK,
    FRAMEWORK_PACKAGE,
    LABEL_BASE,
    LABEL_BASE_ID,
    LABEL_FINGERPRINT,
    LABEL_LOCK,
    LABEL_NAME,
    LABEL_PYTHON,
    LABEL_TORCH,
    LABEL_VERSION,
    PACKAGES_LOCK,
    SOURCE_DATE_EPOCH,
    STAGE_CODE,
    STAGE_CUDA_LIBS,
    STAGE_DOCKERFILE,
    STAGE_FRAMEWORK,
    STAGE_LAUNCHER,
    STAGE_WHEELS,
    BuildPlan,
    IgnoreRules,
    TreeEntry,
    ignore_rules,
    normal_mode,
    plan_build,
    split_lock,
)
from nodekit.settings import Settings

STAGE_DIR = Path(".nodekit") / "build"
ENV_STAGE = "env"  # images/Dockerfile's stage that BuildKit builds; nodekit writes the last one
LAST_BUILD = Path(".nodekit") / "last-build.json"
BUILD_FIX = "nodekit build"
_FROZEN = ConfigDict(frozen=True, extra="forbid")
_STEP = re.compile(r"^#(\d+) (\[(?!internal)[^\]]*\d+/\d+\] .*)$")


class BuildResult(BaseModel):
    """What :func:`build` did. ``skipped``: the image existed already; ``dry_run``: nothing was changed."""

    model_config = _FROZEN

    tag: str
    image_id: str
    fingerprint: str
    size: int
    seconds: float
    skipped: bool
    dry_run: bool = False
    lock_created: bool = False
    plan: BuildPlan

    def summary(self) -> str:
        if self.dry_run:
            return f"would build {self.tag}"
        verb = "up to date" if self.skipped else "built"
        return f"{verb}: {self.tag}  {human_size(self.size)}  in {self.seconds:.1f} s"

    def __str__(self) -> str:
        return self.plan.describe() if self.dry_run else self.summary()

    def __rich__(self) -> str:
        # rich would otherwise pretty-print the model's fields (pydantic defines __rich_repr__).
        return str(self)


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


# --- trees: walk, hash, stage -------------------------------------------------------------------------------


def _kind(st_mode: int) -> Literal["file", "link", "dir"] | None:
    if stat.S_ISLNK(st_mode):
        return "link"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    return None  # sockets, fifos, devices: Docker cannot ship them either


def _walk(root: Path, rules: IgnoreRules) -> list[tuple[str, Path, os.stat_result]]:
    """Included paths under ``root`` (relative, '/'-separated, sorted), with Docker's .dockerignore semantics."""
    found: list[tuple[str, Path, os.stat_result]] = []
    parents: set[str] = set()

    def visit(directory: Path, rel: str) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as e:
            raise ConfigError(
                f"cannot read {directory}: {e.strerror}", fix="fix its permissions, or .dockerignore it"
            ) from None
        for name in names:
            path = directory / name
            r = f"{rel}/{name}" if rel else name
            st = path.lstat()
            kind = _kind(st.st_mode)
            if kind is None:
                continue
            excluded = rules.excluded(r)
            if kind == "dir":
                if not excluded:
                    found.append((r, path, st))
                if not excluded or rules.may_include_below(r):
                    visit(path, r)
            elif not excluded:
                found.append((r, path, st))
                if "/" in r:
                    parents.add(r.rsplit("/", 1)[0])

    visit(root, "")
    # A file re-included by a `!` pattern inside an excluded directory still needs its parent directories.
    have = {r for r, _, _ in found}
    for p in sorted(parents):
        parts = p.split("/")
        for i in range(1, len(parts) + 1):
            anc = "/".join(parts[:i])
            if anc not in have:
                have.add(anc)
                apath = root / anc
                found.append((anc, apath, apath.lstat()))
    found.sort(key=lambda t: t[0])
    return found


def _hash_copy(src: Path, dest: Path | None) -> str:
    """sha256 of ``src``; with ``dest``, the bytes hashed are the bytes written (no race with an editor)."""
    h = hashlib.sha256()
    with src.open("rb") as f, dest.open("wb") if dest else contextlib.nullcontext() as out:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            if out is not None:
                out.write(chunk)
    return h.hexdigest()


def hash_tree(root: Path, rules: IgnoreRules, *, prefix: str = "", stage: Path | None = None) -> tuple[TreeEntry, ...]:
    """The tree under ``root`` as fingerprint entries, paths prefixed with ``prefix``.

    With ``stage``, the tree is also copied there, modes normalized and every mtime (``stage`` itself included)
    clamped to SOURCE_DATE_EPOCH, so the layer made from it is the same on every machine; the entries describe
    the copy.
    """
    entries = []
    dirs = [stage] if stage else []
    if stage:
        stage.mkdir(parents=True, exist_ok=True)
        stage.chmod(0o755)
    for rel, path, st in _walk(root, rules):
        kind = _kind(st.st_mode)
        assert kind is not None
        mode = normal_mode(kind, st.st_mode)
        target = stage / rel if stage else None
        if kind == "dir":
            digest, size = "", 0
            if target:
                target.mkdir(parents=True, exist_ok=True)
                target.chmod(mode)
                dirs.append(target)
        elif kind == "link":
            link = os.readlink(path)
            digest, size = hashlib.sha256(link.encode()).hexdigest(), 0
            if target:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(link, target)
                os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
        else:
            if target:
                target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = _hash_copy(path, target), st.st_size
            if target:
                target.chmod(mode)
                os.utime(target, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        entries.append(TreeEntry(path=f"{prefix}{rel}", kind=kind, mode=mode, digest=digest, size=size))
    _clamp_dirs(dirs)
    return tuple(entries)


def _clamp_dirs(dirs: list[Path]) -> None:
    # Deepest first: creating an entry touches its parent's mtime.
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        os.utime(d, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def _relative(settings: Settings, path: Path) -> str | None:
    try:
        return settings.resolve(path).resolve().relative_to(settings.project_dir.resolve()).as_posix()
    except ValueError:
        return None


def code_rules(settings: Settings) -> IgnoreRules:
    """nodekit's default exclusions, generated compose files and outputs, then the project's .dockerignore.

    What nodekit itself writes into the project never counts as code: a compose directory of its own is excluded
    whole, since even empty it would be a directory in the image and so change the fingerprint (``nodekit up`` on
    one node would make the image look stale to the next).
    """
    extra = []
    if (compose := _relative(settings, settings.compose_dir)) is not None:
        extra.append(compose if compose != "." else "node-*.yaml")
    if (outputs := _relative(settings, settings.output_dir)) not in (None, "."):
        extra.append(str(outputs))
    dockerignore = settings.project_dir / ".dockerignore"
    return ignore_rules(dockerignore.read_text() if dockerignore.is_file() else None, extra_excludes=extra)


_LAUNCHER_RULES = IgnoreRules(["**/__pycache__", "**/*.pyc", "**/*.pyo"])


def launcher_tree(stage: Path | None = None) -> tuple[TreeEntry, ...]:
    """nodekit/__init__.py and nodekit/launcher/, as shipped to /opt/nodekit/nodekit in the image."""
    init = launcher_dir().parent / "__init__.py"
    mode = normal_mode("file", init.stat().st_mode)
    sub = stage / "nodekit" / "launcher" if stage else None
    if stage and sub:
        sub.mkdir(parents=True, exist_ok=True)
    digest = _hash_copy(init, stage / "nodekit" / "__init__.py" if stage else None)
    head = (
        TreeEntry(path="nodekit", kind="dir", mode=0o755),
        TreeEntry(path="nodekit/__init__.py", kind="file", mode=mode, digest=digest, size=init.stat().st_size),
        TreeEntry(path="nodekit/launcher", kind="dir", mode=0o755),
    )
    tail = hash_tree(launcher_dir(), _LAUNCHER_RULES, prefix="nodekit/launcher/", stage=sub)
    if stage:
        (stage / "nodekit" / "__init__.py").chmod(mode)
        os.utime(stage / "nodekit" / "__init__.py", (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        _clamp_dirs([stage, stage / "nodekit"])
    return head + tail


def dockerfile_text() -> str:
    return (images_dir() / "Dockerfile").read_text()


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


# --- plan, build, record ------------------------------------------------------------------------------------


def _plan(
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
    base = _require_base(settings)
    tgt = probe_target(settings, require_probe=True)
    lock, _ = ensure_lock(settings, reporter, dry_run=True, target=tgt)
    return _plan(settings, lock, base.id, tgt, no_cache=no_cache, stage=None)


def _require_base(settings: Settings) -> docker.ImageInfo:
    base = docker.image_info(settings.base_image)
    if base is None:
        raise ImageError(
            f"base image {settings.base_image} is not in the local Docker engine, and nodekit does not pull "
            "blindly (no registry may be reachable)",
            fix="nodekit base (creates a minimal Debian base), or docker load the base you use",
        )
    return base


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
            path.write_text(text)


def _stage_wheels(root: Path, wheels: Mapping[str, Path], lock: Lock) -> None:
    """The three wheel contexts, one per layer (see :func:`nodekit.render.image.split_lock`): the CUDA libraries'
    wheels (nvidia-*, cuda-*), the framework's (torch and its companions), each with its own lock file, so that a
    layer's cache key depends on its wheels alone; and the other packages' wheels with the whole lock."""
    layers = split_lock(lock.text())
    cuda = {n: w for n, w in wheels.items() if CUDA_LIBS_PACKAGE.match(f"{n}==")}
    framework = {n: w for n, w in wheels.items() if FRAMEWORK_PACKAGE.match(f"{n}==")}
    others = {n: w for n, w in wheels.items() if n not in framework and n not in cuda}
    _sync_wheels(root / STAGE_CUDA_LIBS, cuda, {CUDA_LIBS_LOCK: layers.cuda_libs})
    _sync_wheels(root / STAGE_FRAMEWORK, framework, {FRAMEWORK_LOCK: layers.framework})
    _sync_wheels(root / STAGE_WHEELS, others, {"nodekit.lock": lock.text(), PACKAGES_LOCK: layers.packages})


def _stage(
    settings: Settings, lock: Lock, base_id: str, tgt: WheelTarget, reporter: Reporter, *, no_cache: bool
) -> BuildPlan:
    """Stage the contexts (code and launcher copied and hashed at once) and return the plan for exactly them."""
    wheels = ensure_wheelhouse(settings, lock, reporter)
    reporter.step("staging build contexts")
    root = settings.project_dir / STAGE_DIR
    _stage_wheels(root, wheels, lock)
    tmp = _fresh(root / ".staging")
    staged = _plan(settings, lock, base_id, tgt, no_cache=no_cache, stage=tmp)
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


def build(settings: Settings, reporter: Reporter, *, dry_run: bool = False, no_cache: bool = False) -> BuildResult:
    """Build the project's image, or do nothing when an image with the same fingerprint exists.

    Raises EngineError (no engine), ImageError (base image missing: fix ``nodekit base``), ConfigError (lock does
    not match the config: fix ``nodekit lock``), BuildError (the build failed). With no lock file the lock is
    created first. ``dry_run`` returns the plan and changes nothing (a missing lock is resolved, not written).
    """
    t0 = time.monotonic()
    reporter.step("checking the Docker engine and the base image")
    docker.check_engine()
    base = _require_base(settings)
    reporter.step(f"probing the base image {settings.base_image}")
    tgt = probe_target(settings, require_probe=True)
    if tgt.stack is not None:
        reporter.detail(f"base: {tgt.stack.describe()}")
    lock, created = ensure_lock(settings, reporter, dry_run=dry_run, target=tgt)
    reporter.step("fingerprinting the stack")
    planned = _plan(settings, lock, base.id, tgt, no_cache=no_cache, stage=None)
    if dry_run:
        reporter.done(f"would build {planned.tag}")
        return _result(planned, None, t0, skipped=False, dry_run=True, created=created)
    existing = docker.image_info(planned.tag)
    if existing is not None and existing.labels.get(LABEL_FINGERPRINT) == planned.fingerprint and not no_cache:
        if _in_store(settings, existing.id):
            result = _result(planned, existing, t0, skipped=True, created=created)
            _record(settings, result)
            reporter.done(f"{planned.tag} is up to date: nothing changed since it was built")
            return result
        # A fresh checkout on a machine that has the image, or a pruned store: built again (BuildKit's cache makes
        # that quick, the result is the same image id), so that pushes of it need no docker save.
        reporter.detail(f"{planned.tag} exists, but this project's blob store lacks its code layer: writing it")
    with build_lock(settings.project_dir, reporter):
        staged = _stage(settings, lock, base.id, tgt, reporter, no_cache=no_cache)
        if staged.fingerprint != planned.fingerprint:
            reporter.warn("files changed while staging; building what was staged")
        reporter.step(f"building {staged.tag}")
        _run_build(staged, reporter, settings.project_dir / STAGE_DIR / "metadata.json")
        info = _append_code(staged, settings, reporter)
    result = _result(staged, info, t0, skipped=False, created=created)
    _record(settings, result)
    reporter.done(f"built {staged.tag} ({human_size(info.size)}) in {result.seconds:.1f} s")
    return result


def _in_store(settings: Settings, image_id: str) -> bool:
    """Whether the project's blob store holds the config of ``image_id`` (``nodekit build`` wrote it beside the
    code layer, under the image id it loaded)."""
    from nodekit.blobs import BlobStore

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
    """The Dockerfile's last stage, written here (see :mod:`nodekit.append`): the staged code as one layer on the
    environment image BuildKit just made, plus the labels; loaded into the local engine as ``plan.tag``. The layer
    and the config stay in the project's blob store, so a push of this image to a node that has the environment
    sends them without a ``docker save``. Returns the loaded image; ImageError when the engine loaded something
    else.
    """
    from nodekit import append
    from nodekit.blobs import BlobStore

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
        env={"NODEKIT_FINGERPRINT": plan.fingerprint},
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


def _result(
    plan: BuildPlan,
    info: docker.ImageInfo | None,
    t0: float,
    *,
    skipped: bool,
    dry_run: bool = False,
    created: bool = False,
) -> BuildResult:
    return BuildResult(
        tag=plan.tag,
        image_id=info.id if info else "",
        fingerprint=plan.fingerprint,
        size=info.size if info else 0,
        seconds=round(time.monotonic() - t0, 3),
        skipped=skipped,
        dry_run=dry_run,
        lock_created=created,
        plan=plan,
    )


def _record(settings: Settings, result: BuildResult) -> None:
    path = settings.project_dir / LAST_BUILD
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "tag": result.tag,
        "image_id": result.image_id,
        "fingerprint": result.fingerprint,
        "size": result.size,
        "seconds": result.seconds,
        "skipped": result.skipped,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


def last_build(settings: Settings) -> dict[str, Any] | None:
    """The record of the last build in this project, or None."""
    try:
        data = json.loads((settings.project_dir / LAST_BUILD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def project_fingerprint(settings: Settings) -> tuple[str | None, str]:
    """The fingerprint an image of the project as it is now would have, without resolving or building anything:
    ``(fingerprint, "")``, or ``(None, why it cannot be known here)`` (no usable lock, no base image)."""
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
        tgt = probe_target(settings, require_probe=True, base=base)  # cached by the base's image id
    except NodekitError as e:
        return None, e.message
    return _plan(settings, lock, base.id, tgt, no_cache=False, stage=None).fingerprint, ""


class Choice(NamedTuple):
    ref: str
    why: str
    id: str  # the image's id, as the choice saw it


def choose(settings: Settings) -> Choice:
    """The image ``nodekit up`` runs when none is named, why, and its id. Deterministic:

    1. the image whose fingerprint is the project's as it is now on this node (built here or pushed here);
    2. else, when a build record names an image that is here, that image is stale (the project changed since):
       ImageError with the fix (``nodekit build``, ``nodekit up --build``, or ``--image`` to run it anyway);
    3. else, when the project's fingerprint cannot be known here (no lock, no base image: a node that only
       received a pushed image), the one image of this project here; several: ImageError asking for ``--image``.

    Creation time never decides: every nodekit image has the same reproducible one.
    """
    name = settings.image_name
    fingerprint, unknown = project_fingerprint(settings)
    labelled = docker.images_labelled(LABEL_NAME, name)

    def ref(info: docker.ImageInfo) -> str:
        tags = sorted(t for t in info.tags if t.startswith(f"nodekit/{name}:"))
        return tags[0] if tags else info.id

    if fingerprint is not None:
        match = [i for i in labelled if i.labels.get(LABEL_FINGERPRINT) == fingerprint]
        if match:
            return Choice(
                ref(match[0]), f"its fingerprint {fingerprint[:12]} is the project's as it is now", match[0].id
            )
    record = last_build(settings)
    recorded = record.get("tag") if record else None
    found = docker.image_info(recorded) if isinstance(recorded, str) else None
    if isinstance(recorded, str) and found is not None:
        if fingerprint is not None:
            raise ImageError(
                f"the image built here last, {recorded}, no longer matches the project (its fingerprint is now "
                f"{fingerprint[:12]}: files or packages changed since)",
                fix=f"nodekit build, or nodekit up --build; or --image {recorded} to run the old image anyway",
            )
        return Choice(recorded, f"the last build here (the project's fingerprint is unknown: {unknown})", found.id)
    if fingerprint is not None:
        raise ImageError(
            f"no image of {name} here matches the project (fingerprint {fingerprint[:12]})",
            fix=f"{BUILD_FIX}, or nodekit push it from the node that built it, or pass --image",
        )
    refs = sorted({ref(i) for i in labelled})
    if len(refs) == 1:
        why = f"the only image of {name} here (the project's fingerprint is unknown: {unknown})"
        return Choice(refs[0], why, labelled[0].id)
    if not refs:
        raise ImageError(f"no image built yet for {name}", fix=BUILD_FIX)
    raise ImageError(
        f"{len(refs)} images of {name} are here ({', '.join(refs[:3])}) and the project's fingerprint, which would "
        f"pick one, is unknown ({unknown})",
        fix="pass --image with the one to run (the one pushed from the node that built it)",
    )


def current_image(settings: Settings) -> str:
    """The image to run when none is named (see :func:`choose`). Raises ImageError with the fix."""
    return choose(settings).ref


# --- inspect ------------------------------------------------------------------------------------------------

# Runs in the image with its own Python; reads metadata only (importing torch would take seconds).
_PROBE = (
    "import ast, importlib.metadata as md, importlib.util, json, os, pathlib, platform, re\n"
    + DISTS_AND_TORCH
    + r"""lock = pathlib.Path("/opt/venv/nodekit.lock")
print(json.dumps({"python": platform.python_version(), "dists": dists, "torch": torch,
                  "lock": lock.read_text() if lock.is_file() else None}))
"""
)


class StackReport(BaseModel):
    """``nodekit inspect``: an image's stack as its labels and installed wheels declare it."""

    model_config = _FROZEN

    ref: str
    image_id: str
    tags: tuple[str, ...]
    name: str | None
    fingerprint: str | None
    base: str | None
    python: str | None
    torch: str | None
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    size: int
    nodekit_version: str | None
    lock_sha256: str | None
    packages: dict[str, str]  # the image's lock: name -> version
    not_as_locked: tuple[str, ...] = ()  # locked packages installed at another version, or missing
    from_base: tuple[str, ...] = ()  # what the base image provides and the lock kept (name==version)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def to_text(self) -> str:
        none = "none (CPU-only torch)" if self.torch and not self.cuda else "-"
        rows = [
            ("image", ", ".join(self.tags) or self.ref),
            ("id", self.image_id),
            ("fingerprint", self.fingerprint or "- (not a nodekit image)"),
            ("base", self.base or "-"),
            ("python", self.python or "-"),
            ("torch", self.torch or "-"),
            ("cuda", self.cuda or none),
            ("cudnn", self.cudnn or none),
            ("nccl", self.nccl or none),
            ("size", human_size(self.size)),
            ("nodekit", self.nodekit_version or "-"),
            ("lock", f"{len(self.packages)} packages, sha256 {self.lock_sha256 or '-'}"),
        ]
        if self.from_base:
            rows.append(("from base", ", ".join(self.from_base)))
        if self.not_as_locked:
            rows.append(("NOT AS LOCKED", ", ".join(self.not_as_locked)))
        width = max(len(k) for k, _ in rows)
        lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"  {n}=={v}" for n, v in self.packages.items()]
        return "\n".join(lines)


def _first(dists: Mapping[str, str], matches: Callable[[str], bool]) -> str | None:
    return next((v for k, v in sorted(dists.items()) if matches(k)), None)


def stack_from_probe(probe: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: the versions a probe of the image reports (see ``_PROBE``)."""
    dists: dict[str, str] = dict(probe.get("dists") or {})
    tv: dict[str, Any] = dict(probe.get("torch") or {})
    lock: Lock | None = None
    if probe.get("lock"):
        with contextlib.suppress(ConfigError):
            lock = parse_lock(str(probe["lock"]), source="the image's nodekit.lock")
    packages = {p.name: p.version for p in lock.packages} if lock else {}
    wrong = tuple(
        f"{n} (locked {v}, installed {dists.get(n, 'nothing')})" for n, v in packages.items() if dists.get(n) != v
    )
    return {
        "python": probe.get("python"),
        "torch": tv.get("__version__") or dists.get("torch"),
        "cuda": tv.get("cuda") or tv.get("hip"),
        "cudnn": _first(dists, lambda k: k.startswith("nvidia-cudnn")),
        "nccl": _first(dists, lambda k: k.startswith("nvidia-nccl")),
        "packages": packages,
        "not_as_locked": wrong,
        "from_base": lock.provided if lock else (),
    }


def inspect_image(ref: str) -> StackReport:
    """The stack of image ``ref``: labels, plus what a short metadata probe in a container of it reports.

    Raises ImageError when the image is not here. A non-nodekit image gets a report of what its labels say.
    """
    info = docker.require_image(ref)
    labels = info.labels
    found: dict[str, Any] = {}
    with contextlib.suppress(ImageError):
        out = docker.run_in_image(info.id, ["-c", _PROBE], entrypoint="/opt/venv/bin/python")
        found = stack_from_probe(json.loads(out.strip().splitlines()[-1]))
    base = labels.get(LABEL_BASE)
    if base and labels.get(LABEL_BASE_ID):
        base = f"{base} ({labels[LABEL_BASE_ID]})"
    return StackReport(
        ref=ref,
        image_id=info.id,
        tags=info.tags,
        name=labels.get(LABEL_NAME),
        fingerprint=labels.get(LABEL_FINGERPRINT),
        base=base,
        python=found.get("python") or labels.get(LABEL_PYTHON),
        torch=found.get("torch") or labels.get(LABEL_TORCH),
        cuda=found.get("cuda"),
        cudnn=found.get("cudnn"),
        nccl=found.get("nccl"),
        size=info.size,
        nodekit_version=labels.get(LABEL_VERSION),
        lock_sha256=labels.get(LABEL_LOCK),
        packages=found.get("packages", {}),
        not_as_locked=found.get("not_as_locked", ()),
        from_base=found.get("from_base", ()),
    )


def layers(ref: str) -> tuple[str, ...]:
    """The image's layer digests, base first (tests and benchmarks compare them across rebuilds)."""
    return docker.image_layers(ref)


__all__ = [
    "BuildResult",
    "StackReport",
    "build",
    "current_image",
    "hash_tree",
    "inspect_image",
    "last_build",
    "launcher_tree",
    "plan",
    "stack_from_probe",
]
