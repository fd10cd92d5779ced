"""The image stream's plumbing: counting, compressing, and reading what a failed ``docker load`` said.

:func:`compressed` turns ``docker save``'s chunks into a gzip (in-process) or zstd (the zstd command, fed from a
thread so neither side blocks) stream; a failing compressor raises ShipError. :func:`zstd_here` says whether this
machine has the zstd command. :class:`Counted` measures progress against the image's uncompressed size.
:func:`diagnose_load_failure` is pure: it classifies ``docker load``'s last line as a full disk, a corrupt stream
or something else. Opening the save and load ends is :mod:`nodekit.system.docker`'s.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import zlib
from collections.abc import Iterable, Iterator
from typing import Literal

from nodekit.errors import ShipError
from nodekit.ship.codecs import Codec
from nodekit.system import docker, proc

PROGRESS_EVERY_S = 2.0


class Counted:
    """Counts the bytes of the uncompressed stream (progress is measured against the image's size)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.n = 0

    def __iter__(self) -> Iterator[bytes]:
        for c in self._chunks:
            self.n += len(c)
            yield c


def zstd_here() -> bool:
    return shutil.which("zstd") is not None


# On the node: zstd decompresses, then the node's own docker CLI loads into its default engine (the one that
# `docker -H ssh://node` reaches: its system dial-stdio talks to that same socket).
UNZSTD_LOAD = "zstd -dcq | docker load -q"


def unzstd_sink(endpoint: str) -> docker.LoadSink:
    """A load on the ``ssh://`` node of ``endpoint`` that takes a zstd stream: decompressed there by its zstd
    command, never by its engine (:data:`nodekit.ship.codecs.ZSTD_LOAD_CRASH`)."""
    from urllib.parse import urlsplit

    from nodekit.system import ssh

    parts = urlsplit(endpoint)
    argv = ssh.command(parts.hostname or "", UNZSTD_LOAD, connect_timeout=10, port=parts.port, user=parts.username,
                       lend_nothing=True)  # fmt: skip
    return docker.LoadSink(endpoint, argv=argv)


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


def decompressed_zstd(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks`` of a zstd stream, decompressed here by the zstd command (so no engine has to: see
    :data:`nodekit.ship.codecs.ZSTD_LOAD_CRASH`). A truncated or corrupt stream raises ShipError at its end."""
    yield from _through(["zstd", "-q", "-d", "-c"], chunks, doing="decompressing")


def _through(argv: list[str], chunks: Iterable[bytes], *, doing: str = "compressing") -> Iterator[bytes]:
    """Pipe ``chunks`` through a filter command, feeding it from a thread so neither side blocks."""
    child = proc.start(argv, deadline=proc.Unbounded("a filter of the image stream: ends with its input"),
                       what=argv[0], stdin="pipe", stdout="pipe", stderr="devnull",
                       stop_with=signal.SIGKILL)  # fmt: skip
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            for c in chunks:
                stdin.write(c)
        except BaseException as e:
            failed.append(e)
            child.kill()
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        while out := stdout.read(docker.CHUNK):
            yield out
        feeder.join()
        code = child.wait()
        if failed:
            raise failed[0]
        if code != 0:
            raise ShipError(f"{argv[0]} exited with code {code} while {doing} the image stream")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stdout.close()


def diagnose_load_failure(
    docker_says: str,
) -> Literal["disk", "missing layer", "corrupt", "unreachable", "other"]:
    """Classify the last line of a failed ``docker load``. "missing layer": the archive left out a layer file (an
    incremental save, or a push that skipped what the target had) and the engine, lacking that layer, looked for it.
    "unreachable": the docker CLI never got through to the engine (its ssh or TCP connection failed).
    """
    low = docker_says.lower()
    if "error during connect" in low or "cannot connect to the docker daemon" in low:
        return "unreachable"
    if "no space left" in low or "disk quota" in low:
        return "disk"
    if "blobs/sha256/" in low and "no such file" in low:
        return "missing layer"
    corrupt = ("unexpected eof", "invalid tar", "archive/tar", "gzip", "zstd", "magic number", "checksum",
               "diffid", "manifest.json", "invalid argument", "unexpected end", "does not match", "digest")  # fmt: skip
    if any(c in low for c in corrupt):
        return "corrupt"
    return "other"
