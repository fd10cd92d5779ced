"""The deadline of nodekit.lock's pip calls, and the names nodekit.lock calls them by.

The deadline itself, the kill and the one-line DeadlineError are nodekit.proc's (the one process runner); this
module stays until nodekit/lock.py is split (another change), which then asks nodekit.proc directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nodekit import proc

# Resolving or downloading wheels: generous (a large index on a slow link), but not forever.
PIP_TIMEOUT_S = 1800.0


def run(
    argv: Sequence[str], *, timeout: float, what: str, fix: str, env: Mapping[str, str] | None = None
) -> proc.Result:
    """:func:`nodekit.proc.run`: output captured as text, DeadlineError when ``timeout`` passes (the process is
    killed first). ``env`` is the whole environment (None or empty: this process's)."""
    return proc.run(argv, deadline=timeout, what=what, fix=fix, env=env or None)
