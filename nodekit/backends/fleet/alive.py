"""How the head notices a host that vanished: every ssh the docker CLI opens to a node (its ``ssh://`` transport:
``compose up``, ``down``) and each node's follower (one SSH command for its log and exit code) keep alive with an
interval derived from the job's ``peer_timeout``, so the head names a lost host about when the surviving nodes do,
instead of after TCP's two hours. :func:`kept_alive` puts that ssh first on the PATH of nodekit's children
(nodekit.system.proc's environment; this process's own is not changed) for the length of a fleet command."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nodekit.system import proc, ssh

ALIVE_COUNT = ssh.ALIVE_COUNT
CONNECT_S = 10
"""A node that does not accept the connection within this is unreachable (the docker CLI's own default is 30)."""


def alive_interval(peer_timeout: int) -> int:
    """Seconds between keepalive probes so that ``ALIVE_COUNT`` unanswered ones take about ``peer_timeout`` (the
    builder's default interval when the job has no peer watchdog), at least 1 s and at most the default."""
    if peer_timeout <= 0:
        return ssh.ALIVE_INTERVAL_S
    return max(1, min(ssh.ALIVE_INTERVAL_S, math.ceil(peer_timeout / ALIVE_COUNT)))


def loss_window(interval: int) -> float:
    """The longest a connection to a vanished host can take to end: OpenSSH gives up on the probe after the
    ``ALIVE_COUNT``-th unanswered one, and the first is sent one interval after the last data."""
    return float(interval * (ALIVE_COUNT + 1))


@contextlib.contextmanager
def kept_alive(interval: int) -> Iterator[Path | None]:
    """While entered, ``ssh`` started by nodekit's children (the docker CLI) keeps alive every ``interval``
    seconds (:func:`nodekit.system.ssh.alive_wrapper`). Yields the wrapper's directory (None without an ssh client)."""
    real = shutil.which("ssh", path=proc.environ().get("PATH"))
    if real is None:
        yield None
        return
    d = Path(tempfile.mkdtemp(prefix=f"nkalive.{os.getpid()}."))  # the pid names whose it is, as nkssh does
    try:
        wrapper = d / "ssh"
        wrapper.write_text(ssh.alive_wrapper(real, interval=interval, count=ALIVE_COUNT, connect_timeout=CONNECT_S))
        wrapper.chmod(0o755)
        with proc.extra_env({"PATH": f"{d}{os.pathsep}{proc.environ().get('PATH', '')}"}):
            yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
