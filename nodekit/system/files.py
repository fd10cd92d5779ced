"""Writing files so that a reader (or a crash) never sees half of one; a private file made once by whichever of several
writers links it first; reading a small file a user named without hanging on a FIFO or a device, or reading without
end."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from nodekit.errors import UsageError


def write_atomic(path: Path, text: str, *, mode: int = 0o644, within: Path | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and an atomic rename.

    A new file gets ``mode``. An existing one keeps its mode where that is stricter (a 0600 file stays 0600; a
    file that now holds a secret, written with ``mode=0o600``, loses what 0600 does not allow) and, when root
    writes it, its owner. The directory is synced after the rename, so after a crash the file is the old one or
    the new one, whole.

    Never through a symbolic link: a cloned repository can commit ``compose/node-0.yaml`` as a link to
    ~/.ssh/authorized_keys, or ``compose`` as a link to ~/.ssh, and the generated file, part of whose text the
    repository's own nodekit.toml chooses, would replace the user's. So UsageError (exit 2, nothing written) when
    ``path`` is a link, or when a directory below ``within`` (the project: it and the directories above it are the
    user's own) on the way to ``path`` is one; without ``within``, or for a ``path`` outside it, ``path``'s
    directory is trusted as named. Each directory is opened without following a link and the rest is done
    relative to it, so a link planted after the check is not followed either: the temporary file is created
    exclusively, and the rename replaces the name, never what a link there points to.
    """
    path = path.absolute()
    base = path.parent
    below: tuple[str, ...] = ()
    if within is not None and path.parent.is_relative_to(within.absolute()):
        base, below = within.absolute(), path.parent.relative_to(within.absolute()).parts
    base.mkdir(parents=True, exist_ok=True)
    dfd = _open_below(base, below)
    try:
        try:
            old: os.stat_result | None = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISLNK(old.st_mode):
            raise _link_refused(path, os.readlink(path.name, dir_fd=dfd), "file")
        tmp, fd = _create_temp(dfd, path.name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fchmod(f.fileno(), mode & stat.S_IMODE(old.st_mode) if old is not None else mode)
                if old is not None and os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        _fsync(dfd)
    finally:
        os.close(dfd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _open_below(base: Path, below: tuple[str, ...]) -> int:
    """A descriptor of ``base``/``below``, each directory of ``below`` opened relative to the one before it without
    following a link (made when missing); UsageError naming the first that is a link."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for i, part in enumerate(below):
            try:
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                    raise _link_refused(
                        base.joinpath(*below[: i + 1]), os.readlink(part, dir_fd=fd), "directory"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _create_temp(dfd: int, name: str) -> tuple[str, int]:
    """A new, empty, 0600 file beside ``name`` in the directory ``dfd``: its own name and an open descriptor."""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return tmp, os.open(tmp, flags, 0o600, dir_fd=dfd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _link_refused(path: Path, target: str, what: str) -> UsageError:
    # The target is the repository's to choose: escaped, so that it cannot break the one line.
    shown = target.encode("unicode_escape").decode("ascii")
    return UsageError(
        f"{path} is a symbolic link (to {shown}): nodekit never writes a file it generates through a link, which a "
        "cloned repository can plant to overwrite a file of yours",
        fix=f"remove the link (rm {path}) and run again"
        + (", or make it a real directory" if what == "directory" else "; nodekit writes a new file there"),
    )


def fsync_dir(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable; a file system that cannot sync a directory is let be."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fd)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _fsync(dir_fd: int) -> None:
    try:
        os.fsync(dir_fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


class PrivateFileRefused(Exception):
    """Why the private file (or directory) ``path`` cannot be used: ``kind`` is "parent is a file", "unreadable",
    "known" (someone else may know what it holds) or "not a directory"; ``why`` says more ("" where nothing does).
    The caller words it for what the file holds."""

    def __init__(self, path: Path, kind: str, why: str = "") -> None:
        super().__init__(f"{path}: {kind}{': ' + why if why else ''}")
        self.path, self.kind, self.why = path, kind, why


def read_private(path: Path) -> str | None:
    """The text of the private file ``path``; None when it is absent. PrivateFileRefused when it cannot be read as
    text, or when it holds something (more than white space) that someone else may know (:func:`_private`)."""
    try:
        # O_NOFOLLOW: a link planted there (a cloned repository can carry one) would hand over the text of a file of
        # the user's own, which the mode and owner checks below would pass.
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            text = f.read()
            if text.strip():  # an empty remnant holds nothing to know
                _private(path, os.fstat(f.fileno()))
            return text
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise PrivateFileRefused(path.parent, "parent is a file") from None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise PrivateFileRefused(path, "unreadable", str(e.strerror)) from None
        raise PrivateFileRefused(path, "unreadable", "a symbolic link, not a file of nodekit's own") from None
    except UnicodeDecodeError:
        raise PrivateFileRefused(path, "unreadable", "not text") from None


def _private(path: Path, st: os.stat_result) -> None:
    """Refuse a file another user may know: one that others can read (what a git checkout or a copy made by
    redirection leaves), or one another user owns. As ssh treats a private key."""
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose or st.st_uid != os.geteuid():
        why = f"readable by others (mode {stat.S_IMODE(st.st_mode):04o})" if loose else f"owned by uid {st.st_uid}"
        raise PrivateFileRefused(path, "known", why)


def private_once(path: Path, make: Callable[[], str]) -> str:
    """The text of the private file ``path``, made first when absent: ``make()``, 0600, written whole to a temporary
    file, then linked into place, so a reader sees no file or the whole text, and of several writers at once every
    one gets the text of the first link. An empty file (a writer that crashed between creating and writing it) is
    replaced the same way, under a lock on ``<path>.lock`` (which the repair alone uses) so that concurrent repairs
    agree. Any other text is returned as it is, for the caller to judge: it may be one a user wrote by hand. ""
    where the file is still empty after three looks; PrivateFileRefused as :func:`read_private`."""
    for _ in range(3):  # absent, then found empty and replaced, then read: at most three looks
        text = read_private(path)
        if text is None:
            value = make()
            if _link_new(path, value):
                return value
            continue  # someone else linked first: read theirs
        if text.strip():
            return text
        _replace_empty(path, make)
    return read_private(path) or ""


def _temp_with(path: Path, value: str) -> Path:
    """A 0600 file beside ``path`` holding ``value``, on disk before it gets its real name."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise PrivateFileRefused(directory, "not a directory") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
        f.flush()
        os.fsync(f.fileno())
    return Path(tmp)


def _link_new(path: Path, value: str) -> bool:
    """Give ``value`` the name ``path`` unless something already has it; True when ours is the one there."""
    tmp = _temp_with(path, value)
    try:
        os.link(tmp, path)  # atomic, and never replaces: the first of several writers wins
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _replace_empty(path: Path, make: Callable[[], str]) -> None:
    """Replace an empty ``path`` with ``make()``, unless another writer already did (checked under the lock)."""
    lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        text = read_private(path)
        if text is not None and not text.strip():
            tmp = _temp_with(path, make())
            os.replace(tmp, path)
            fsync_dir(path.parent)
    finally:
        os.close(lock)


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
