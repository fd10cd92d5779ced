"""Leaving out of a ``docker save`` stream the layer files a target already has, on the fly.

:class:`WithoutLayers` reads the archive as it streams (``tarfile`` in stream mode, nothing on disk, memory bounded
by one chunk) and writes it back member by member, dropping ``blobs/sha256/<hex>`` for every diff id it is told to
skip; ``manifest.json``, ``index.json``, the image config and the other layers pass unchanged.

Why the result loads to the same image: Docker's classic (graphdriver) ``docker load`` (image/tarexport/load.go)
reads manifest.json and the config, then for each diff id looks the layer's chain id up in its layer store and
opens the layer file only when the chain is missing. A file it opens is registered through the layer store, which
computes the sha256 of the uncompressed tar as it applies it and refuses the image when it differs from the diff
id (``invalid diffID for layer``), so every layer that travels is checked by digest. Docker 25 and later write
layers as ``blobs/sha256/<diff id hex>``; older engines' ``<id>/layer.tar`` names do not match, and the archive
then passes whole (correct, just not smaller).
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterable, Iterator

from nodekit.image import append
from nodekit.image.blobs import BlobStore
from nodekit.ship.plan import Source

BLOCK, CHUNK = append.BLOCK, append.CHUNK


class _Reader:
    """A file-like ``read(n)`` over an iterator of chunks (what ``tarfile`` in stream mode reads from)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = bytearray()
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self.n += len(out)
        return out


class WithoutLayers:
    """The archive ``chunks`` with the files of the layers ``skip`` (diff ids) left out. Iterate once; afterwards
    ``skipped`` names the diff ids actually left out and ``skipped_bytes`` their size. A stream that is not a tar
    archive, or ends early, raises ``tarfile.TarError`` (the caller cuts the targets off)."""

    def __init__(self, chunks: Iterable[bytes], skip: frozenset[str]) -> None:
        self._reader = _Reader(chunks)
        self._names = {append.blob_name(d): d for d in skip}
        self.skipped: list[str] = []
        self.skipped_bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        # ignore_zeros=False: the two zero blocks end the archive, as they end docker save's.
        with tarfile.open(fileobj=self._reader, mode="r|", bufsize=CHUNK) as tar:  # type: ignore[call-overload]
            for member in tar:
                if member.name in self._names and member.isfile():
                    self.skipped.append(self._names[member.name])
                    self.skipped_bytes += member.size
                    continue  # stream mode skips the member's data when the next header is read
                yield member.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
                if member.isfile() and member.size:
                    data = tar.extractfile(member)
                    assert data is not None
                    left = member.size
                    while left:
                        piece = data.read(min(CHUNK, left))
                        if not piece:
                            raise tarfile.ReadError(f"{member.name} ends early")
                        left -= len(piece)
                        yield piece
                    if pad := -member.size % BLOCK:
                        yield bytes(pad)
        yield bytes(2 * BLOCK)


def from_store(src: Source, skip: frozenset[str]) -> Iterator[bytes] | None:
    """The archive of ``src`` without the layer files ``skip``, composed from the blob store ``nodekit build``
    wrote (its config and code layer; see :mod:`nodekit.image.append`), or None when the store cannot give every file
    that must travel: then ``docker save`` does. Every blob is checked against its digest before it is used."""
    if not src.from_store(skip) or src.blob_store is None:
        return None
    store = BlobStore(src.blob_store)
    config = store.read_verified(src.image_id)
    if config is None:
        return None
    files = {}
    for layer in src.layers:
        if layer.diff_id in skip or layer.diff_id in files:
            continue
        path = store.verified_path(layer.diff_id)
        if path is None:
            return None
        files[layer.diff_id] = path
    # An image named by its id is loaded untagged, as docker save writes it.
    named = not re.fullmatch(r"(sha256:)?[0-9a-f]{6,64}", src.ref)
    return append.archive(config, src.image_id, src.ref if named else None, files)
