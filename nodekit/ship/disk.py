"""What a push asks of an ``ssh://`` target besides its engine: the free disk under its data root, for the plan's
room check (:func:`nodekit.ship.plan.plan_push`), and whether it has the zstd command, which decompresses a zstd
stream there before ``docker load`` reads it (no engine ever decompresses zstd: see
:data:`nodekit.ship.plan.ZSTD_LOAD_CRASH`).

``docker info`` names the engine's data root but not the space left there. An engine on this machine (a unix
socket) is asked with ``statvfs`` (:func:`nodekit.system.docker.engine_facts`); an ``ssh://`` engine is asked here, over
the same SSH the docker CLI uses for it (under :class:`nodekit.ship.mux.SharedSsh` it rides the node's one
connection): ``df -Pk`` on its data root, POSIX output that GNU coreutils and busybox both print. A ``tcp://`` engine
offers no way to ask: its free disk stays unknown, and the push goes on without the check (the load then fails
there, with the engine's own "no space left on device", and registers nothing).

:func:`df_argv` and :func:`parse_df` are pure; :func:`target_disk` runs the command, with a deadline, and answers
"unknown" rather than failing: a node that cannot say is not refused for it.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple
from urllib.parse import urlsplit

from nodekit.errors import DeadlineError
from nodekit.system import proc

ZSTD_MARK = "nodekit-zstd"

DF_TIMEOUT_S = 30.0
"""An ssh login and one ``df``; a node that takes longer is not asked again (its free disk stays unknown)."""


def df_argv(endpoint: str, root: str, ssh: str = "ssh") -> list[str] | None:
    """The command that prints the free space under ``root`` on the node of ``endpoint``: only for ``ssh://``
    endpoints (None otherwise). Batch mode, as every ssh nodekit runs: a missing key fails instead of prompting; no
    stdin (``-n``)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "ssh" or not parts.hostname or not root:
        return None
    dest = f"{parts.username}@{parts.hostname}" if parts.username else parts.hostname
    port = ["-p", str(parts.port)] if parts.port else []
    opts = ["-n", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *port]
    # The zstd check last: its line follows df's table, and a node without zstd just prints nothing more.
    check = f"df -Pk -- {shlex.quote(root)} && {{ command -v zstd >/dev/null 2>&1 && echo {ZSTD_MARK} || true; }}"
    return [ssh, *opts, "--", dest, check]


def parse_df(out: str) -> int | None:
    """Bytes available from ``df -Pk`` output (a header, then one line: filesystem, 1024-blocks, used, available,
    capacity, mount point), or None when it is not that. The available column is the one before the capacity
    (``15%``), so a mount point with spaces in it does not shift it."""
    lines = [ln.split() for ln in out.splitlines() if ln.strip() and ln.strip() != ZSTD_MARK]
    if len(lines) < 2:
        return None
    row = lines[-1]
    cap = next((i for i, tok in enumerate(row) if i >= 4 and tok.endswith("%") and tok[:-1].isdigit()), None)
    if cap is None or not row[cap - 1].isdigit():
        return None
    return int(row[cap - 1]) * 1024


class TargetDisk(NamedTuple):
    """What a push needs of a target node's disk before it sends: the free space under the data root, and whether
    the node can unpack zstd."""

    free_bytes: int | None
    """None: unknown."""
    zstd: bool


def target_disk(endpoint: str, root: str) -> TargetDisk:
    """Free bytes under ``root`` on the ``ssh://`` node of ``endpoint`` (None when it cannot be known: not ssh, the
    command failed or took longer than :data:`DF_TIMEOUT_S`) and whether the node has the zstd command."""
    argv = df_argv(endpoint, root)
    if argv is None:
        return TargetDisk(None, False)
    try:
        done = proc.run(argv, deadline=DF_TIMEOUT_S, what=f"df on {endpoint}", fix="", stdin="devnull")
    except (OSError, DeadlineError):
        return TargetDisk(None, False)
    if done.returncode != 0:
        return TargetDisk(None, False)
    return TargetDisk(parse_df(done.stdout), ZSTD_MARK in done.stdout.split())
