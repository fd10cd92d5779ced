"""Moving an image between Docker engines without a registry: push (engine to engines), save and load (files).

``plan_push`` is pure: given what each target engine has (``TargetState``, gathered by ``survey``), it decides
per target whether to skip, re-tag or load, and with which compression; it refuses before anything moves when a
target is unreachable or short of disk. ``push`` carries a plan out: one ``docker save`` on the source,
compressed once, fanned out to one ``docker load`` per target in parallel, then the image id on every target is
compared with the source's. A target whose stream breaks is cut off (its engine discards the partial load), so a
failed push leaves that target's existing images as they were.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit

from nodekit import docker
from nodekit.errors import EngineError, NodekitError, ShipError, UsageError
from nodekit.progress import Reporter

Codec = Literal["none", "gzip", "zstd"]
Compress = Literal["auto", "none", "gzip", "zstd"]
Action = Literal["skip", "tag", "load"]

SCHEMES = ("ssh", "tcp", "unix")
# `docker load` keeps the whole archive in its data root's tmp/ while it unpacks the layers next to it.
DISK_FACTOR = 2.2
PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True)
class Target:
    """A Docker engine to ship to: ``name`` is how messages call it, ``endpoint`` how docker reaches it."""

    name: str
    endpoint: str


def parse_target(spec: str) -> Target:
    """``ssh://user@host``, ``tcp://host:2376``, ``unix:///path``, optionally named: ``node1=ssh://user@host``."""
    name, sep, endpoint = spec.partition("=")
    if not sep or "://" in name:
        name, endpoint = "", spec
    scheme = urlsplit(endpoint).scheme
    if scheme not in SCHEMES:
        raise UsageError(
            f"--to {spec!r} is not a Docker endpoint",
            fix="--to ssh://user@host, --to tcp://host:2376 or --to unix:///var/run/docker.sock "
            "(optionally named: --to node1=ssh://user@host)",
        )
    return Target(name=name or _short(endpoint), endpoint=endpoint)


