"""The stream's frames into staging, hashed as they are written: the part of the receiver
(:mod:`nodekit.launcher.datasync.receive`) that every byte of a push goes through. Standard library only.

Per content a line ``<hash> <size>`` and that many bytes, then ``END``. Each content lands in staging as a ``.part``
file and is renamed to its hash only when the bytes written hash to it. What costs per byte is kept to one copy out
of the stream and one into the file: a content over :data:`INLINE` is read straight into its piece's buffer (no
joins, no copies to hand a piece to a hashing thread), written from it, and hashed from it on a thread. What costs
per file is kept off the hashing threads: a small content is hashed where it is read and settled at once.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO, Protocol

from nodekit.launcher.datacheck.filehash import CHUNK
from nodekit.launcher.datacheck.manifest import PIECE

BROKEN = 5


class Broken(Exception):
    code = BROKEN


class Reader(Protocol):
    """The stream: a buffered binary reader (standard input, a fifo opened by the relay step, io.BytesIO)."""

    def read(self, size: int = -1, /) -> bytes: ...
    def readline(self, size: int = -1, /) -> bytes: ...
    def readinto(self, buffer: memoryview, /) -> int | None: ...


INLINE = CHUNK
"""A content up to this size is hashed on the thread that reads the stream: handing one small file to a hashing
thread costs more than hashing it, and a dataset of 20,000 small files would pay that 20,000 times."""
HASH_THREADS = max(2, min(8, os.cpu_count() or 1))
"""Pieces are hashed on threads while the stream goes on (hashlib releases the GIL): sha256 runs at 1,452 MiB/s on
one quiet core of the reference machine (440 MiB/s with its cores shared), below a 10 GbE link, so one thread hashing
would set the pace."""
IN_FLIGHT = 2 * HASH_THREADS
"""Pieces (at most 32 MiB each) read but not hashed yet: the memory the receiver holds is bounded by this."""


def staged_name(h: str) -> str:
    return h.replace(":", "_")


def digest(data: bytes | bytearray) -> bytes:
    return hashlib.sha256(data).digest()


def _settle(stage: str, h: str, size: int, part: str, pieces: list[bytes]) -> None:
    """Rename a received content to its hash once its pieces' hashes prove it; Broken (the .part removed) if not."""
    got = "p:" + hashlib.sha256(b"".join(pieces)).hexdigest() if size > PIECE else pieces[0].hex()
    if got != h:
        os.unlink(part)
        raise Broken(f"content {h[:16]} arrived damaged or changed at the source during the push (got {got[:16]})")
    os.replace(part, os.path.join(stage, staged_name(h)))


class _Stage:
    """Staging being filled: the big contents whose pieces are still hashing, in arrival order, and the damage
    found so far (the stream is read to its end; the first damage is raised then)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.pending: list[tuple[str, int, str, list[Future[bytes]]]] = []
        self.damaged: list[Broken] = []

    def settle(self, h: str, size: int, part: str, pieces: list[bytes]) -> None:
        try:
            _settle(self.stage, h, size, part, pieces)
        except Broken as e:
            self.damaged.append(e)

    def settle_hashed(self, all_of_them: bool) -> None:
        while self.pending and (all_of_them or all(p.done() for p in self.pending[0][3])):
            h, size, part, futures = self.pending.pop(0)
            self.settle(h, size, part, [f.result() for f in futures])


def receive(stage: str, f: Reader, incoming: Mapping[str, int], passing: Mapping[str, int]) -> int:
    """Each incoming content into ``stage``, hashed as written (pieces on threads); bytes received. A content in
    ``passing`` (a relay tree's stream carries it for other nodes) is read past, never written."""
    staging = _Stage(stage)
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        try:
            total = _frames(f, incoming, passing, staging, pool)
        finally:  # a stream cut short keeps the contents that arrived whole, for the next push
            staging.settle_hashed(True)
    if staging.damaged:
        raise staging.damaged[0]
    return total


def _frames(
    f: Reader, incoming: Mapping[str, int], passing: Mapping[str, int], staging: _Stage, pool: ThreadPoolExecutor
) -> int:
    room = threading.BoundedSemaphore(IN_FLIGHT)
    total = 0
    while True:
        line = f.readline(200).decode("ascii", "replace").split()
        if line == ["END"]:
            return total
        h, size = (line[0], int(line[1])) if len(line) == 2 and line[1].isdigit() else ("", -1)
        if h not in incoming and passing.get(h) == size:
            for at in range(0, size, CHUNK):
                exactly(f, min(CHUNK, size - at))
            continue
        if incoming.get(h) != size:
            raise Broken(f"a frame that the plan does not announce: {' '.join(line)[:100]!r}")
        part = os.path.join(staging.stage, staged_name(h) + ".part")
        if size <= INLINE:
            data = exactly(f, size)
            _write_small(part, data)
            staging.settle(h, size, part, [digest(data)])
        else:
            with open(part, "wb") as out:
                futures = _pieces(f, out, size, pool, room)
            staging.pending.append((h, size, part, futures))
            staging.settle_hashed(False)
        total += size


FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def _write_small(part: str, data: bytes) -> None:
    """``data`` as the file ``part``, created as ``open(part, "wb")`` does (mode 0o666 less the umask) but with one
    system call per step: no buffered file object made and thrown away per small content."""
    fd = os.open(part, FLAGS, 0o666)
    try:
        with memoryview(data) as view:
            at = 0
            while at < len(view):  # a write may take less than it is given (a signal, a full disk's last blocks)
                at += os.write(fd, view[at:])
    finally:
        os.close(fd)


def _pieces(
    f: Reader, out: BinaryIO, size: int, pool: ThreadPoolExecutor, room: threading.BoundedSemaphore
) -> list[Future[bytes]]:
    """A big content's bytes from ``f`` into ``out``, each piece read into a buffer of its own and handed as it is
    to a hashing thread (the buffer is never written again)."""
    futures: list[Future[bytes]] = []
    for start in range(0, size, PIECE):
        buf = bytearray(min(PIECE, size - start))
        with memoryview(buf) as view:
            at = 0
            while at < len(buf):
                got = f.readinto(view[at : at + CHUNK])
                if not got:
                    raise Broken(f"the stream ended {size - start - at} bytes short of a content")
                out.write(view[at : at + got])
                at += got
        room.acquire()
        fut = pool.submit(digest, buf)
        fut.add_done_callback(lambda _: room.release())
        futures.append(fut)
    return futures


def exactly(f: Reader, size: int) -> bytes:
    data = f.read(size)
    while len(data) < size and (more := f.read(size - len(data))):
        data += more
    if len(data) < size:
        raise Broken(f"the stream ended {size - len(data)} bytes short of a content")
    return data
