"""The children nodekit started and has not reaped yet, and the ways to end them: one, or all at once
(:func:`terminate_all`, for a signal handler)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO

from nodekit.errors import DeadlineError
from nodekit.proc.deadlines import Deadline, Unbounded, hung

_live_lock = threading.RLock()  # re-entrant: a signal handler may run while this thread holds it
_live: dict[int, Child] = {}


class Child:
    """A process :func:`start` started: its pipes (bytes), and ways to end it that reach its process group when
    it has one. Listed in :func:`live` until it is reaped."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        what: str,
        fix: str,
        deadline: Deadline,
        group: bool,
        cause: str = "it hung",
        error: type[DeadlineError] = DeadlineError,
        timer: bool = True,
    ) -> None:
        self._popen, self.what, self.fix, self.deadline, self.group = popen, what, fix, deadline, group
        self._cause, self._error = cause, error
        self.timed_out = False
        self._timer: threading.Timer | None = None
        with _live_lock:
            _live[id(self)] = self
        if timer and not isinstance(deadline, Unbounded):
            self._timer = threading.Timer(deadline, self._expire)
            self._timer.daemon = True
            self._timer.start()

    @property
    def stdin(self) -> IO[bytes] | None:
        return self._popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        return self._popen.stdout

    @property
    def stderr(self) -> IO[bytes] | None:
        return self._popen.stderr

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        code = self._popen.poll()
        if code is not None:
            self._reaped()
        return code

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code once it has ended; None when it still runs after ``timeout`` seconds."""
        try:
            code = self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reaped()
        return code

    def send(self, sig: int) -> None:
        """``sig`` to its process group (when started with ``group``) and to it, unless it has been reaped."""
        if self._popen.returncode is not None:
            return
        if self.group:  # a zombie leader still holds its pid: the group id cannot have been reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, sig)
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send(signal.SIGKILL)

    def terminate(self) -> None:
        self.send(signal.SIGTERM)

    def end(self, grace: float) -> int | None:
        """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; its exit code."""
        self.terminate()
        if (code := self.wait(grace)) is not None:
            return code
        return self.wait_or_kill(0)

    def wait_or_kill(self, seconds: float) -> int | None:
        """Up to ``seconds`` to exit, then SIGKILL; its exit code."""
        if (code := self.wait(seconds)) is not None:
            return code
        self.kill()
        return self.wait()

    def cut_off(self) -> None:
        """End a process this one feeds on stdin: killed if it still runs, reaped, its stdin closed."""
        if self.poll() is None:
            self.kill()
        self.wait()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.stdin.close()

    def lines(self) -> Iterator[str]:
        """Its standard output as text lines (universal newlines, undecodable bytes replaced)."""
        assert self.stdout is not None
        yield from io.TextIOWrapper(self.stdout, errors="replace")

    def check(self) -> None:
        """The deadline's error when the deadline killed it."""
        if self.timed_out:
            assert not isinstance(self.deadline, Unbounded)
            raise hung(self.what, self.deadline, self.fix, cause=self._cause, error=self._error)

    def _expire(self) -> None:
        if self._popen.poll() is None:
            self.timed_out = True
            self.kill()

    def _reaped(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with _live_lock:
            _live.pop(id(self), None)


def live() -> list[Child]:
    """The children started here that have not been reaped yet."""
    with _live_lock:
        return list(_live.values())


def terminate_all(grace: float = 5.0) -> int:
    """End every live child: SIGTERM to each (to its process group when it has one), up to ``grace`` seconds for
    all of them to exit, then SIGKILL to what remains. Returns how many there were. Bounded (safe in a signal
    handler): a child another thread is waiting on may be left for that thread to reap."""
    children = live()
    for c in children:
        c.terminate()
    end = time.monotonic() + grace
    left = [c for c in children if c.wait(max(0.0, end - time.monotonic())) is None]
    for c in left:
        c.kill()
    for c in left:
        c.wait(grace)
    return len(children)
