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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from nodekit.image.contents import BadArchive

HOLD = 1 << 20
"""Bytes held back from the engine until the archive is checked: more than tarfile reads ahead of the member it is
on (one record, 10 KiB), so the end of the archive is always among them."""
KEEP = 4 << 20
"""Members up to this size are kept in memory (every manifest, config and index is far smaller)."""
KEEP_TOTAL = 64 << 20
"""At most this much of them in all; a small member beyond it is refused if the archive names it as a config or a
manifest (it would be a strange archive: thousands of small layers)."""


class _Passing:
    """``read(n)`` for tarfile over ``chunks``; every byte read is passed to ``forward``, HOLD bytes behind."""

    def __init__(self, chunks: Iterable[bytes], forward: Callable[[bytes], None]) -> None:
        self._it = iter(chunks)
        self._forward = forward
        self._ahead = bytearray()  # read from chunks, not yet by tarfile
        self.held = bytearray()  # read by tarfile, not yet forwarded
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._ahead) < n:
            try:
                self._ahead += next(self._it)
            except StopIteration:
                break
        n = len(self._ahead) if n < 0 else min(n, len(self._ahead))
        out = bytes(self._ahead[:n])
        del self._ahead[:n]
        self.n += n
        self.held += out
        if len(self.held) > 2 * HOLD:
            self._forward(bytes(self.held[:-HOLD]))
            del self.held[:-HOLD]
        return out

    def only_zeros_left(self) -> bool:
        """Read the rest of the stream without passing it on: whether it is all zeros (a tar's padding)."""
        clean = not any(self._ahead)
        self._ahead.clear()
        for c in self._it:
            clean = clean and not any(c)
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
    with tarfile.open(fileobj=passing, mode="r|") as tar:  # type: ignore[call-overload]
        end = _members(tar, members, skipped)
    tail = bytes(passing.held)
    start = len(tail) - (passing.n - end)
    assert start >= 0, "tarfile read further ahead than HOLD"
    if any(tail[start:]) or not passing.only_zeros_left():
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
