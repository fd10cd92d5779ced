"""The job secret: what every node of one job presents to main's store (``NODEKIT_JOB_SECRET`` in each node's
compose environment), so that a process that merely reaches main's preflight/heartbeat port can neither join the
preflight nor write the watchdog's keys (see ``nodekit/launcher/auth.py``).

Where it comes from, for ``nodekit up`` run by hand on each machine (every node needs the same value):

1. ``NODEKIT_JOB_SECRET`` in the user's shell, when set: one per job, never on disk (export it on every node);
2. else ``<project>/.nodekit/job-secret``, created 0600 on first need. It travels with the project (copy it with
   the code to every node) and stays the same from job to job: simpler, but anyone who can read the project can
   join its jobs. ``.nodekit`` is never part of the image (a default build exclusion) and belongs in .gitignore.

A head node that starts every node itself makes one secret per run with :func:`new_secret` and passes it to each
node's render. The secret is never printed: dry runs and logs show :data:`MASKED` instead.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from nodekit.errors import ConfigError

ENV_VAR = "NODEKIT_JOB_SECRET"
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
    """The project's secret file, created (0600, atomically, never overwritten) when absent."""
    path = project_dir / SECRET_FILE
    try:
        return check(path.read_text(), str(path))
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = new_secret()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another nodekit made it first: use theirs, both nodes must agree
        return check(path.read_text(), str(path))
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


def resolve(environ: Mapping[str, str], project_dir: Path) -> str:
    """The secret for ``nodekit up`` on this node: the shell's NODEKIT_JOB_SECRET, else the project's file."""
    if environ.get(ENV_VAR):
        return check(environ[ENV_VAR], ENV_VAR)
    return load_or_create(project_dir)


def for_node(environ: Mapping[str, str], project_dir: Path, *, create: bool) -> str:
    """:func:`resolve`, except that with ``create`` false (a dry run) nothing is written: without a shell value or
    a file, a throwaway secret stands in (dry runs show it masked anyway)."""
    if create or environ.get(ENV_VAR) or (project_dir / SECRET_FILE).is_file():
        return resolve(environ, project_dir)
    return new_secret()


def masked(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by :data:`MASKED` (for printing plans and logs)."""
    return text.replace(secret, MASKED) if secret else text
