"""Starting a process: :func:`run` (output captured, under a deadline) and :func:`start` (pipes streamed), both
through :func:`_popen`, the one place a process starts; and :func:`command_prefix`, the same deadline and
environment for the docker CLI that python-on-whales starts itself."""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from nodekit.errors import DeadlineError
from nodekit.system.proc.children import Child
from nodekit.system.proc.deadlines import KILL_AFTER_S, TIMEOUT_CODES, Deadline, Unbounded
from nodekit.system.proc.env import environ, overlay

Stdio = Literal["inherit", "pipe", "devnull", "stdout"]
_STDIO: dict[str, int | None] = {
    "inherit": None,
    "pipe": subprocess.PIPE,
    "devnull": subprocess.DEVNULL,
    "stdout": subprocess.STDOUT,
}


@dataclass(frozen=True)
class Result:
    """What a finished :func:`run` returns (the attribute names of ``subprocess.CompletedProcess``)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


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
    stop_with: int = signal.SIGTERM,
) -> Child:
    """Start ``argv`` (``env``: its whole environment; None: :func:`environ`). With ``group`` it leads a process
    group of its own, which :meth:`Child.send` and :func:`terminate_all` signal as a whole; ``stop_with`` is the
    signal :func:`terminate_all` ends it with (SIGKILL for byte streams). OSError when it cannot start."""
    popen = _popen(list(argv), env=dict(env) if env is not None else environ(), deadline=deadline, stdin=stdin,
                   stdout=stdout, stderr=stderr, group=group)  # fmt: skip
    return Child(popen, what=what, fix=fix, deadline=deadline, group=group, stop_with=stop_with)


def run(
    argv: Sequence[str],
    *,
    deadline: float | Unbounded,
    what: str,
    fix: str,
    env: Mapping[str, str] | None = None,
    stdin: Stdio = "inherit",
    group: bool = False,
    cause: str = "it hung",
    error: type[DeadlineError] = DeadlineError,
    given: bytes | None = None,
    stop_with: int = signal.SIGTERM,
) -> Result:
    """Run ``argv`` to its end with its output captured (as text); when ``deadline`` seconds pass first it is
    killed and :func:`hung`'s ``error`` raised. A non-zero exit is the caller's to judge (``returncode``). Whatever
    interrupts the wait (Ctrl-C, a signal turned into :class:`~nodekit.system.proc.Interrupted`) kills it first, its
    whole process group with ``group``. ``given``: its standard input, then its end (``stdin`` is then ignored).
    ``stop_with``: what a stop signal's :func:`~nodekit.system.proc.terminate_all` sends it first (0: nothing, it is
    given the grace period to end on its own)."""
    popen = _popen(list(argv), env=dict(env) if env is not None else environ(), deadline=deadline,
                   stdin="pipe" if given is not None else stdin, stdout="pipe", stderr="pipe", group=group)  # fmt: skip
    child = Child(popen, what=what, fix=fix, deadline=deadline, group=group, timer=False, stop_with=stop_with,
                  cause=cause, error=error)  # fmt: skip
    out, err = child.communicate(given, None if isinstance(deadline, Unbounded) else deadline)
    code = child.returncode
    assert code is not None
    return Result(tuple(argv), code, out, err)


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
