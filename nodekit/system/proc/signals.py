"""Signals end a command cleanly: one piece for every command, installed by the CLI (:func:`stopping`).

SIGHUP (the SSH session to the head closed), SIGTERM (kill, systemd, a batch system's stop) and SIGINT (Ctrl-C) all
do what Ctrl-C always did: the first one ends every child nodekit started (:func:`~nodekit.system.proc.terminate_all`:
SIGTERM to each child's process group, SIGKILL after a grace), so that nothing it started goes on creating things,
and then raises :class:`Interrupted` in the main thread. The command's own cleanup runs as that exception unwinds
(``compose down`` of what it started, a private ssh-agent stopped, temporary directories removed; each under its own
deadline). Later signals are noted but do not interrupt that cleanup. When the command ends, whatever child is still
live (one a worker thread started during the cleanup) is ended too, and the CLI exits with 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from nodekit.system.proc.children import terminate_all

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
GRACE_S = 5.0
"""How long a child gets between SIGTERM and SIGKILL (``docker compose up`` ends its requests in well under that)."""


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived: every ``except KeyboardInterrupt`` path (Ctrl-C's) cleans up for it the same way.
    ``exit_code`` is the shell's convention, 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_state = threading.local()
_received: list[int] = []


_left: list[str] = []


def left_behind(what: str) -> None:
    """Record something this command started that stopping could not end or confirm ended (a container a host's
    engine may still be starting after its ssh was killed): the closing line names it instead of saying that
    everything was ended. Cleared when :func:`stopping` is entered."""
    _left.append(what)


def left() -> list[str]:
    """What :func:`left_behind` recorded during the command that runs now."""
    return list(_left)


def interrupted() -> bool:
    """Whether a stop signal arrived during the command that runs now: a worker thread about to start something
    new (a node's ``compose up``) checks this and starts nothing."""
    return bool(_received)


@contextlib.contextmanager
def stopping(*, grace: float = GRACE_S) -> Iterator[list[int]]:
    """While entered (in the main thread; elsewhere it changes nothing), SIGHUP, SIGINT and SIGTERM end every live
    child and raise :class:`Interrupted`; see the module docstring. Yields the list of the signals received. On
    exit after a signal or an exception, every child still live is ended; the previous handlers are put back.
    Nested uses are one."""
    if threading.current_thread() is not threading.main_thread() or getattr(_state, "active", False):
        yield []
        return
    received: list[int] = []
    _received.clear()
    _left.clear()
    cleaning = [False]

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        _received.append(signum)
        if len(received) > 1 or cleaning[0]:
            return  # the cleanup the first one started goes on, under its own deadlines
        terminate_all(grace)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    _state.active = True
    failed = True
    try:
        yield received
        failed = False
    finally:
        cleaning[0] = True
        try:
            if received or failed:
                terminate_all(grace)  # a command that ends early leaves nothing of its own running either
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            _state.active = False
            _received.clear()
