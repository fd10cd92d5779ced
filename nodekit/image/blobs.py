"""The blobs nodekit itself wrote for a project's images: code layers and image configs, content-addressed.

``nodekit build`` writes the project's code layer and the final image's config (:mod:`nodekit.image.append`); both land
here under their sha256, the layer under its diff id and the config under the image id. A push that needs only
such blobs (the usual edit-run loop: every node has the environment, only the code changed) composes the archive
from them instead of running ``docker save`` over the whole image (10-15 s for a 1.1 GB image on the test machine,
whatever the size of the change).

Every read is checked: a blob whose content no longer hashes to its name is deleted and reported missing, so a
damaged store costs a slower push, never a wrong image. Writes go through a temporary file and a rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

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
        """The blob's path when it is here and hashes to ``digest`` (read through once); a damaged one is removed."""
        path = self.path(digest)
        try:
            actual = file_sha256(path)
        except OSError:
            return None
        if "sha256:" + actual != digest:
            path.unlink(missing_ok=True)
            return None
        self.touch(digest)
        return path

    def touch(self, digest: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.path(digest))

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
        return gone
