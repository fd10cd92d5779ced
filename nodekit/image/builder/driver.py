"""``nodekit build``: lock, fingerprint, then make the image from layers nodekit holds, on either image store.

Order: engine, base image, lock, plan (pure, :mod:`nodekit.image.plan`); if an image tagged with the fingerprint
exists and the project's blob store holds it, the build is a no-op. Otherwise the wheelhouse is completed, the build
contexts are staged under ``<project>/.nodekit/build/``, and the image is assembled (:mod:`nodekit.image.layers`):

1. each package layer (environment with the CUDA libraries, framework, packages) the blob store does not hold for
   its inputs yet is installed by BuildKit and streamed back as files (``--target layer-<name> --output type=tar``),
   which nodekit writes into the blob store as a reproducible layer. The missing layers' builds run at once: the
   framework and packages stages each start from the environment stage, which BuildKit builds once for all of them,
   so their installs and the three exports overlap instead of following each other;
2. the launcher and code layers and the image config are written by nodekit;
3. the image is loaded into the local engine from those blobs, each layer only if the engine lacks it.

So no step reads an image back out of an engine, and every layer a push may have to send is a file here.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import cast

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image import archive as arch
from nodekit.image.blobs import BlobStore, LayerRecord
from nodekit.image.builder.bases import base_descriptors
from nodekit.image.builder.planning import plan_for, require_base
from nodekit.image.builder.record import BuildResult, build_result, human_size, write_record
from nodekit.image.builder.staging import build_lock, stage_contexts
from nodekit.image.layers import Runtime, created_at, image_config, normalize_layer, write_tree_layer
from nodekit.image.lock import ensure_lock
from nodekit.image.plan import (
    ENTRYPOINT,
    IMAGE_ENV,
    LABEL_FINGERPRINT,
    PACKAGE_LAYERS,
    SOURCE_DATE_EPOCH,
    STAGE_CODE,
    WORKDIR,
    BuildPlan,
    PackageLayer,
    layer_key,
)
from nodekit.image.probe import target as probe_target
from nodekit.launcher.contract import Env
from nodekit.system import docker
from nodekit.system.progress import Reporter

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
    planned = plan_for(settings, lock, base.identity, tgt, no_cache=no_cache, stage=None)
    if dry_run:
        reporter.done(f"would build {planned.tag}")
        return build_result(planned, None, t0, skipped=False, dry_run=True, created=created)
    store = BlobStore.of_project(settings.project_dir)
    existing = docker.image_info(planned.tag)
    if existing is not None and existing.labels.get(LABEL_FINGERPRINT) == planned.fingerprint and not no_cache:
        if store.image(existing.id) is not None:
            result = build_result(planned, existing, t0, skipped=True, created=created)
            write_record(settings, result, store.image(existing.id))
            reporter.done(f"{planned.tag} is up to date: nothing changed since it was built")
            return result
        # A fresh checkout on a machine that has the image, or a pruned store: made again from BuildKit's cache
        # (the same image id), so that pushes of it need no docker save.
        reporter.detail(f"{planned.tag} exists, but this project's blob store lacks its layers: writing them")
    with build_lock(settings.project_dir, reporter):
        staged = stage_contexts(settings, lock, base.identity, tgt, reporter, no_cache=no_cache)
        if staged.fingerprint != planned.fingerprint:
            reporter.warn("files changed while staging; building what was staged")
        image = _assemble(staged, settings, store, base, reporter, no_cache=no_cache)
        reporter.step(f"loading {staged.tag} into the local Docker engine")
        info = _load_here(staged.tag, image, store, reporter)
        store.keep_image(image)
    result = build_result(staged, info, t0, skipped=False, created=created)
    write_record(settings, result, image)
    reporter.done(f"built {staged.tag} ({human_size(info.size)}) in {result.seconds:.1f} s")
    return result


def _assemble(
    plan: BuildPlan, settings: Settings, store: BlobStore, base: docker.ImageInfo, rep: Reporter, *, no_cache: bool
) -> arch.Image:
    """The image of ``plan``: every layer above the base in ``store`` (made where missing), and its config."""
    base_layers = base_descriptors(settings, base, store, rep)
    kept = {layer.name: None if no_cache else store.layer(layer_key(plan, layer.name)) for layer in PACKAGE_LAYERS}
    missing = [layer for layer in PACKAGE_LAYERS if kept[layer.name] is None]
    made = _make_layers(plan, missing, store, rep, no_cache=no_cache)
    ours: list[LayerRecord] = []
    for layer in PACKAGE_LAYERS:
        got = kept[layer.name]
        if got is None:
            got = made[layer.name]
        else:
            rep.detail(f"{layer.name} layer {got.diff_id[7:19]} ({human_size(got.size)}): unchanged, from the store")
        if got.entries:  # an empty framework layer (the base provides torch) is no layer at all
            ours.append(got)
    contexts = dict(plan.build_contexts)
    rep.step(f"writing the launcher layer and the code layer ({plan.code_files} files)")
    for src, root, what in (
        (plan.context / "nodekit", "opt/nodekit/nodekit", "COPY nodekit /opt/nodekit/nodekit (nodekit's launcher)"),
        (contexts[STAGE_CODE], WORKDIR.lstrip("/"), f"COPY . {WORKDIR}/ (the project's code)"),
    ):
        digest, size = store.put(_tree_writer(src, root))
        ours.append(LayerRecord(diff_id=digest, size=size, entries=1, created_by=what))
    config = image_config(
        docker.image_config(base.id),
        docker.image_history(base.id),
        [(r.diff_id, r.created_by) for r in ours],
        Runtime(env={**IMAGE_ENV, Env.FINGERPRINT: plan.fingerprint}, workdir=WORKDIR, entrypoint=ENTRYPOINT,
                labels=dict(plan.labels)),
        created=created_at(SOURCE_DATE_EPOCH),
    )  # fmt: skip
    return arch.Image(config=config, layers=(*base_layers, *(arch.layer_descriptor(r.diff_id, r.size) for r in ours)))


def _tree_writer(src: Path, root: str) -> Callable[[arch.Writable], object]:
    return lambda f: write_tree_layer(src, f, mtime=SOURCE_DATE_EPOCH, root=root)


def _make_layers(
    plan: BuildPlan, layers: Sequence[PackageLayer], store: BlobStore, rep: Reporter, *, no_cache: bool
) -> dict[str, LayerRecord]:
    """BuildKit builds ``layers`` (one build each), each written into ``store`` as its files arrive. Several run at
    once: their progress lines are tagged with the layer's name, and the first failure stops the others (its error
    is the one raised). The demo project's three layers with ``--no-cache``: 50.9 s one after another, 36.5 s at
    once (classic store; 44.8 and 27.8 s on the containerd store: docs/benchmarks.md)."""
    if len(layers) <= 1:
        made: dict[str, LayerRecord] = {}
        for layer in layers:
            rep.step(f"building the {layer.what} layer")
            made[layer.name] = _export_layer(plan, layer, store, rep, no_cache=no_cache, steps=True)
        return made
    rep.step(f"building {len(layers)} layers at once: {', '.join(layer.what for layer in layers)}")
    shared = _OneAtATime(rep)
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=len(layers), thread_name_prefix="nodekit-layer") as pool:
        running = {
            pool.submit(
                _export_layer, plan, layer, store, _Tagged(shared, layer.name), no_cache=no_cache, stop=stop
            ): layer.name
            for layer in layers
        }
        try:
            failed = next((f for f in as_completed(running) if f.exception() is not None), None)
        finally:
            stop.set()  # a failure, or a signal in this thread: buildx_export ends the other builds
        if failed is not None:
            raise cast("BaseException", failed.exception())
        return {name: f.result() for f, name in running.items()}


class _OneAtATime:
    """A reporter the layer builds' threads share: one call at a time (the terminal's spinner is not thread-safe)."""

    def __init__(self, rep: Reporter) -> None:
        self.rep, self.lock = rep, threading.Lock()

    def say(self, kind: str, message: str) -> None:
        with self.lock:
            getattr(self.rep, kind)(message)


class _Tagged:
    """One layer's build's reporter under :class:`_OneAtATime`: BuildKit's steps become detail lines (steps of
    builds running at once would interleave), each tagged ``<layer> | ``."""

    def __init__(self, shared: _OneAtATime, name: str) -> None:
        self.shared, self.name = shared, name

    def step(self, message: str) -> None:
        self.shared.say("detail", f"{self.name} | {message}")

    def detail(self, line: str) -> None:
        self.shared.say("detail", f"{self.name} | {line}")

    def done(self, message: str) -> None:
        self.shared.say("detail", f"{self.name} | {message}")

    def warn(self, message: str) -> None:
        self.shared.say("warn", f"{self.name} layer: {message}")


def _export_layer(
    plan: BuildPlan,
    layer: PackageLayer,
    store: BlobStore,
    rep: Reporter,
    *,
    no_cache: bool,
    steps: bool = False,
    stop: threading.Event | None = None,
) -> LayerRecord:
    """BuildKit installs one package layer; its files come back as a tar stream, written as a layer blob.
    ``steps``: BuildKit's steps are the reporter's steps; ``stop``: set, the build stops."""
    entries = 0

    def write(f: arch.Writable) -> None:
        nonlocal entries
        stream = _build_stream(plan, layer.target, rep, no_cache=no_cache, steps=steps, stop=stop)
        entries = normalize_layer(stream, f, mtime=SOURCE_DATE_EPOCH)
        # The reader stops at the archive's end marker; what follows (padding, then BuildKit's exit code and its
        # last lines) is read too, so that a build that fails after its files is an error, not a layer.
        for _rest in stream:
            pass

    digest, size = store.put(write)
    record = LayerRecord(diff_id=digest, size=size, entries=entries, created_by=layer.created_by)
    store.set_layer(layer_key(plan, layer.name), record)
    rep.detail(f"{layer.name} layer {digest[7:19]} ({human_size(size)}, {entries} entries)")
    return record


def _build_stream(
    plan: BuildPlan, target: str, rep: Reporter, *, no_cache: bool, steps: bool, stop: threading.Event | None
) -> Iterator[bytes]:
    seen: set[str] = set()

    def progress(line: str) -> None:
        m = _STEP.match(line)
        if steps and m and m[1] not in seen:
            seen.add(m[1])
            rep.step(m[2])
        rep.detail(line)

    yield from docker.buildx_export(  # closed early (an error downstream): the build is ended
        plan.context,
        dockerfile=plan.dockerfile,
        target=target,
        build_contexts=dict(plan.build_contexts),
        build_args=dict(plan.build_args),
        no_cache=no_cache,
        on_line=progress,
        stop=stop,  # set: buildx_export ends the build, which then fails as a stopped build does
    )


def _load_here(tag: str, image: arch.Image, store: BlobStore, rep: Reporter) -> docker.ImageInfo:
    """Load ``image`` as ``tag`` into the local engine, sending only the layers it lacks; its info there. ImageError
    when the engine holds something else under the tag afterwards."""
    facts = docker.engine_facts(None)
    held = arch.chains_of(docker.layer_lists(None))
    chains = arch.chain_ids(image.diff_ids)
    missing = {d.digest for d, c in zip(image.layers, chains, strict=True) if c not in held}
    files = {}
    for d in image.layers:
        if d.digest in missing:
            path = store.verified_path(d.digest)
            if path is None:
                raise ImageError(
                    f"the layer {d.digest[7:19]} of {tag} is neither in the local engine nor in the project's blob "
                    "store",
                    fix="nodekit build --no-cache",
                )
            files[d.digest] = path
    size = sum(p.stat().st_size for p in files.values())
    rep.detail(f"loading {len(files)} of {len(image.layers)} layers ({human_size(size)})")
    _feed(arch.archive(image, tag, files), docker.LoadSink())
    got = docker.image_info(tag)
    want = image.id_on(facts.containerd_store)
    if got is None or got.id != want:
        raise ImageError(
            f"the engine loaded {tag} as {got.id if got else 'nothing'}, not {want} as written",
            fix="nodekit build --no-cache; if it repeats, report it with `docker version`",
        )
    return got


def _feed(chunks: Iterable[bytes], sink: docker.LoadSink) -> None:
    try:
        for chunk in chunks:
            sink.write(chunk)
        sink.finish()
    except BaseException:
        sink.abort()
        raise


__all__ = ["build"]
