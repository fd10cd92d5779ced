"""Images as files, for nodes that share a file system: :func:`save` writes one, :func:`load` reads one.

:func:`save` writes ``docker save`` compressed as the file's suffix says (:func:`nodekit.ship.codecs.codec_for_file`),
atomically: a failed or interrupted save leaves no file at the path. With ``have`` (the chain ids a node reported
with ``nodekit layers``) it is incremental: the layer files that node holds are left out, so the file loads there
(and only on an engine holding those layers) to the same image id. :func:`load` streams a file (plain or
compressed) into ``docker load``, checked on its way (:mod:`nodekit.ship.scan`): a corrupt or truncated file changes
no image on the engine, and with ``expect_id`` a file that is not exactly that image is refused before any tag moves.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nodekit.errors import NodekitError, ShipError, UsageError
from nodekit.image.contents import BadArchive, Contents, check_expected, parse_expect, read_contents
from nodekit.ship.codecs import codec_for_file
from nodekit.ship.engines import source_of
from nodekit.ship.layers import WithoutLayers, from_store
from nodekit.ship.outcome import answer_deadline, answered_within, no_answer
from nodekit.ship.plan import LayerPlan, plan_layers, short_id, size_text
from nodekit.ship.scan import gunzipped, scan
from nodekit.ship.stream import (
    PROGRESS_EVERY_S,
    Counted,
    compressed,
    decompressed_zstd,
    diagnose_load_failure,
    zstd_here,
)
from nodekit.system import docker
from nodekit.system.files import not_a_file
from nodekit.system.progress import Reporter

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Saved:
    path: Path
    ref: str
    image_id: str
    bytes: int
    seconds: float
    layers: LayerPlan | None = None
    """For an incremental save: the layers written and the ones left out."""


def save(
    ref: str,
    path: Path,
    reporter: Reporter,
    *,
    endpoint: str | None = None,
    have: frozenset[str] | None = None,
    store: Path | None = None,
) -> Saved:
    """Write ``docker save REF`` to ``path`` (compressed as its suffix says), atomically: a failed or
    interrupted save leaves no file at ``path``. With ``have`` (chain ids, from ``nodekit layers`` on the node
    that will load it), the layer files whose chain is in ``have`` are left out; when the project's blob
    ``store`` holds every other file (a code change), the archive is written from it, without ``docker save``."""
    codec = codec_for_file(path)
    if codec == "zstd" and not zstd_here():
        raise UsageError("saving .tar.zst needs the zstd command", fix="apt-get install zstd, or save to .tar.gz")
    info = docker.require_image(ref, endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if codec == "none" and free < info.size:
        raise ShipError(
            f"{path.parent} has {size_text(free)} free, {ref} needs about {size_text(info.size)}",
            fix="save to another directory, or to .tar.zst (compressed)",
        )
    plan = None
    cached = None
    if have is not None:
        src = source_of(ref, endpoint, store=store)
        plan = plan_layers(src.layers, have)
        cached = from_store(src, plan.skip_ids)
    what = plan.to_text() if plan is not None else size_text(info.size)
    origin = ", from the build's blob store" if cached is not None else ""
    reporter.step(f"saving {ref} ({what}{origin}) to {path}")
    tmp = path.with_name(f".{path.name}.partial")
    t0 = time.monotonic()
    stream = docker.SaveStream(ref, endpoint) if cached is None else None
    last = 0.0
    try:
        skip = plan.skip_ids if plan is not None else frozenset()
        if stream is None:
            assert cached is not None
            counted = Counted(cached)
        else:
            counted = Counted(WithoutLayers(stream, skip) if skip else stream)
        with open(tmp, "wb") as f:
            for chunk in compressed(counted, codec):
                f.write(chunk)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    reporter.detail(f"{size_text(counted.n)} of {size_text(info.size)}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise ShipError(
            f"cannot write {path}: {e.strerror or e}", fix="check the directory and its free space"
        ) from None
    except tarfile.TarError as e:
        raise ShipError(f"docker save {ref} did not write a whole archive: {e}", fix="nodekit save again") from None
    finally:
        if stream is not None:
            stream.close()
        tmp.unlink(missing_ok=True)
    saved = Saved(
        path=path, ref=ref, image_id=info.id, bytes=path.stat().st_size, seconds=time.monotonic() - t0, layers=plan
    )
    reporter.done(f"saved {ref} ({short_id(info.id)}) to {path}: {size_text(saved.bytes)} in {saved.seconds:.1f} s")
    return saved


@dataclass(frozen=True)
class LoadedFile:
    path: Path
    images: tuple[tuple[str, str], ...]
    """(reference or id, image id) for each image the file held."""
    seconds: float


GZIP_MAGIC = b"\x1f\x8b"


def load(path: Path, reporter: Reporter, *, endpoint: str | None = None, expect_id: str | None = None) -> LoadedFile:
    """``docker load`` a file written by ``nodekit save`` (or ``docker save``, plain or compressed) into the
    engine at ``endpoint``. A corrupt or truncated file changes no image there.

    The file is read on its way to the engine and checked before the engine acts on it (:mod:`nodekit.ship.scan`):
    with ``expect_id`` (12 to 64 hex digits of the id ``nodekit save`` printed, on either store) it must hold
    exactly that image, tagged at most once, alike for both stores, or nothing is loaded. Should the engine still
    tag an image the file did not describe, every tag the file names is put back where it was."""
    expect = None
    if expect_id is not None:
        expect = parse_expect(expect_id)
        if expect is None:
            raise UsageError(
                f"--expect {expect_id!r} is not an image id",
                fix="pass at least 12 hex digits of the id nodekit save printed (sha256: optional)",
            )
    where = endpoint or "this engine"
    why = not_a_file(path)
    if why is not None:
        raise UsageError(
            f"{path} {why}", fix="pass a file nodekit save wrote (nodekit save it on the node that has the image)"
        )
    facts = docker.engine_facts(endpoint)
    size = path.stat().st_size
    reporter.step(f"loading {path} ({size_text(size)}) into {where}")
    with open(path, "rb") as f:
        magic = f.read(4)
    zstd = magic == ZSTD_MAGIC
    if zstd and not zstd_here():
        raise UsageError(f"loading {path} (zstd) needs the zstd command here", fix="apt-get install zstd")
    t0 = time.monotonic()
    sink = docker.LoadSink(endpoint)
    progress: dict[str, float] = {"read": 0, "last": 0.0}

    def chunks(f: BinaryIO) -> Iterator[bytes]:
        while chunk := f.read(docker.CHUNK):
            progress["read"] += len(chunk)
            if time.monotonic() - progress["last"] >= PROGRESS_EVERY_S:
                progress["last"] = time.monotonic()
                reporter.detail(f"{size_text(progress['read'])} of {size_text(size)}")
            yield chunk

    try:
        with open(path, "rb") as f:
            # Decompressed here, so that what the engine loads is what was checked (and zstd never by the engine:
            # ZSTD_LOAD_CRASH).
            raw = chunks(f)
            plain = decompressed_zstd(raw) if zstd else gunzipped(raw) if magic[:2] == GZIP_MAGIC else raw
            scanned = scan(plain, sink.write)
        contents = read_contents(scanned.members)
        if expect is not None:
            check_expected(contents, expect)
        before = {tag: docker.image_info(tag, endpoint) for tag in contents.tags}
        scanned.release()
        answer = answer_deadline(size * 4 if zstd or magic[:2] == GZIP_MAGIC else size)
        with answered_within(sink, answer) as late:
            try:
                loaded = sink.finish()
            except NodekitError:
                if not late.is_set():
                    raise
        if late.is_set():
            raise no_answer(where, endpoint or "unix:///var/run/docker.sock", answer)
    except BadArchive as e:
        sink.abort()
        raise ShipError(
            f"{path} was not loaded: {e}", fix="load the file saved from the right image (nodekit save prints its id)"
        ) from None
    except tarfile.TarError as e:
        sink.abort()
        raise ShipError(
            f"{path} is corrupt or truncated; nothing was loaded ({e})",
            fix="nodekit save the image again on the node that has it, and copy the whole file",
            node=endpoint,
        ) from None
    except NodekitError as e:
        sink.abort()
        known = _load_failure(e, path, where, endpoint)
        if known is None:
            raise
        raise known from None
    except BaseException:
        sink.abort()
        raise
    _check_tags(path, contents, expect, before, facts.containerd_store, endpoint, reporter)
    images = []
    for name in (*loaded.refs, *loaded.ids):
        info = docker.image_info(name, endpoint)
        if info is None:
            raise ShipError(f"docker load reported {name} but {where} does not have it", fix="nodekit load again")
        images.append((name, info.id))
    seconds = time.monotonic() - t0
    for n, i in images:
        reporter.done(f"loaded {n} ({short_id(i)}) into {where} in {seconds:.1f} s")
    return LoadedFile(path=path, images=tuple(images), seconds=seconds)


def _check_tags(
    path: Path,
    contents: Contents,
    expect: str | None,
    before: Mapping[str, docker.ImageInfo | None],
    containerd_store: bool,
    endpoint: str | None,
    reporter: Reporter,
) -> None:
    """Every tag the file names must now name one of its images (the expected one, with ``expect``), by the id this
    store gives it (or, where the store composes the manifest itself, by its identity); else each of them is put back
    where it was."""
    mine = [i for i in contents.images if expect is None or i.is_(expect)]
    ids = {i.id_on(containerd_store) for i in mine} - {None}
    unknown = {i.identity for i in mine if i.id_on(containerd_store) is None}
    wrong = []
    for tag, was in before.items():
        now = docker.image_info(tag, endpoint)
        if now is None or not (now.id in ids or now.identity in unknown):
            wrong.append(f"{tag} is {short_id(now.id) if now else 'gone'}")
        elif was is not None and was.id != now.id:
            reporter.warn(f"{tag} named {short_id(was.id)} before; it now names {short_id(now.id)}")
    if not wrong:
        return
    for tag, was in before.items():
        if was is not None:
            docker.tag_image(was.id, tag, endpoint)
        else:
            docker.remove_image(tag, endpoint)
    raise ShipError(
        f"after loading {path}, {', '.join(wrong)}, which the file did not describe; every tag it names was put back",
        fix="load a file nodekit save wrote, and compare `docker image inspect` of the tags it names",
        node=endpoint,
    )


def _load_failure(e: NodekitError, path: Path, where: str, endpoint: str | None) -> ShipError | None:
    """What a failed ``docker load`` of ``path`` into ``where`` means, said for a file; None when its cause is
    none of the known ones (the error is then raised as it is)."""
    kind = diagnose_load_failure(e.message)
    if kind == "missing layer":
        # An incremental file (nodekit save --have) leaves out layers; docker load opens a left-out one only
        # when this engine lacks it.
        return ShipError(
            f"{path} leaves out layers that {where} does not have (it was saved incrementally against another "
            f"engine's layer list); nothing was loaded ({e.message})",
            fix="nodekit layers > FILE on this node, then nodekit save --have FILE on the node with the image",
            node=endpoint,
        )
    if kind == "corrupt":
        return ShipError(
            f"{path} is corrupt or truncated; {where} discarded it ({e.message})",
            fix="nodekit save the image again on the node that has it, and copy the whole file",
            node=endpoint,
        )
    if kind == "disk":
        return ShipError(
            f"{where} ran out of disk space loading {path}: {e.message}",
            fix="free space for Docker (docker system prune); existing images are untouched",
            node=endpoint,
        )
    return None
