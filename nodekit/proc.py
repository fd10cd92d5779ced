"""The one door to the outside: every process nodekit starts goes through here (the launcher, which runs inside
the image, keeps its own).

- :func:`run`: a command whose output is captured, under a deadline: its :class:`Result`, or the deadline's error
  (one line naming what hung) once it has been killed.
- :func:`start`: a command whose pipes the caller streams (docker save/load, ssh, zstd, mmdebstrap): a
  :class:`Child`. A child with a deadline is killed when it passes, and :meth:`Child.check` raises the error.
- :func:`command_prefix`: for the docker CLI that python-on-whales starts itself (nodekit.docker): the same
  environment and the same deadline, as an argv prefix (GNU timeout(1)); :func:`stopped` recognises its exit.
- :func:`environ`, :func:`extra_env`: the environment every child gets. ``os.environ`` is never changed.
- :func:`terminate_all`: for a signal handler: every live child started here is ended (its process group when it
  has one: SIGTERM, then SIGKILL after a grace).

Every call names its deadline: seconds, or :class:`Unbounded` saying what bounds the call instead.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Literal

from nodekit.errors import DeadlineError

Stdio = Literal["inherit", "pipe", "devnull", "stdout"]
_STDIO: dict[str, int | None] = {
    "inherit": None,
    "pipe": subprocess.PIPE,
    "devnull": subprocess.DEVNULL,
    "stdout": subprocess.STDOUT,
}
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


@dataclass(frozen=True)
class Result:
    """What a finished :func:`run` returns (the attribute names of ``subprocess.CompletedProcess``)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def hung(
    what: str, seconds: float, fix: str, *, cause: str = "it hung", error: type[DeadlineError] = DeadlineError
) -> DeadlineError:
    """The error for a call its deadline stopped: one line naming what hung and for how long."""
    return error(f"{what} did not finish within {seconds:g} s and was stopped ({cause})", fix=fix)


# --- the environment of children --------------------------------------------------------------------------------

_env_lock = threading.Lock()
_overlays: list[dict[str, str]] = []


def overlay() -> dict[str, str]:
    """The variables :func:`extra_env` adds right now (later entries win)."""
    with _env_lock:
        return {k: v for o in _overlays for k, v in o.items()}


def environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child gets: this process's, then every :func:`extra_env` in force, then ``extra``."""
    return {**os.environ, **overlay(), **(extra or {})}


@contextlib.contextmanager
def extra_env(values: Mapping[str, str]) -> Iterator[None]:
    """While entered, every child started here (and the docker CLI python-on-whales starts, through
    :func:`command_prefix`) also gets ``values``, in every thread; ``os.environ`` stays as it is."""
    entry = dict(values)
    with _env_lock:
        _overlays.append(entry)
    try:
        yield
    finally:
        with _env_lock:
            _overlays[:] = [o for o in _overlays if o is not entry]


# --- processes started by others (python-on-whales) ------------------------------------------------------------


@functools.cache
def gnu_timeout() -> bool:
    """Whether GNU timeout(1) is on PATH (Linux): without it, :func:`command_prefix` applies no deadline."""
    if shutil.which("timeout") is None:
        return False
    try:
        out = run(["timeout", "--version"], deadline=10, what="timeout --version", fix="").stdout
    except (OSError, DeadlineError):
        return False
    return "GNU coreutils" in out


def command_prefix(deadline: Deadline | None) -> list[str]:
    """What goes before a command another library starts: ``env`` with the :func:`extra_env` variables, and GNU
    timeout(1) with ``deadline`` (none for :class:`Unbounded` or None). ``--foreground`` keeps the command in our
    process group, so Ctrl-C reaches it as before; ``--kill-after`` ends one that ignores the TERM."""
    prefix: list[str] = []
    if extra := overlay():
        prefix += ["env", *(f"{k}={v}" for k, v in extra.items())]
    if isinstance(deadline, int | float) and gnu_timeout():
        prefix += ["timeout", "--foreground", f"--kill-after={KILL_AFTER_S}", f"{deadline:g}"]
    return prefix


def stopped(returncode: int | None) -> bool:
    """Whether a command run behind :func:`command_prefix`'s deadline was stopped by it."""
    return returncode in TIMEOUT_CODES and gnu_timeout()


# --- processes started here ------------------------------------------------------------------------------------


def _popen(
    argv: list[str],
    *,
    env: dict[str, str],
    deadline: Deadline,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    group: bool,
) -> subprocess.Popen[bytes]:
    """The one place a process starts. ``deadline`` is applied by the caller (:class:`Child`, :func:`run`); it is
    passed here so that a test replacing this function (tests/unit/conftest.py) sees it with the command line."""
    return subprocess.Popen(
        argv,
        env=env,
        stdin=_STDIO[stdin],
        stdout=_STDIO[stdout],
        stderr=_STDIO[stderr],
        process_group=0 if group else None,
    )


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


def start(
    argv: Sequence[str],
    *,
    deadline: Deadline,
    what: str,
    fix: str = "",
    env: Mapping[str, str] | None = None,
    stdin: Stdio = "inherit",
    stdout: Stdio = "inherit",
    stderr: Stdio = "inherit",
    group: bool = False,
) -> Child:
    """Start ``argv`` (``env``: its whole environment; None: :func:`environ`). With ``group`` it leads a process
    group of its own, which :meth:`Child.send` and :func:`terminate_all` signal as a whole. OSError when it cannot
    start (no such program)."""
    popen = _popen(list(argv), env=dict(env) if env is not None else environ(), deadline=deadline, stdin=stdin,
                   stdout=stdout, stderr=stderr, group=group)  # fmt: skip
    return Child(popen, what=what, fix=fix, deadline=deadline, group=group)


def run(
    argv: Sequence[str],
    *,
    deadline: float,
    what: str,
    fix: str,
    env: Mapping[str, str] | None = None,
    stdin: Stdio = "inherit",
    group: bool = False,
    cause: str = "it hung",
    error: type[DeadlineError] = DeadlineError,
) -> Result:
    """Run ``argv`` to its end with its output captured (as text); when ``deadline`` seconds pass first it is
    killed and :func:`hung`'s ``error`` raised. A non-zero exit is the caller's to judge (``returncode``)."""
    popen = _popen(list(argv), env=dict(env) if env is not None else environ(), deadline=deadline, stdin=stdin,
                   stdout="pipe", stderr="pipe", group=group)  # fmt: skip
    child = Child(popen, what=what, fix=fix, deadline=deadline, group=group, timer=False)
    try:
        out, err = popen.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise hung(what, deadline, fix, cause=cause, error=error) from None
    except BaseException:
        child.kill()
        child.wait()
        raise
    code = child.wait()
    assert code is not None
    return Result(tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace"))


# --- ending everything ----------------------------------------------------------------------------------------


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
