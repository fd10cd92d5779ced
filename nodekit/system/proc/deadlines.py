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


@dataclass(frozen=True)
class Stall:
    """A deadline on progress, not on the whole: the process is stopped once a read from it or a write into it
    blocks for ``seconds`` (:meth:`nodekit.system.proc.Child.waiting` marks them). For streams: a 10 GB image on a slow
    link moves for an hour, but a stream that stands still for a minute has hung."""

    seconds: float


Deadline = float | Unbounded | Stall


def hung(
    what: str, seconds: float, fix: str, *, cause: str = "it hung", error: type[DeadlineError] = DeadlineError
) -> DeadlineError:
    """The error for a call its deadline stopped: one line naming what hung and for how long."""
    return error(f"{what} did not finish within {seconds:g} s and was stopped ({cause})", fix=fix)


def stalled(
    what: str, seconds: float, fix: str, *, cause: str = "it hung", error: type[DeadlineError] = DeadlineError
) -> DeadlineError:
    """The error for a stream its :class:`Stall` deadline stopped: one line naming what stood still, how long."""
    return error(f"{what} made no progress for {seconds:g} s and was stopped ({cause})", fix=fix)