def _short(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme == "unix":
        return endpoint
    return parts.netloc or endpoint


@dataclass(frozen=True)
class TargetState:
    """What one target engine has, as gathered by ``survey``; ``error`` is set when it could not be asked."""

    target: Target
    error: str | None = None
    engine_id: str = ""
    server_version: str = ""
    ref_id: str | None = None
    """The image id that the pushed reference names there (None: no such reference)."""
    has_image: bool = False
    """The source's image id is there (under whatever name)."""
    free_bytes: int | None = None


@dataclass(frozen=True)
class Source:
    ref: str
    image_id: str
    size: int
    engine_id: str
    endpoint: str | None = None


@dataclass(frozen=True)
class Step:
    target: Target
    action: Action
    reason: str
    codec: Codec = "none"
    previous_id: str | None = None
    """The id ``ref`` named on the target before the push: restored there if verification fails."""


@dataclass(frozen=True)
class PushPlan:
    source: Source
    steps: tuple[Step, ...]

    def loads(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.action == "load")

    def to_text(self) -> str:
        src = self.source
        head = f"push {src.ref} ({_short_id(src.image_id)}, {_size(src.size)}) from {src.endpoint or 'this engine'}"
        lines = [head]
        for s in self.steps:
            how = f" ({s.codec} stream)" if s.action == "load" else ""
            lines.append(f"  {s.target.name:<24} {s.action}{how}: {s.reason}")
        return "\n".join(lines)


def _short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def choose_codec(compress: Compress, endpoint: str, *, zstd_here: bool, server_version: str) -> Codec:
    """``auto``: no compression over a local unix socket (it would only cost CPU), else zstd when this machine
    has the zstd command and the target engine decompresses it (Docker >= 23), else gzip."""
    if compress != "auto":
        return compress
    if endpoint.startswith("unix://"):
        return "none"
    return "zstd" if zstd_here and _major(server_version) >= 23 else "gzip"


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def plan_push(
    source: Source,
    states: Sequence[TargetState],
    *,
    compress: Compress = "auto",
    zstd_here: bool = True,
) -> PushPlan:
    """Decide each target's step. Raises ShipError, before anything moves, when a target cannot be asked or
    does not have room; UsageError when the same target is named twice."""
    seen: dict[str, str] = {}
    for st in states:
        if st.target.endpoint in seen:
            raise UsageError(f"target {st.target.endpoint} is named twice", fix="pass each --to once")
        seen[st.target.endpoint] = st.target.name
    broken = [st for st in states if st.error is not None]
    if broken:
        first = broken[0]
        more = (
            f" (and {len(broken) - 1} more: {', '.join(b.target.name for b in broken[1:])})" if len(broken) > 1 else ""
        )
        raise ShipError(
            f"cannot push to {first.target.name}: {first.error}{more}",
            fix=_reach_fix(first.target.endpoint),
            node=first.target.name,
        )
    if compress == "zstd" and not zstd_here:
        raise UsageError("--compress zstd needs the zstd command on this machine", fix="apt-get install zstd, or "
                         "--compress gzip")  # fmt: skip
    steps = []
    for st in states:
        t = st.target
        if source.engine_id and st.engine_id == source.engine_id:
            steps.append(Step(t, "skip", "is the source engine itself"))
        elif st.ref_id == source.image_id:
            steps.append(Step(t, "skip", f"already has {_short_id(source.image_id)}"))
        elif st.has_image:
            steps.append(Step(t, "tag", "has the image under another name", previous_id=st.ref_id))
        else:
            need = int(source.size * DISK_FACTOR)
            if st.free_bytes is not None and st.free_bytes < need:
                raise ShipError(
                    f"{t.name} has {_size(st.free_bytes)} free for Docker, loading {source.ref} needs about "
                    f"{_size(need)}",
                    fix=f"free space on {t.name} (docker system prune, or a larger disk for Docker's data root)",
                    node=t.name,
                )
            codec = choose_codec(compress, t.endpoint, zstd_here=zstd_here, server_version=st.server_version)
            reason = "has an older image under this name" if st.ref_id else "does not have the image"
            steps.append(Step(t, "load", reason, codec=codec, previous_id=st.ref_id))
    return PushPlan(source=source, steps=tuple(steps))


def _reach_fix(endpoint: str) -> str:
    scheme = urlsplit(endpoint).scheme
    if scheme == "ssh":
        return f"check that `docker -H {endpoint} info` works (ssh key, and the user in the docker group there)"
    if scheme == "tcp":
        return f"check that the engine listens there (`docker -H {endpoint} info`) and the port is open"
    return f"start the Docker engine behind that socket (`docker -H {endpoint} info` must answer)"


# --- facts ---------------------------------------------------------------------------------------------------


def source_of(ref: str, endpoint: str | None = None) -> Source:
    """The image to push, on the source engine. ImageError when it is not there."""
    info = docker.require_image(ref, endpoint)
    facts = docker.engine_facts(endpoint)
    return Source(ref=ref, image_id=info.id, size=info.size, engine_id=facts.engine_id, endpoint=endpoint)


def survey(source: Source, targets: Sequence[Target]) -> list[TargetState]:
    """Ask every target, in parallel, what it has. Never raises: failures land in ``TargetState.error``."""

    def one(t: Target) -> TargetState:
        try:
            facts = docker.engine_facts(t.endpoint)
            at_ref = docker.image_info(source.ref, t.endpoint)
            by_id = (
                at_ref if at_ref and at_ref.id == source.image_id else docker.image_info(source.image_id, t.endpoint)
            )
        except NodekitError as e:
            return TargetState(target=t, error=e.message)
        return TargetState(
            target=t,
            engine_id=facts.engine_id,
            server_version=facts.server_version,
            ref_id=at_ref.id if at_ref else None,
            has_image=by_id is not None and by_id.id == source.image_id,
            free_bytes=facts.free_bytes,
        )

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return list(pool.map(one, targets))


def zstd_here() -> bool:
    return shutil.which("zstd") is not None


# --- apply ---------------------------------------------------------------------------------------------------

ProgressFn = Callable[[str, int, int], None]
"""``(target name, bytes of the image sent, bytes in all)``; called from worker threads."""


@dataclass
class PushResult:
    plan: PushPlan
    seconds: dict[str, float] = field(default_factory=dict)
    failures: dict[str, ShipError] = field(default_factory=dict)


class _Sink(Protocol):
    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> docker.Loaded: ...

    def abort(self) -> None: ...


class _SafeReporter:
    """Reporters are not thread-safe (rich's live line is not); workers report through this lock."""

    def __init__(self, reporter: Reporter) -> None:
        self._r = reporter
        self._lock = threading.Lock()

    def step(self, message: str) -> None:
        with self._lock:
            self._r.step(message)

    def detail(self, line: str) -> None:
        with self._lock:
            self._r.detail(line)

    def done(self, message: str) -> None:
        with self._lock:
            self._r.done(message)

    def warn(self, message: str) -> None:
        with self._lock:
            self._r.warn(message)


def push(
    plan: PushPlan,
    reporter: Reporter,
    *,
    on_progress: ProgressFn | None = None,
    open_source: Callable[[str, str | None], Iterable[bytes]] | None = None,
    open_sink: Callable[[str], _Sink] | None = None,
) -> PushResult:
    """Carry out ``plan``. Every target is attempted; afterwards, ShipError names the first failed target (and
    how many others failed) when any did. ``open_source``/``open_sink`` replace docker save/load in tests."""
    rep = _SafeReporter(reporter)
    src = plan.source
    result = PushResult(plan=plan)
    for s in plan.steps:
        if s.action == "skip":
            rep.done(f"{s.target.name}: skipped, {s.reason}")
    for s in plan.steps:
        if s.action == "tag":
            t0 = time.monotonic()
            try:
                docker.tag_image(src.image_id, src.ref, s.target.endpoint)
                _verify(src, s)
            except NodekitError as e:
                result.failures[s.target.name] = _as_ship_error(e, s.target)
                continue
            result.seconds[s.target.name] = time.monotonic() - t0
            rep.done(f"{s.target.name}: tagged {src.ref} ({s.reason})")
    loads = plan.loads()
    by_codec: dict[Codec, list[Step]] = {}
    for s in loads:
        by_codec.setdefault(s.codec, []).append(s)
    for codec, steps in by_codec.items():
        names = ", ".join(s.target.name for s in steps)
        rep.step(f"pushing {src.ref} ({_size(src.size)}, {codec} stream) to {names}")
        _fan_out(plan, steps, codec, rep, result, on_progress, open_source, open_sink)
    if result.failures:
        (_, first), *rest = result.failures.items()
        if rest:
            first = ShipError(
                f"{first.message} (and {len(rest)} more failed: {', '.join(n for n, _ in rest)})",
                fix=first.fix,
                node=first.node,
            )
        raise first
    return result


def _as_ship_error(e: NodekitError, target: Target) -> ShipError:
    if isinstance(e, ShipError) and e.node:
        return e
    return ShipError(e.message, fix=e.fix or _reach_fix(target.endpoint), node=target.name)


_END = object()


def _fan_out(
    plan: PushPlan,
    steps: list[Step],
    codec: Codec,
    rep: _SafeReporter,
    result: PushResult,
    on_progress: ProgressFn | None,
    open_source: Callable[[str, str | None], Iterable[bytes]] | None,
    open_sink: Callable[[str], _Sink] | None,
) -> None:
    """One save, compressed once, into one bounded queue per target; a slow target slows the stream, a failed
    one is dropped from it."""
    src = plan.source
    total = max(src.size, 1)
    queues = {s.target.name: queue.Queue[object](maxsize=16) for s in steps}
    dead = {s.target.name: threading.Event() for s in steps}
    started = time.monotonic()

    def consume(step: Step) -> None:
        name = step.target.name
        q = queues[name]
        last = 0.0
        try:
            sink = (open_sink or docker.LoadSink)(step.target.endpoint)
        except NodekitError as e:
            result.failures[name] = _as_ship_error(e, step.target)
            dead[name].set()
            return
        try:
            while True:
                item = q.get()
                if item is _END:
                    break
                if isinstance(item, ShipError):
                    # The source broke: cut this load off so the engine discards the partial image.
                    sink.abort()
                    result.failures[name] = ShipError(item.message, fix=item.fix, node=name)
                    dead[name].set()
                    return
                assert isinstance(item, tuple)
                chunk, sent = item
                sink.write(chunk)
                now = time.monotonic()
                if on_progress is not None:
                    on_progress(name, sent, total)
                elif now - last >= PROGRESS_EVERY_S:
                    last = now
                    rate = sent / max(now - started, 1e-6)
                    rep.detail(f"{name}: {_size(sent)} of {_size(total)} ({100 * sent // total}%), {_size(rate)}/s")
            sink.finish()
            _verify(src, step)
        except NodekitError as e:
            sink.abort()
            result.failures[name] = _diagnose(e, step, plan)
            dead[name].set()
            return
        except BaseException as e:
            sink.abort()
            result.failures[name] = ShipError(
                f"pushing to {name} failed: {e}", fix=f"nodekit push again (--to {step.target.endpoint})", node=name
            )
            dead[name].set()
            return
        result.seconds[name] = time.monotonic() - started
        rep.done(f"{name}: loaded {src.ref} ({_short_id(src.image_id)}) in {result.seconds[name]:.1f} s")

    def put(name: str, item: object) -> None:
        while not dead[name].is_set():
            try:
                queues[name].put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    workers = [threading.Thread(target=consume, args=(s,), name=f"push-{s.target.name}") for s in steps]
    for w in workers:
        w.start()
    raw: Iterable[bytes] | None = None
    try:
        raw = (open_source or docker.SaveStream)(src.ref, src.endpoint)
        counted = _Counted(raw)
        for chunk in compressed(counted, codec):
            live = [s.target.name for s in steps if not dead[s.target.name].is_set()]
            if not live:
                break
            for name in live:
                put(name, (chunk, min(counted.n, total)))
        for s in steps:
            put(s.target.name, _END)
    except BaseException as e:
        err = e if isinstance(e, NodekitError) else ShipError(f"the image stream from the source broke: {e}")
        failure = ShipError(
            f"{err.message}; nothing was loaded on the targets",
            fix=f"check the image on the source ({src.endpoint or 'this engine'}: docker image inspect {src.ref}), "
            "then nodekit push again",
        )
        for s in steps:
            put(s.target.name, failure)
        if not isinstance(e, Exception):
            raise
    finally:
        for w in workers:
            w.join()
        close = getattr(raw, "close", None)
        if callable(close):
            close()


class _Counted:
    """Counts the bytes of the uncompressed stream (progress is measured against the image's size)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.n = 0

    def __iter__(self) -> Iterator[bytes]:
        for c in self._chunks:
            self.n += len(c)
            yield c


def _verify(src: Source, step: Step) -> None:
    """The image id ``ref`` names on the target must be the source's; else the old name is put back."""
    got = docker.image_info(src.ref, step.target.endpoint)
    if got is not None and got.id == src.image_id:
        return
    if step.previous_id is not None:
        docker.tag_image(step.previous_id, src.ref, step.target.endpoint)
    found = _short_id(got.id) if got else "nothing"
    raise ShipError(
        f"after loading, {src.ref} on {step.target.name} is {found}, not {_short_id(src.image_id)} as on the source",
        fix=f"nodekit push again; if it repeats, compare `docker image inspect {src.ref}` on both engines "
        "(both must use the same image store: the containerd store names images by manifest, not by config)",
        node=step.target.name,
    )


def diagnose_load_failure(docker_says: str) -> Literal["disk", "corrupt", "other"]:
    """Classify the last line of a failed ``docker load``."""
    low = docker_says.lower()
    if "no space left" in low or "disk quota" in low:
        return "disk"
    corrupt = ("unexpected eof", "invalid tar", "archive/tar", "gzip", "zstd", "magic number", "checksum",
               "diffid", "manifest.json", "invalid argument", "unexpected end", "does not match", "digest")  # fmt: skip
    if any(c in low for c in corrupt):
        return "corrupt"
    return "other"


def _diagnose(e: NodekitError, step: Step, plan: PushPlan) -> ShipError:
    name, src = step.target.name, plan.source
    if isinstance(e, ShipError) and e.node:
        return e
    kind = diagnose_load_failure(e.message)
    if kind == "disk":
        return ShipError(
            f"{name} ran out of disk space loading {src.ref} ({_size(src.size)}): {e.message}",
            fix=f"free space on {name} (docker system prune there); its existing images are untouched",
            node=name,
        )
    if kind == "corrupt":
        return ShipError(
            f"the image stream reached {name} corrupted or cut short; {name} discarded it: {e.message}",
            fix=f"nodekit push again (--to {step.target.endpoint}); if it repeats, check the network to {name}",
            node=name,
        )
    return ShipError(e.message, fix=e.fix or f"nodekit push again (--to {step.target.endpoint})", node=name)


# --- compression ---------------------------------------------------------------------------------------------


def compressed(chunks: Iterable[bytes], codec: Codec) -> Iterator[bytes]:
    """``chunks`` compressed with ``codec`` (gzip in-process, zstd through the zstd command, multi-threaded)."""
    if codec == "none":
        yield from chunks
    elif codec == "gzip":
        # Level 1: on a fast link the compressor, not the network, is the bottleneck.
        z = zlib.compressobj(1, zlib.DEFLATED, 31)
        for c in chunks:
            if out := z.compress(c):
                yield out
        yield z.flush()
    else:
        yield from _through(["zstd", "-q", "-c", "-1", "-T0"], chunks)


def _through(argv: list[str], chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Pipe ``chunks`` through a filter command, feeding it from a thread so neither side blocks."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    failed: list[BaseException] = []

    def feed() -> None:
        assert proc.stdin is not None
        try:
            for c in chunks:
                proc.stdin.write(c)
        except BaseException as e:
            failed.append(e)
            proc.kill()
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        while out := proc.stdout.read(docker.CHUNK):
            yield out
        feeder.join()
        code = proc.wait()
        if failed:
            raise failed[0]
        if code != 0:
            raise ShipError(f"{argv[0]} exited with code {code} while compressing the image stream")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def codec_for_file(path: Path) -> Codec:
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz")):
        return "gzip"
    if name.endswith((".tar.zst", ".tzst")):
        return "zstd"
    if name.endswith(".tar"):
        return "none"
    raise UsageError(
        f"{path} should end in .tar, .tar.gz or .tar.zst (that picks the compression)",
        fix=f"nodekit save {path.with_name(path.name + '.tar.zst')}",
    )


# --- files: save and load ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saved:
    path: Path
    ref: str
    image_id: str
    bytes: int
    seconds: float


def save(ref: str, path: Path, reporter: Reporter, *, endpoint: str | None = None) -> Saved:
    """Write ``docker save REF`` to ``path`` (compressed as its suffix says), atomically: a failed or
    interrupted save leaves no file at ``path``."""
    codec = codec_for_file(path)
    if codec == "zstd" and not zstd_here():
        raise UsageError("saving .tar.zst needs the zstd command", fix="apt-get install zstd, or save to .tar.gz")
    info = docker.require_image(ref, endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if codec == "none" and free < info.size:
        raise ShipError(
            f"{path.parent} has {_size(free)} free, {ref} needs about {_size(info.size)}",
            fix="save to another directory, or to .tar.zst (compressed)",
        )
    reporter.step(f"saving {ref} ({_size(info.size)}) to {path}")
    tmp = path.with_name(f".{path.name}.partial")
    t0 = time.monotonic()
    stream = docker.SaveStream(ref, endpoint)
    last = 0.0
    try:
        counted = _Counted(stream)
        with open(tmp, "wb") as f:
            for chunk in compressed(counted, codec):
                f.write(chunk)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    reporter.detail(f"{_size(counted.n)} of {_size(info.size)}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise ShipError(
            f"cannot write {path}: {e.strerror or e}", fix="check the directory and its free space"
        ) from None
    finally:
        stream.close()
        tmp.unlink(missing_ok=True)
    saved = Saved(path=path, ref=ref, image_id=info.id, bytes=path.stat().st_size, seconds=time.monotonic() - t0)
    reporter.done(f"saved {ref} ({_short_id(info.id)}) to {path}: {_size(saved.bytes)} in {saved.seconds:.1f} s")
    return saved


@dataclass(frozen=True)
class LoadedFile:
    path: Path
    images: tuple[tuple[str, str], ...]
    """(reference or id, image id) for each image the file held."""
    seconds: float


def load(path: Path, reporter: Reporter, *, endpoint: str | None = None, expect_id: str | None = None) -> LoadedFile:
    """``docker load`` a file written by ``nodekit save`` (or ``docker save``, plain or compressed) into the
    engine at ``endpoint``. A corrupt or truncated file changes no image there."""
    where = endpoint or "this engine"
    if not path.is_file():
        raise UsageError(f"{path} does not exist", fix="nodekit save it on the node that has the image")
    docker.engine_facts(endpoint)
    size = path.stat().st_size
    reporter.step(f"loading {path} ({_size(size)}) into {where}")
    t0 = time.monotonic()
    sink = docker.LoadSink(endpoint)
    last = 0.0
    sent = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(docker.CHUNK):
                sink.write(chunk)
                sent += len(chunk)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    reporter.detail(f"{_size(sent)} of {_size(size)}")
        loaded = sink.finish()
    except NodekitError as e:
        sink.abort()
        kind = diagnose_load_failure(e.message)
        if kind == "corrupt":
            raise ShipError(
                f"{path} is corrupt or truncated; {where} discarded it ({e.message})",
                fix="nodekit save the image again on the node that has it, and copy the whole file",
                node=endpoint,
            ) from None
        if kind == "disk":
            raise ShipError(
                f"{where} ran out of disk space loading {path}: {e.message}",
                fix="free space for Docker (docker system prune); existing images are untouched",
                node=endpoint,
            ) from None
        raise
    except BaseException:
        sink.abort()
        raise
    images = []
    for name in (*loaded.refs, *loaded.ids):
        info = docker.image_info(name, endpoint)
        if info is None:
            raise ShipError(f"docker load reported {name} but {where} does not have it", fix="nodekit load again")
        images.append((name, info.id))
    if expect_id is not None and not any(i == expect_id or _short_id(i).startswith(expect_id) for _, i in images):
        got = ", ".join(f"{n} {_short_id(i)}" for n, i in images) or "nothing"
        raise ShipError(f"{path} held {got}, not {expect_id}", fix="load the file saved from the right image")
    seconds = time.monotonic() - t0
    for n, i in images:
        reporter.done(f"loaded {n} ({_short_id(i)}) into {where} in {seconds:.1f} s")
    return LoadedFile(path=path, images=tuple(images), seconds=seconds)


__all__ = [
    "EngineError",
    "PushPlan",
    "PushResult",
    "Source",
    "Step",
    "Target",
    "TargetState",
    "load",
    "parse_target",
    "plan_push",
    "push",
    "save",
    "source_of",
    "survey",
]
