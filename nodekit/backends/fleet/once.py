"""One ``nodekit run`` of a project on one set of hosts at a time, from this head: the later one is refused at once,
naming the earlier (its pid, command and start), which goes on untouched. Without it, the later run's start replaced
the earlier's container on every host, and the earlier ended with exit 143, blaming a SIGTERM it never got.

The head's lock (:mod:`nodekit.system.hostlock`, as ``nodekit up`` takes per node) is keyed by the project and the
Docker endpoints it runs on; runs from two heads, or on overlapping host sets, meet on the hosts instead, where a
start never replaces a running container (:mod:`nodekit.backends.fleet.start`)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from nodekit.backends.fleet.hosts import FleetHost
from nodekit.errors import UsageError
from nodekit.system import hostlock


def run_lock_name(project: str, hosts: Sequence[FleetHost]) -> str:
    """The head's lock of ``project``'s runs on ``hosts`` (their Docker endpoints, in any order)."""
    return hostlock.key_name(f"run-{project}", *sorted({h.url for h in hosts}), socket.gethostname())


@contextlib.contextmanager
def one_run_here(project: str, hosts: Sequence[FleetHost]) -> Iterator[None]:
    """Hold ``project``'s run lock on this head for the ``with`` block (the whole run, restarts included); a
    UsageError (exit 2) at once when another process holds it. A crash releases it (flock)."""
    about = f"pid {os.getpid()} (nodekit run in {Path.cwd()}, since {time.strftime('%H:%M:%S')})"
    try:
        with hostlock.exclusive(run_lock_name(project, hosts), about):
            yield
    except hostlock.Held as e:
        raise UsageError(
            f"project {project} is already being run on these hosts by {e.holder}",
            fix="wait for it to end, or stop it (Ctrl-C where it runs, or kill -INT with its pid: every node is "
            "stopped)",
        ) from None
    except hostlock.NoLockDir as e:
        raise UsageError(f"cannot lock this project's run on this machine: {e}",
                         fix="remove it, or set XDG_RUNTIME_DIR") from None  # fmt: skip
