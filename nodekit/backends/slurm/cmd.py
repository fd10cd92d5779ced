"""nodekit slurm's calls of other programs (sbatch, squeue, scontrol, scancel, docker, mksquashfs, enroot), all
through nodekit's one process runner (:mod:`nodekit.system.proc`) with a deadline."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodekit.errors import UsageError
from nodekit.system import proc

QUERY_S = 30.0  # sbatch, squeue, scontrol, scancel: the controller answers in well under a second
CONTROLLER_FIX = "check that the Slurm controller answers (scontrol ping)"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def message(self) -> str:
        """The program's own last words: stderr, else stdout, on one line."""
        text = (self.err.strip() or self.out.strip()).splitlines()
        return " ".join(line.strip() for line in text[-3:]) if text else f"exit code {self.code}"


def run(
    argv: Sequence[str],
    *,
    timeout: float = QUERY_S,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    fix: str = CONTROLLER_FIX,
) -> Result:
    """Run ``argv`` to its end and capture its output (``stdin``: text fed to it). A missing program is a
    UsageError naming it; a program that outlives ``timeout`` is killed and a DeadlineError naming it."""
    what = " ".join(argv[:3])
    try:
        if stdin is None:
            done = proc.run(argv, deadline=timeout, what=what, fix=fix, env=env, stdin="devnull")
            return Result(done.returncode, done.stdout, done.stderr)
        return _fed(argv, stdin, timeout=timeout, what=what, fix=fix, env=env)
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} is not on PATH", fix=f"install {argv[0]}, or run nodekit where it is") from None


def _fed(
    argv: Sequence[str], text: str, *, timeout: float, what: str, fix: str, env: Mapping[str, str] | None
) -> Result:
    """``argv`` with ``text`` on its standard input (a script for ``sbatch --test-only``: small, so writing it all
    before reading cannot fill a pipe)."""
    child = proc.start(argv, deadline=timeout, what=what, fix=fix, env=env, stdin="pipe", stdout="pipe", stderr="pipe")
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    try:
        with contextlib.suppress(BrokenPipeError):  # it exited without reading: its exit code and stderr say why
            child.stdin.write(text.encode())
            child.stdin.close()
        out, err = child.stdout.read(), child.stderr.read()
    finally:
        code = child.wait_or_kill(timeout)
    child.check()
    return Result(code if code is not None else 1, out.decode(errors="replace"), err.decode(errors="replace"))
