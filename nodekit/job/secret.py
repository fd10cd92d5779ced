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

import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from nodekit.errors import ConfigError
from nodekit.launcher.contract import Env
from nodekit.system import files

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
    """The project's secret file, created when absent (or found empty: a nodekit that crashed between creating and
    writing it), 0600 and whole, the same value for several nodekits starting at once
    (:func:`nodekit.system.files.private_once`). Any other unusable content is left for the user (ConfigError with the
    fix), since it may be a secret they wrote by hand."""
    return for_node({}, project_dir, create=True)


def resolve(environ: Mapping[str, str], project_dir: Path) -> str:
    """The secret for ``nodekit up`` on this node: the shell's NODEKIT_JOB_SECRET, else the project's file."""
    return for_node(environ, project_dir, create=True)


def for_node(environ: Mapping[str, str], project_dir: Path, *, create: bool) -> str:
    """The shell's NODEKIT_JOB_SECRET, else the project's file (made when ``create``). With ``create`` false (a dry
    run) nothing is written: without a usable file, a throwaway secret stands in (dry runs show it masked anyway).
    ConfigError naming the fix for a value or a file that cannot serve."""
    if environ.get(ENV_VAR):
        return check(environ[ENV_VAR], ENV_VAR)
    path = project_dir / SECRET_FILE
    try:
        return check(_project_text(path, create=create), str(path))
    except files.PrivateFileRefused as e:
        raise _refused(e) from None


def _project_text(path: Path, *, create: bool) -> str:
    """The secret file's text, made first when absent or empty with ``create``; without, a fresh secret stands in for
    a missing or empty file, and nothing is written."""
    if create:
        return files.private_once(path, new_secret)
    return (files.read_private(path) or "").strip() or new_secret()


def _refused(e: files.PrivateFileRefused) -> ConfigError:
    """The secret file's refusal, with its fix: a secret that came with a repository or a shared copy (a checkout is
    0644; a repository that ships ``.nodekit/job-secret`` hands every clone the same, public value) is known to
    whoever has that copy."""
    path = e.path
    if e.kind == "known":
        return ConfigError(
            f"the job secret {path} is {e.why}: a secret that came with a repository or a shared copy is known to "
            "whoever has that copy",
            fix=f"if you copied it from main yourself: chmod 600 {path}; else remove it (a new one is made) and "
            f"copy main's, or export {ENV_VAR}",
        )
    if e.kind == "unreadable":
        return ConfigError(
            f"cannot read the job secret {path}: {e.why}", fix=f"remove {path} (a new one is made), or export {ENV_VAR}"
        )
    if e.kind == "parent is a file":
        return ConfigError(f"{path} is a file, where nodekit keeps its state", fix=f"move {path} away")
    return ConfigError(f"{path} is not a directory", fix=f"move {path} away (nodekit keeps its state there)")


def masked(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by :data:`MASKED` (for printing plans and logs)."""
    return text.replace(secret, MASKED) if secret else text
