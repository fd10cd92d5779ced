"""Locks that one host's processes share: "only one of us does this here at a time", released by the kernel when
the holder ends, however it ends (an ``flock`` on a file), so a crash never leaves one stuck.

A lock file lives in this user's runtime directory (``$XDG_RUNTIME_DIR/nodekit``, else ``/tmp/nodekit-<uid>``,
made 0700 and refused when another user owns it or could write to it) and holds what its holder wrote about itself
(its pid, its command, since when) for the process refused to name it. What the file says is only read while the
lock is held by a live process; a file left by a process that died is taken over and rewritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path


class Held(Exception):
    """The lock is held; ``holder`` is what its holder wrote about itself (or that it is still starting)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class NoLockDir(Exception):
    """No private directory for lock files: ``str()`` says which path and why."""


def lock_dir(environ: dict[str, str] | None = None) -> Path:
    """This user's directory for host locks, made when missing; NoLockDir when the one found is not private."""
    env = os.environ if environ is None else environ
    uid = os.getuid()
    runtime = env.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "nodekit" if runtime.startswith("/") else Path(f"/tmp/nodekit-{uid}")
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700, parents=runtime.startswith("/"))
    st = base.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise NoLockDir(f"{base} is not a directory of this user's that only this user can write to")
    return base


def key_name(*parts: str) -> str:
    """A file name for a lock on ``parts`` (a project and a Docker endpoint, say): readable, and unique for them."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", parts[0])[:80]
    return f"{readable}.{digest}.lock"


@contextlib.contextmanager
def exclusive(name: str, about_me: str, *, directory: Path | None = None) -> Iterator[None]:
    """Hold the lock ``name`` (from :func:`key_name`) for the ``with`` block, having written ``about_me`` into it;
    :class:`Held` at once, with what the holder wrote, when another process holds it. Never waits."""
    path = (directory or lock_dir()) / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            said = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            raise Held(said or "a process that is still starting") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, about_me.encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays for the next holder to rewrite
