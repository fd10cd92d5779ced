"""Writing files so that a reader (or a crash) never sees half of one."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and an atomic rename.

    A new file gets ``mode``. An existing one keeps its mode where that is stricter (a 0600 file stays 0600; a
    file that now holds a secret, written with ``mode=0o600``, loses what 0600 does not allow) and, when root
    writes it, its owner. A symbolic link is written through: its target is replaced and the link stays. The
    directory is synced after the rename, so after a crash the file is the old one or the new one, whole.
    """
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        old: os.stat_result | None = target.stat()
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.chmod(tmp, mode & stat.S_IMODE(old.st_mode) if old is not None else mode)
            if old is not None and os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                os.chown(tmp, old.st_uid, old.st_gid)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable; a file system that cannot sync a directory is let be."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
