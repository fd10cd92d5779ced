"""Images as files, for nodes that share a file system: :func:`save` writes one, :func:`load` reads one.

:func:`save` writes ``docker save`` compressed as the file's suffix says (:func:`nodekit.ship.plan.codec_for_file`),
atomically: a failed or interrupted save leaves no file at the path. :func:`load` streams a file (plain or
compressed) into ``docker load``; a corrupt or truncated file changes no image on the engine, and with ``expect_id``
the file must hold that image.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from nodekit import docker
from nodekit.errors import NodekitError, ShipError, UsageError
from nodekit.progress import Reporter
from nodekit.ship.plan import codec_for_file, short_id, size_text
from nodekit.ship.stream import PROGRESS_EVERY_S, Counted, compressed, diagnose_load_failure, zstd_here


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
            f"{path.parent} has {size_text(free)} free, {ref} needs about {size_text(info.size)}",
            fix="save to another directory, or to .tar.zst (compressed)",
        )
    reporter.step(f"saving {ref} ({size_text(info.size)}) to {path}")
    tmp = path.with_name(f".{path.name}.partial")
    t0 = time.monotonic()
    stream = docker.SaveStream(ref, endpoint)
    last = 0.0
    try:
        counted = Counted(stream)
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
    finally:
        stream.close()
        tmp.unlink(missing_ok=True)
    saved = Saved(path=path, ref=ref, image_id=info.id, bytes=path.stat().st_size, seconds=time.monotonic() - t0)
    reporter.done(f"saved {ref} ({short_id(info.id)}) to {path}: {size_text(saved.bytes)} in {saved.seconds:.1f} s")
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
    reporter.step(f"loading {path} ({size_text(size)}) into {where}")
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
                    reporter.detail(f"{size_text(sent)} of {size_text(size)}")
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
    if expect_id is not None and not any(i == expect_id or short_id(i).startswith(expect_id) for _, i in images):
        got = ", ".join(f"{n} {short_id(i)}" for n, i in images) or "nothing"
        raise ShipError(f"{path} held {got}, not {expect_id}", fix="load the file saved from the right image")
    seconds = time.monotonic() - t0
    for n, i in images:
        reporter.done(f"loaded {n} ({short_id(i)}) into {where} in {seconds:.1f} s")
    return LoadedFile(path=path, images=tuple(images), seconds=seconds)
