"""Image archives that load on both of Docker's image stores, written by nodekit from blobs it holds.

An archive here is what ``docker save`` of Docker >= 25 writes, both halves of it: the OCI image layout
(``oci-layout``, ``index.json``, the manifest, config and layer blobs under ``blobs/sha256/``), which the containerd
image store loads, and Docker's own ``manifest.json``, which the classic (graphdriver) store loads. One archive
therefore loads on either store, so one stream can feed a relay chain whose nodes use different stores.

What each store does with a layer the archive leaves out:

- the classic store looks each layer's chain id up in its layer store and opens the layer file only when the chain
  is missing (image/tarexport/load.go): a layer whose chain the engine holds may be left out;
- the containerd store imports the blobs that are there and, when it unpacks the image, applies a layer only when
  the snapshot of its chain is missing (containerd's rootfs.ApplyLayer). A left-out layer whose chain is there
  costs nothing; the image is then complete when the engine's content store already holds that blob too (nodekit's
  own layers always are: it loads them as the blobs named here, uncompressed, digest = diff id).

The manifest is serialized exactly as Docker's classic ``docker save`` serializes the one it composes (field
order, no spaces), so an image nodekit loads gets the same id on a containerd engine as that engine would give the
classic engine's ``docker save`` of it.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
BLOCK = tarfile.BLOCKSIZE
CHUNK = 1 << 20


def blob_name(digest: str) -> str:
    """Where an image archive (``docker save`` of Docker >= 25, the OCI layout) keeps the blob ``digest``."""
    algo, _, hexdigest = digest.partition(":")
    return f"blobs/{algo}/{hexdigest}"


class Writable(Protocol):
    def write(self, data: bytes, /) -> int: ...


class ChunkReader:
    """A file-like ``read(n)`` over an iterator of byte chunks (what ``tarfile`` in stream mode reads from);
    ``n`` counts the bytes read so far."""

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


def chain_ids(diff_ids: Sequence[str]) -> tuple[str, ...]:
    """The chain id of every prefix of ``diff_ids`` (base first), as Docker's layer store and containerd's
    snapshotter name a layer: the first is the first diff id, each next one ``sha256(previous chain id + " " +
    diff id)``. An engine reuses a layer only when the layer *and everything below it* match, which is what a chain
    id identifies."""
    chains: list[str] = []
    for d in diff_ids:
        if not chains:
            chains.append(d)
        else:
            chains.append("sha256:" + hashlib.sha256(f"{chains[-1]} {d}".encode()).hexdigest())
    return tuple(chains)


def chains_of(images: Iterable[Sequence[str]]) -> frozenset[str]:
    """Every chain id an engine holds, given each of its images' diff ids: an engine keeps a layer with the whole
    chain below it, so every prefix of every image is there."""
    return frozenset(c for diff_ids in images for c in chain_ids(diff_ids))


@dataclass(frozen=True)
class Descriptor:
    """One blob of an image as its manifest names it: media type, ``sha256:`` digest of the blob as stored, size.
    nodekit's own layers are uncompressed tars (digest = diff id); a base's layers may be compressed blobs."""

    media_type: str
    digest: str
    size: int

    def to_json(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> Descriptor:
        return cls(str(doc["mediaType"]), str(doc["digest"]), int(str(doc["size"])))


def layer_descriptor(diff_id: str, size: int) -> Descriptor:
    """An uncompressed layer: its blob is the layer tar itself."""
    return Descriptor(LAYER_TAR, diff_id, size)


def manifest_bytes(config_digest: str, config_size: int, layers: Sequence[Descriptor]) -> bytes:
    """Pure: the image manifest, in the bytes Docker writes for it (so its digest is the containerd store's id)."""
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
        "layers": [d.to_json() for d in layers],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _normalized(ref: str) -> str:
    """``nodekit/x:tag`` as containerd names it: ``docker.io/nodekit/x:tag``."""
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return ref
    return f"docker.io/{ref}"


def index_bytes(manifest_digest: str, manifest_size: int, ref: str | None) -> bytes:
    """The OCI layout's index: one manifest, named ``ref`` when given (untagged otherwise, as docker save writes)."""
    entry: dict[str, object] = {"mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": manifest_size}
    if ref:
        tag = ref.rpartition(":")[2] if ":" in ref.rpartition("/")[2] else "latest"
        entry["annotations"] = {"io.containerd.image.name": _normalized(ref), "org.opencontainers.image.ref.name": tag}
    return json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [entry]}).encode()


