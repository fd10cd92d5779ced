"""An image archive read on its way to ``docker load``, so that it is checked before the engine acts on it.

:func:`scan` reads a plain tar stream, passes it on to the load as it goes and keeps the small files (manifests,
configs, the index) for :func:`nodekit.image.contents.read_contents`. It holds back the stream's last
:data:`HOLD` bytes: neither store acts on an archive before its end (the classic store unpacks the whole tar first,
the containerd store creates its images after the last member), and the end of the last member and the end-of-archive
blocks are among the bytes held back. A file that is refused is then cut off (``LoadSink.abort``) and the engine
discards it; no tag has moved. The engine loads exactly the bytes that were checked, so a file rewritten meanwhile
(on a shared path) cannot slip in between a check and a load.

What the two stores could read differently from Python's :mod:`tarfile` is refused: a name twice, a link, a special
or sparse file, anything but zeros after the end of the archive.
"""

from __future__ import annotations

import tarfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from nodekit.image.contents import BadArchive

READ = 256 << 10
"""tarfile's reads (its buffer): it skips a layer's data in reads of this size, and reads at most this far ahead."""
HOLD = 1 << 20
"""Bytes held back from the engine until the archive is checked: more than tarfile reads ahead (:data:`READ`), so
the end of the archive is always among them."""
KEEP = 4 << 20
"""Members up to this size are kept in memory (every manifest, config and index is far smaller)."""
KEEP_TOTAL = 64 << 20
"""At most this much of them in all; a small member beyond it is refused if the archive names it as a config or a
manifest (it would be a strange archive: thousands of small layers)."""


class _Passing:
    """``read(n)`` for tarfile over ``chunks``. A chunk tarfile has read to its end is passed to ``forward`` once
    HOLD bytes read after it are held back; the bytes tarfile has not read yet are never passed on. Linear in the
    stream's size: tarfile skips a layer's data in reads of its buffer size."""

    def __init__(self, chunks: Iterable[bytes], forward: Callable[[bytes], None]) -> None:
        self._it = iter(chunks)
        self._forward = forward
        self._cur = b""  # the chunk tarfile is reading, up to _pos
        self._pos = 0
        self._held: deque[bytes] = deque()  # chunks read to their end, not yet passed on
        self._held_n = 0
        self.n = 0  # bytes tarfile has read

    def read(self, n: int = -1) -> bytes:
        if 0 < n <= len(self._cur) - self._pos:  # the common case: within the chunk, one copy
            self._pos += n
            self.n += n
            return self._cur[self._pos - n : self._pos]
        parts = []
        while n != 0:
            if self._pos == len(self._cur):
                self._retire()
                try:
                    self._cur, self._pos = next(self._it), 0
                except StopIteration:
                    self._cur, self._pos = b"", 0
                    break
                continue
            take = len(self._cur) - self._pos if n < 0 else min(n, len(self._cur) - self._pos)
            parts.append(self._cur[self._pos : self._pos + take])
            self._pos += take
            self.n += take
            n -= take if n > 0 else 0
        return b"".join(parts)

    def _retire(self) -> None:
        if self._cur:
            self._held.append(self._cur)
            self._held_n += len(self._cur)
        while self._held and self._held_n - len(self._held[0]) >= HOLD:
            first = self._held.popleft()
            self._held_n -= len(first)
            self._forward(first)

    def held(self) -> bytes:
        """What tarfile read that was not passed on (at least its last HOLD bytes, or all of it)."""
        return b"".join(self._held) + self._cur[: self._pos]

    def only_zeros_left(self) -> bool:
        """Read the rest of the stream without passing it on: whether it is all zeros (a tar's padding)."""
        clean = not self._cur[self._pos :].strip(b"\0")
        self._cur, self._pos = b"", 0
        for c in self._it:
            clean = clean and not c.strip(b"\0")
        return clean


@dataclass
class Scanned:
    """The small members of an archive (normalized name -> bytes) and the end of its stream, held back."""

    members: dict[str, bytes]
    held: bytes
    forward: Callable[[bytes], None]
    skipped: set[str] = field(default_factory=set)

    def release(self) -> None:
        """Pass the held-back end on: the engine then loads the archive."""
        self.forward(self.held)


def _name(name: str) -> str:
    import posixpath

    return posixpath.normpath("/" + name).lstrip("/")


def _members(tar: tarfile.TarFile, members: dict[str, bytes], skipped: set[str]) -> int:
    """Read every member of ``tar``, keeping the small ones; returns where the archive ends."""
    kept = 0
    seen: set[str] = set()
    for m in tar:
        name = _name(m.name)
        if name in seen:
            raise BadArchive(f"it holds {name} twice")
        seen.add(name)
        if m.isdir():
            continue
        if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or m.issparse():
            raise BadArchive(f"its {name} is a link or a special file (docker save writes none)")
        if m.size <= KEEP and kept + m.size <= KEEP_TOTAL:
            f = tar.extractfile(m)
            assert f is not None
            data = f.read()
            if len(data) != m.size:
                raise tarfile.ReadError(f"unexpected end of data in {name}")
            members[name] = data
            kept += m.size
        else:
            skipped.add(name)
    return tar.offset


def scan(chunks: Iterable[bytes], forward: Callable[[bytes], None]) -> Scanned:
    """Read the plain tar stream ``chunks``, passing all of it but the held-back end to ``forward``. Raises
    BadArchive for a stream the stores could read differently, tarfile.TarError for one that is not a whole tar."""
    passing = _Passing(chunks, forward)
    members: dict[str, bytes] = {}
    skipped: set[str] = set()
    with tarfile.open(fileobj=passing, mode="r|", bufsize=READ) as tar:  # type: ignore[call-overload]
        end = _members(tar, members, skipped)
    tail = passing.held()
    start = len(tail) - (passing.n - end)
    assert start >= 0, "tarfile read further ahead than HOLD"
    if tail[start:].strip(b"\0") or not passing.only_zeros_left():
        raise BadArchive("it goes on after the end of the archive")
    return Scanned(members, tail, forward, skipped)


def gunzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """``chunks`` of a gzip stream (one or more members), decompressed. Raises tarfile.ReadError when it is
    corrupt or cut short."""
    import zlib

    z, fed = zlib.decompressobj(31), False
    try:
        for c in chunks:
            while c or fed:
                fed = fed or bool(c)
                # Bounded output: a small file that inflates to gigabytes comes out a chunk at a time.
                out = z.decompress(c, KEEP)
                c = z.unconsumed_tail
                if out:
                    yield out
                if z.eof:
                    c, z, fed = z.unused_data, zlib.decompressobj(31), False
                elif not c and not out:
                    break
    except zlib.error as e:
        raise tarfile.ReadError(f"the gzip stream is corrupt ({e})") from None
    if fed and not z.eof:
        raise tarfile.ReadError("the gzip stream is cut short")
