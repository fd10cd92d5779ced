"""Deadlines for calls that can hang: a subprocess that does not finish in time is killed and reported as one line
naming what hung (DeadlineError), never a traceback and never a wait without end."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping, Sequence

from nodekit.errors import DeadlineError

# Resolving or downloading wheels: generous (a large index on a slow link), but not forever.
PIP_TIMEOUT_S = 1800.0
APT_TIMEOUT_S = 900.0
# mmdebstrap downloads and unpacks a whole Debian root; minutes normally, an hour means a stalled mirror.
MMDEBSTRAP_TIMEOUT_S = 3600.0


def run(
    argv: Sequence[str], *, timeout: float, what: str, fix: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv)`` with output captured as text and a deadline; DeadlineError when it passes (the
    process is killed: subprocess.run does that before raising)."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, check=False, timeout=timeout, env=dict(env) if env else None
        )
    except subprocess.TimeoutExpired:
        raise DeadlineError(f"{what} did not finish within {timeout:g} s and was stopped (it hung)", fix=fix) from None


class Killer:
    """For a streamed Popen whose output is read line by line: kills it when ``timeout`` passes. Use as a context
    manager around the read loop; ``fired`` says whether it had to, and :meth:`check` turns that into the error."""

    def __init__(self, proc: subprocess.Popen[str], timeout: float, what: str, fix: str) -> None:
        self.proc, self.timeout, self.what, self.fix = proc, timeout, what, fix
        self.fired = False
        self._timer = threading.Timer(timeout, self._kill)
        self._timer.daemon = True

    def _kill(self) -> None:
        self.fired = True
        self.proc.kill()

    def __enter__(self) -> Killer:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def check(self) -> None:
        if self.fired:
            raise DeadlineError(
                f"{self.what} did not finish within {self.timeout:g} s and was stopped (it hung)", fix=self.fix
            )
