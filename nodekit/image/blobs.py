"""The blobs nodekit itself wrote for a project's images: every layer above the base, configs and manifests,
content-addressed.

``nodekit build`` writes each layer of the image above its base (:mod:`nodekit.image.layers`), the image config and
its manifest (:mod:`nodekit.image.archive`); they land here under their sha256, a layer under its diff id. A push
composes every archive from them (only the layers a node lacks) instead of running ``docker save`` over the whole
image, on either image store. Beside the blobs, two small indexes: ``layers/<key>`` names the package layer made
from inputs with that key (so an unchanged layer is never built again), ``images/<config digest>`` the manifest of
an image (so the image is found by either of its ids: the classic store's config digest, the containerd store's
manifest digest).

Every read is checked: a blob whose content no longer hashes to its name is deleted and reported missing, so a
damaged store costs a slower push, never a wrong image. Writes go through a temporary file and a rename. A blob is
hashed in full once: when it is written (it is hashed as it goes) or first read, ``verified/<hex>`` records its
inode, size and modification time, and a later read whose file still has exactly those skips the hash. A write to
the file changes its size or its time, so it is hashed again. Without this, every build would read back every
package layer (gigabytes for a CUDA image, seconds of a code-only rebuild) and every push each layer it sends
twice. The engines check each layer's digest again when they load it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from nodekit.image.archive import Descriptor, Image
from nodekit.launcher.datacheck.filehash import file_sha256

BLOBS = Path(".nodekit") / "blobs"
KEEP_DAYS = 14.0
"""Blobs not used for this long are removed by :meth:`BlobStore.prune` (code layers are small, but every build of
a changed project writes one)."""


class _Hashing:
    """A binary file that hashes what is written through it."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.h = hashlib.sha256()
        self.n = 0

    def write(self, data: bytes) -> int:
        self.h.update(data)
        self.n += len(data)
        return self._f.write(data)


def _identity(st: os.stat_result) -> str:
    """What a blob's file is as far as its stat says: a write changes its size or its times."""
    return f"{st.st_ino} {st.st_size} {st.st_mtime_ns}\n"


@dataclass(frozen=True)
class LayerRecord:
    """A layer nodekit made: its diff id, size in bytes, entries (0: nothing to add) and what made it."""

    diff_id: str
    size: int
    entries: int
    created_by: str


class BlobStore:
    """``root/sha256/<hex>``; one per project (``<project>/.nodekit/blobs``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of_project(cls, project_dir: Path) -> BlobStore:
        return cls(project_dir / BLOBS)

    def path(self, digest: str) -> Path:
        algo, _, hexdigest = digest.partition(":")
        if algo != "sha256" or len(hexdigest) != 64:
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.root / algo / hexdigest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, write: Callable[[_Hashing], object]) -> tuple[str, int]:
        """Store what ``write`` writes (into a hashing file); ``(digest, size)``. Atomic: an interrupted write
        leaves nothing under a digest."""
        d = self.root / "sha256"
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".incoming.", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                hashing = _Hashing(f)
                write(hashing)
                f.flush()
                os.fsync(f.fileno())
            digest = "sha256:" + hashing.h.hexdigest()
            os.replace(tmp, self.path(digest))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._stamp(digest)  # hashed as it was written
        return digest, hashing.n

    def put_bytes(self, data: bytes) -> str:
        return self.put(lambda f: f.write(data))[0]

    def read_verified(self, digest: str) -> bytes | None:
        """The blob's bytes when it is here and hashes to ``digest``; a damaged one is removed (None)."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            path.unlink(missing_ok=True)
            return None
        self.touch(digest)
        return data

    def verified_path(self, digest: str) -> Path | None:
        """The blob's path when it is here and hashes to ``digest`` (read through unless its stamp says it did since
        the file last changed); a damaged one is removed."""
        path = self.path(digest)
        try:
            if self._stamp_of(digest) == _identity(path.stat()):
                self.touch(digest)
                return path
            actual = file_sha256(path)
        except OSError:
            return None
        if "sha256:" + actual != digest:
            path.unlink(missing_ok=True)
            return None
        self.touch(digest)
        return path

    def touch(self, digest: str) -> None:
        """Mark a blob just verified as used (reclaim and :meth:`prune` remove the least recently used), and stamp
        it as verified with the times that gives it."""
        with contextlib.suppress(OSError):
            os.utime(self.path(digest))
            self._stamp(digest)

    def _stamp(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            self._write_index(self._index("verified", digest), _identity(self.path(digest).stat()))

    def _stamp_of(self, digest: str) -> str | None:
        try:
            return self._index("verified", digest).read_text()
        except OSError:
            return None

    def _index(self, kind: str, key: str) -> Path:
        if not key or any(c not in "0123456789abcdef" for c in key.removeprefix("sha256:")):
            raise ValueError(f"not a hex key: {key!r}")
        return self.root / kind / key.removeprefix("sha256:")

    def _write_index(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".incoming.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)

    def layer(self, key: str) -> LayerRecord | None:
        """The layer made from inputs with ``key`` when its blob is still here (checked against its digest)."""
        try:
            record = LayerRecord(**json.loads(self._index("layers", key).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if self.verified_path(record.diff_id) is None:
            return None
        return record

    def set_layer(self, key: str, record: LayerRecord) -> None:
        self._write_index(self._index("layers", key), json.dumps(asdict(record)))

    def keep_image(self, image: Image) -> None:
        """Keep ``image``'s config and manifest, findable by either of its ids."""
        self.put_bytes(image.config)
        self.put_bytes(image.manifest)
        self._write_index(self._index("images", image.config_digest), image.manifest_digest + "\n")

    def image(self, image_id: str) -> Image | None:
        """The image an engine names ``image_id`` (its config digest on the classic store, its manifest digest on
        the containerd store), when this store holds its config, manifest and every layer nodekit made for it."""
        manifest_digest = image_id
        with contextlib.suppress(OSError, ValueError):
            manifest_digest = self._index("images", image_id).read_text().strip()
        raw = self.read_verified(manifest_digest) if manifest_digest.startswith("sha256:") else None
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            config = self.read_verified(str(doc["config"]["digest"]))
            layers = tuple(Descriptor.from_json(d) for d in doc["layers"])
        except (ValueError, KeyError, TypeError):
            return None
        if config is None:
            return None
        return Image(config=config, layers=layers)

    def prune(self, *, keep: frozenset[str] = frozenset(), older_than_s: float = KEEP_DAYS * 86400) -> int:
        """Remove blobs unused for ``older_than_s`` (and leftovers of interrupted writes), except ``keep``; how
        many went."""
        d = self.root / "sha256"
        if not d.is_dir():
            return 0
        keep_names = {k.partition(":")[2] for k in keep}
        cutoff = time.time() - older_than_s
        gone = 0
        for p in d.iterdir():
            with contextlib.suppress(OSError):
                if p.name not in keep_names and p.stat().st_mtime < cutoff:
                    p.unlink()
                    gone += 1
        stamps = self.root / "verified"
        for p in stamps.iterdir() if stamps.is_dir() else []:
            if not (d / p.name).exists():  # the stamp of a blob that is gone
                p.unlink(missing_ok=True)
        return gone
