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
from nodekit.system.proc.deadlines import Deadline, Stall, Unbounded, hung, stalled

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
        stop_with: int = signal.SIGTERM,
    ) -> None:
        self._popen, self.what, self.fix, self.deadline, self.group = popen, what, fix, deadline, group
        self.stop_with = stop_with
        self._cause, self._error = cause, error
        self.timed_out = False
        self._timer: threading.Timer | None = None
        self._blocked_since: float | None = None
        self._done = threading.Event()
        with _live_lock:
            _live[id(self)] = self
        if timer and isinstance(deadline, Stall):
            watch = threading.Thread(target=self._watch_progress, args=(deadline.seconds,), daemon=True)
            watch.start()
        elif timer and isinstance(deadline, int | float):
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

    def sweep(self) -> None:
        """SIGKILL to what is left of its process group once it has ended (a grandchild that outlived its parent's
        SIGTERM). The group's id cannot be taken by a new process while any member of the group lives."""
        if self.group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, signal.SIGKILL)

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

    def communicate(self, given: bytes | None, seconds: float | None) -> tuple[str, str]:
        """``given`` on its standard input (None: none of ours), then its end; its standard output and error (as
        text) once it has ended, within ``seconds`` from now (None: no bound): past them it is killed and
        :func:`hung`'s error raised. Started with its output piped. Whatever interrupts the wait (Ctrl-C, a stop
        signal) kills it first."""
        try:
            out, err = self._popen.communicate(input=given, timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            assert seconds is not None
            raise hung(self.what, seconds, self.fix, cause=self._cause, error=self._error) from None
        except BaseException:
            self.kill()
            self.wait()
            raise
        self.wait()
        return out.decode(errors="replace"), err.decode(errors="replace")

    def cut_off(self) -> None:
        """End a process this one feeds on stdin: killed if it still runs, reaped, its stdin closed."""
        if self.poll() is None:
            self.kill()
        self.wait()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.stdin.close()

    def lines(self, *, keep_ends: bool = False) -> Iterator[str]:
        """Its standard output as text lines (universal newlines, undecodable bytes replaced). ``keep_ends``: split
        at "\n", "\r\n" and a lone "\r" alike, each line with its ending as written, so that a carriage return (a
        progress bar redrawing itself) stays told apart from a new line."""
        assert self.stdout is not None
        yield from io.TextIOWrapper(self.stdout, errors="replace", newline="" if keep_ends else None)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around one blocking read from it or write into it: with a :class:`Stall` deadline it is stopped (and
        :meth:`check` raises) once one of these blocks that long. Time spent elsewhere (the reader busy feeding
        slow consumers) never counts against it."""
        self._blocked_since = time.monotonic()
        try:
            yield
        finally:
            self._blocked_since = None

    def check(self) -> None:
        """The deadline's error when the deadline killed it."""
        if not self.timed_out:
            return
        if isinstance(self.deadline, Stall):
            raise stalled(self.what, self.deadline.seconds, self.fix, cause=self._cause, error=self._error)
        assert not isinstance(self.deadline, Unbounded)
        raise hung(self.what, self.deadline, self.fix, cause=self._cause, error=self._error)

    def _expire(self) -> None:
        if self._popen.poll() is None:
            self.timed_out = True
            self.kill()

    def _watch_progress(self, seconds: float) -> None:
        while not self._done.is_set():
            since = self._blocked_since
            blocked = 0.0 if since is None else time.monotonic() - since
            if blocked >= seconds:
                self._expire()
                return
            self._done.wait(min(seconds - blocked, 1.0))

    def _reaped(self) -> None:
        self._done.set()
        if self._timer is not None:
            self._timer.cancel()
        with _live_lock:
            _live.pop(id(self), None)


def live() -> list[Child]:
    """The children started here that have not been reaped yet."""
    with _live_lock:
        return list(_live.values())


def terminate_all(grace: float = 5.0) -> int:
    """End every live child: its ``stop_with`` signal (SIGTERM; SIGKILL for a byte stream, which may sit blocked
    writing into a pipe nobody reads any more and holds nothing to clean up) to each (to its process group when it
    has one), up to ``grace`` seconds for
    all of them to exit, then SIGKILL to what remains, each group included. Returns how many there were. Bounded
    (safe in a signal handler): a child another thread is waiting on may be left for that thread to reap."""
    children = live()
    for c in children:
        c.send(c.stop_with)
    end = time.monotonic() + grace
    left = [c for c in children if c.wait(max(0.0, end - time.monotonic())) is None]
    for c in left:
        c.kill()
    for c in left:
        c.wait(grace)
    for c in children:
        c.sweep()
    return len(children)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs on this machine (one of another user's counts as running). A pid read
    from a file (a run record, a directory's name) may be anything: one that no process can have is not alive
    (os.kill would raise OverflowError beyond a pid_t, and 0 or a negative one names a process group)."""
    if type(pid) is not int or not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