def member_header(name: str, size: int) -> bytes:
    """A tar header for a regular file (mode 0644, mtime 0), as the archive's members carry."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


@dataclass(frozen=True)
class Member:
    """A blob to put into the archive from elsewhere (a base layer read out of ``docker save``): its digest, its size
    and its bytes, read when the archive reaches it."""

    digest: str
    size: int
    chunks: Iterable[bytes]


def _file_chunks(path: Path, size: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        left = size
        while left:
            piece = f.read(min(CHUNK, left))
            if not piece:
                raise OSError(f"{path} ends early")
            left -= len(piece)
            yield piece


def _member(name: str, size: int, chunks: Iterable[bytes]) -> Iterator[bytes]:
    yield member_header(name, size)
    n = 0
    for c in chunks:
        n += len(c)
        yield c
    if n != size:
        raise OSError(f"{name}: {n} bytes where {size} were announced")
    if pad := -size % BLOCK:
        yield bytes(pad)


@dataclass(frozen=True)
class Image:
    """An image as nodekit holds it: its config bytes and the manifest's layer descriptors (base first). Its ids:
    :attr:`config_digest` (the classic store's image id) and :attr:`manifest_digest` (the containerd store's)."""

    config: bytes
    layers: tuple[Descriptor, ...]

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config).hexdigest()

    @property
    def manifest(self) -> bytes:
        return manifest_bytes(self.config_digest, len(self.config), self.layers)

    @property
    def manifest_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple(json.loads(self.config)["rootfs"]["diff_ids"])

    @property
    def base_layers(self) -> int:
        """How many of the layers, from the bottom, are the base's: those below the first history row nodekit wrote
        (its rows carry the comment "nodekit"; every layer nodekit writes is one of its blobs)."""
        doc = json.loads(self.config)
        made = [row for row in doc.get("history") or [] if not row.get("empty_layer")]
        ours = sum(1 for row in made if row.get("comment") == "nodekit")
        return len(self.layers) - ours if len(made) == len(self.layers) else len(self.layers)

    def id_on(self, containerd_store: bool) -> str:
        """The id an engine with that store gives this image once nodekit loaded it."""
        return self.manifest_digest if containerd_store else self.config_digest


def archive(
    image: Image,
    ref: str | None,
    files: Mapping[str, Path],
    members: Iterable[Member] = (),
) -> Iterator[bytes]:
    """The archive of ``image`` (named ``ref`` when given) holding the blobs ``files`` (digest -> a file of exactly
    that blob) and ``members`` (blobs read from elsewhere, in order); every other layer is left out (see the module
    docstring for when that loads). Streams; each blob once."""
    seen: set[str] = set()
    sizes = {d.digest: d.size for d in image.layers}
    for m in members:
        if m.digest in seen:
            continue
        seen.add(m.digest)
        yield from _member(blob_name(m.digest), m.size, m.chunks)
    for d in image.layers:
        if d.digest in files and d.digest not in seen:
            seen.add(d.digest)
            yield from _member(blob_name(d.digest), sizes[d.digest], _file_chunks(files[d.digest], d.size))
    manifest = image.manifest
    docker_manifest = [{"Config": blob_name(image.config_digest), "RepoTags": [ref] if ref else None,
                        "Layers": [blob_name(d.digest) for d in image.layers]}]  # fmt: skip
    small = {
        blob_name(image.config_digest): image.config,
        blob_name(image.manifest_digest): manifest,
        "index.json": index_bytes(image.manifest_digest, len(manifest), ref),
        "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
        "manifest.json": json.dumps(docker_manifest).encode(),
    }
    for name, data in small.items():
        yield from _member(name, len(data), [data])
    yield bytes(2 * BLOCK)


__all__ = [
    "CONFIG_TYPE",
    "LAYER_TAR",
    "MANIFEST_TYPE",
    "ChunkReader",
    "Descriptor",
    "Image",
    "Member",
    "Writable",
    "archive",
    "chain_ids",
    "chains_of",
    "index_bytes",
    "layer_descriptor",
    "manifest_bytes",
    "member_header",
]
