"""The one door from nodekit slurm to other programs (sbatch, squeue, scontrol, scancel, docker, mksquashfs).

Every process this package starts goes through :func:`run`, with a deadline, so that moving to the project's
process runner is one edit here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodekit.errors import DeadlineError, UsageError

QUERY_S = 30.0  # sbatch, squeue, scontrol, scancel: the controller answers in well under a second


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
) -> Result:
    """Run ``argv`` to its end and capture its output. A missing program is a UsageError naming it; a program
    that outlives ``timeout`` is killed and a DeadlineError."""
    try:
        proc = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise UsageError(f"{argv[0]} is not on PATH", fix=f"install {argv[0]}, or run nodekit where it is") from None
    except subprocess.TimeoutExpired:
        raise DeadlineError(
            f"{' '.join(argv[:3])} did not finish within {timeout:g} s and was stopped",
            fix="check that the Slurm controller answers (scontrol ping)",
        ) from None
    return Result(proc.returncode, proc.stdout, proc.stderr)
