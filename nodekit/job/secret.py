"""The job secret: what every node of one job presents to main's store (``NODEKIT_JOB_SECRET`` in each node's
compose environment), so that a process that merely reaches main's preflight/heartbeat port can neither join the
preflight nor write the watchdog's keys (see ``nodekit/launcher/store/auth.py``).

Where it comes from, for ``nodekit up`` run by hand on each machine (every node needs the same value):

1. ``NODEKIT_JOB_SECRET`` in the user's shell, when set: one per job, never on disk (export it on every node);
2. else ``<project>/.nodekit/job-secret``, created 0600 on first need. It travels with the project (copy it with
   the code to every node) and stays the same from job to job: simpler, but anyone who can read the project can
   join its jobs. ``.nodekit`` is never part of the image (a default build exclusion) and belongs in .gitignore.

A head node that starts every node itself makes one secret per run with :func:`new_secret` and passes it to each
node's render. The secret is never printed: dry runs and logs show :data:`MASKED` instead.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from nodekit.errors import ConfigError
from nodekit.launcher.contract import Env
from nodekit.system.files import fsync_dir

ENV_VAR = Env.JOB_SECRET
SECRET_FILE = Path(".nodekit") / "job-secret"
MASKED = "********"
_FORMAT = re.compile(r"^[A-Za-z0-9_.~+/=-]{16,256}$")


def new_secret() -> str:
    """A fresh secret: 32 hex characters (128 bits) from the OS's CSPRNG."""
    return secrets.token_hex(16)


def check(value: str, source: str) -> str:
    """``value`` if it is usable as a secret (16..256 characters, no spaces or quotes), else a ConfigError."""
    value = value.strip()
    if not _FORMAT.match(value):
        raise ConfigError(
            f"{source} is not a usable job secret (16 to 256 characters: letters, digits, _.~+/=-)",
            fix=f"export {ENV_VAR}=$(python3 -c 'import secrets; print(secrets.token_hex(16))'), or remove {source}",
        )
    return value


def load_or_create(project_dir: Path) -> str:
    """The project's secret file, created when absent: 0600, written whole to a temporary file, then linked into
    place, so a reader sees no file or the whole secret, and of several nodekits starting at once every one gets
    the value of the first link. An empty file (an older nodekit that crashed between creating and writing it) is
    replaced the same way, under a lock so that concurrent repairs agree; any other unusable content is left for
    the user (ConfigError with the fix), since it may be a secret they wrote by hand."""
    path = project_dir / SECRET_FILE
    for _ in range(3):  # absent, then found empty and replaced, then read: at most three looks
        text = _read(path)
        if text is None:
            value = new_secret()
            if _link_new(path, value):
                return value
            continue  # someone else linked first: read theirs
        if text.strip():
            return check(text, str(path))
        _replace_empty(path)
    return check(_read(path) or "", str(path))


def _read(path: Path) -> str | None:
    """The file's text; None when absent. A ConfigError naming the fix when it cannot be a secret file, or when
    someone else can know it (:func:`_private`)."""
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read()
            if text.strip():  # an empty remnant holds nothing to know; it is replaced
                _private(path, os.fstat(f.fileno()))
            return text
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise ConfigError(
            f"{path.parent} is a file, where nodekit keeps its state", fix=f"move {path.parent} away"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not text"
        raise ConfigError(
            f"cannot read the job secret {path}: {why}",
            fix=f"remove {path} (a new one is made), or export {ENV_VAR}",
        ) from None


def _private(path: Path, st: os.stat_result) -> None:
    """Refuse a secret file another user may know: one that others can read (what a git checkout or a copy made by
    redirection leaves: a repository that ships ``.nodekit/job-secret`` hands every clone the same, public value),
    or one another user owns. As ssh treats a private key. nodekit's own file is 0600 and the user's."""
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose or st.st_uid != os.geteuid():
        why = f"readable by others (mode {stat.S_IMODE(st.st_mode):04o})" if loose else f"owned by uid {st.st_uid}"
        raise ConfigError(
            f"the job secret {path} is {why}: a secret that came with a repository or a shared copy is known to "
            "whoever has that copy",
            fix=f"if you copied it from main yourself: chmod 600 {path}; else remove it (a new one is made) and "
            f"copy main's, or export {ENV_VAR}",
        )


def _temp_with(directory: Path, value: str) -> Path:
    """A 0600 file in ``directory`` holding ``value``, on disk before it gets its real name."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(
            f"{directory} is not a directory", fix=f"move {directory} away (nodekit keeps its state there)"
        ) from None
    fd, tmp = tempfile.mkstemp(prefix=".job-secret.", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
        f.flush()
        os.fsync(f.fileno())
    return Path(tmp)


def _link_new(path: Path, value: str) -> bool:
    """Give ``value`` the name ``path`` unless something already has it; True when ours is the one there."""
    tmp = _temp_with(path.parent, value)
    try:
        os.link(tmp, path)  # atomic, and never replaces: the first of several creators wins
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _replace_empty(path: Path) -> None:
    """Replace an empty secret file with a fresh secret, unless another nodekit already did (checked under a lock
    on ``.nodekit/job-secret.lock``, which the repair alone uses)."""
    lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        text = _read(path)
        if text is not None and not text.strip():
            tmp = _temp_with(path.parent, new_secret())
            os.replace(tmp, path)
            fsync_dir(path.parent)
    finally:
        os.close(lock)


def resolve(environ: Mapping[str, str], project_dir: Path) -> str:
    """The secret for ``nodekit up`` on this node: the shell's NODEKIT_JOB_SECRET, else the project's file."""
    if environ.get(ENV_VAR):
        return check(environ[ENV_VAR], ENV_VAR)
    return load_or_create(project_dir)


def for_node(environ: Mapping[str, str], project_dir: Path, *, create: bool) -> str:
    """:func:`resolve`, except that with ``create`` false (a dry run) nothing is written: without a shell value or
    a usable file, a throwaway secret stands in (dry runs show it masked anyway)."""
    if create or environ.get(ENV_VAR):
        return resolve(environ, project_dir)
    text = _read(project_dir / SECRET_FILE)
    return check(text, str(project_dir / SECRET_FILE)) if text and text.strip() else new_secret()


def masked(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by :data:`MASKED` (for printing plans and logs)."""
    return text.replace(secret, MASKED) if secret else text
