"""What a deadline is, and the one line that says one passed. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from nodekit.errors import DeadlineError

TIMEOUT_CODES = (124, 137)
"""timeout(1)'s exit code when the deadline passed; 128+9 when it had to kill."""
KILL_AFTER_S = 5
"""timeout(1) kills a command that ignores its TERM this long after it."""


@dataclass(frozen=True)
class Unbounded:
    """No deadline, said out loud: ``why`` names what bounds the call instead (the job's length for a log follow;
    the consumer of a stream, which cuts it off)."""

    why: str


Deadline = float | Unbounded


def hung(
    what: str, seconds: float, fix: str, *, cause: str = "it hung", error: type[DeadlineError] = DeadlineError
) -> DeadlineError:
    """The error for a call its deadline stopped: one line naming what hung and for how long."""
    return error(f"{what} did not finish within {seconds:g} s and was stopped ({cause})", fix=fix)
