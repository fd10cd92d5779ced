"""The one sha256-of-a-file helper, for the launcher and the host side alike.

Standard library only, and inside ``nodekit/launcher/`` because the image holds only ``nodekit/__init__.py`` and
this package (images/Dockerfile): a module beside it would be missing in the container.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str], *, copy_to: BinaryIO | None = None) -> str:
    """The sha256 hex digest of the file at ``path``, read in chunks; OSError when it cannot be read.

    With ``copy_to``, every chunk hashed is also written there, so the digest describes exactly the bytes copied
    (a file an editor rewrites meanwhile cannot make the two differ)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if copy_to is not None:
                copy_to.write(chunk)
    return h.hexdigest()
