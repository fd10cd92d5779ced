"""Deadlines for calls that can hang: a subprocess that does not finish in time is killed and reported as one line
naming what hung (DeadlineError), never a traceback and never a wait without end."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from nodekit.errors import DeadlineError

# Resolving or downloading wheels: generous (a large index on a slow link), but not forever.
PIP_TIMEOUT_S = 1800.0


def run(argv: Sequence[str], *, timeout: float, what: str, fix: str) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv)`` with output captured as text and a deadline; DeadlineError when it passes (the
    process is killed: subprocess.run does that before raising)."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeadlineError(f"{what} did not finish within {timeout:g} s and was stopped (it hung)", fix=fix) from None
