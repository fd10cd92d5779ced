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
from pathlib import Path
from typing import IO

from nodekit.image import archive
from nodekit.image.archive import BLOCK, CHUNK, ChunkReader, Member, blob_name
from nodekit.image.blobs import BlobStore
from nodekit.ship.plan import Source
from nodekit.system import docker


class WithoutLayers:
    """The archive ``chunks`` with the files of the layers ``skip`` (diff ids) left out. Iterate once; afterwards
    ``skipped`` names the diff ids actually left out and ``skipped_bytes`` their size. A stream that is not a tar
    archive, or ends early, raises ``tarfile.TarError`` (the caller cuts the targets off)."""

    def __init__(self, chunks: Iterable[bytes], skip: frozenset[str]) -> None:
        self._reader = ChunkReader(chunks)
        self._names = {blob_name(d): d for d in skip}
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
    """The archive of ``src`` without the layers ``skip``, composed from the blob store ``nodekit build`` wrote (every
    layer above the base; see :mod:`nodekit.image.layers`) and, for base layers a target lacks, from a ``docker
    save`` of the base alone; or None when that cannot give every file that must travel (then ``docker save`` of the
    image does). Every blob from the store is checked against its digest before it is used."""
    if not src.from_store(skip) or src.blob_store is None:
        return None
    store = BlobStore(src.blob_store)
    image = store.image(src.image_id)
    if image is None:
        return None
    files, from_base = {}, set()
    for i, (diff_id, desc) in enumerate(zip(image.diff_ids, image.layers, strict=True)):
        if diff_id in skip or desc.digest in files:
            continue
        path = store.verified_path(desc.digest)
        if path is not None:
            files[desc.digest] = path
        elif src.base_ref is not None and i < image.base_layers:
            from_base.add(desc.digest)
        else:
            return None  # a layer of nodekit's that the store lost (or that was damaged): docker save of the image
    # An image named by its id is loaded untagged, as docker save writes it.
    named = not re.fullmatch(r"(sha256:)?[0-9a-f]{6,64}", src.ref)
    ref = src.ref if named else None
    if not from_base:
        return archive.archive(image, ref, files)
    return _with_base(image, ref, files, src, from_base)


def _with_base(
    image: archive.Image, ref: str | None, files: dict[str, Path], src: Source, wanted: set[str]
) -> Iterator[bytes]:
    """The archive with the base's layers ``wanted`` read out of ``docker save`` of the base (on the source engine)
    as it streams: only the base is read, never the image above it."""
    assert src.base_ref is not None
    save = docker.SaveStream(src.base_ref, src.endpoint)
    try:
        members = _blobs_of(save, wanted)
        yield from archive.archive(image, ref, files, members)
    finally:
        save.close()


def _blobs_of(chunks: Iterable[bytes], wanted: set[str]) -> Iterator[Member]:
    """The blobs ``wanted`` of a ``docker save`` stream, each handed out while the stream stands at it (its bytes
    must be read before the next is asked for). ShipError when the save lacks one."""
    from nodekit.errors import ShipError

    left = set(wanted)
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|", bufsize=CHUNK) as tar:  # type: ignore[call-overload]
        for member in tar:
            digest = "sha256:" + member.name.rsplit("/", 1)[-1]
            if not member.isfile() or not member.name.startswith("blobs/sha256/") or digest not in left:
                continue
            left.discard(digest)
            data = tar.extractfile(member)
            assert data is not None
            yield Member(digest, member.size, _read_all(data))
    if left:
        raise ShipError(f"docker save of the base image {src_name(left)} lacks layers the image names")


def _read_all(f: IO[bytes]) -> Iterator[bytes]:
    while piece := f.read(CHUNK):
        yield piece


def src_name(left: set[str]) -> str:
    return ", ".join(sorted(d[7:19] for d in left))
