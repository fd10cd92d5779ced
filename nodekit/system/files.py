"""Writing files so that a reader (or a crash) never sees half of one; reading a small file a user named without
hanging on a FIFO or a device, or reading without end."""

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


READ_CAP = 4 << 20
"""The most :func:`read_bounded` reads: nodekit.toml and a hostfile are a few KiB (10,000 hosts, the most one job
holds, are about 400 KiB of hostfile)."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str | None:
    return next((f"is {what}, not a file" for test, what in _KINDS if test(mode)), None)


def not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a regular file (links followed), as a phrase after its name ("does not exist", "is a
    directory, not a file"); None when it is one."""
    try:
        return _kind(path.stat().st_mode)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror or type(e).__name__})"


class NotReadable(ValueError):
    """A path that is not a regular file of at most the cap; ``str()`` is the phrase that follows its name."""


def read_bounded(path: Path, cap: int = READ_CAP) -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them. Opened without blocking (a FIFO nobody
    writes would hang a plain open) and judged by what was opened, so a path swapped after a check cannot slip
    through: NotReadable for anything but a regular file, or one larger than ``cap``; OSError where it cannot be
    opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        why = _kind(st.st_mode)
        if why is not None:
            raise NotReadable(why)
        chunks, got = [], 0
        while chunk := os.read(fd, min(1 << 20, cap + 1 - got)):
            chunks.append(chunk)
            got += len(chunk)
            if got > cap:
                raise NotReadable(f"is larger than {cap >> 20} MiB, more than such a file ever holds")
        return b"".join(chunks)
    finally:
        os.close(fd)
