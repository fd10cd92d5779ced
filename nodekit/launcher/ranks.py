"""Mode mpirun: this node's processes, started and watched by the launcher itself (no MPI runtime).

What Open MPI's ``mpirun`` does for a script that only reads its variables: start ``nproc_per_node`` processes with
``OMPI_COMM_WORLD_*`` set (``plan.mpirun_env``), pass their output through, and when one of them fails, stop the
others and exit with its code (mpirun's "primary job terminated normally, but 1 process returned a non-zero exit
code"). Around that, nodekit's own: the peer watchdog (another node lost or failed stops this node's processes, exit
19, naming it), and SIGTERM stopping every process (SIGTERM, then SIGKILL after ``STOP_GRACE_S``).

Not provided: an MPI runtime. A program that calls MPI itself (mpi4py's ``MPI.COMM_WORLD``, nccl-tests built with
MPI) finds no PMIx server to join; it needs Open MPI's own mpirun.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from types import FrameType

from nodekit.launcher.contract import EXIT_OK, EXIT_TERMINATED
from nodekit.launcher.plan import ExecPlan
from nodekit.launcher.watchdog.failure import WorkerFailure, signal_name
from nodekit.launcher.watchdog.run import Watchdog

POLL_S = 0.1
STOP_GRACE_S = 10.0


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every process still running, SIGKILL what is left after ``grace``."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _code(returncode: int) -> int:
    """A process's exit as a shell reports it: its code, or 128 + the signal that killed it."""
    return returncode if returncode >= 0 else 128 - returncode


def run_group(plan: ExecPlan, env: Mapping[str, str], first_rank: int) -> tuple[int, WorkerFailure | None]:
    """Start one process per ``plan.per_process`` and wait for all of them; the first to fail stops the others.

    Returns ``(code, failure)``: 0 when every process exited 0; else the first failed process's code (128 + signal
    when killed) and which it was; 143 when this launcher got SIGTERM (the peer watchdog's stop, or `nodekit
    down`), after stopping every process.
    """
    terminated = False

    def _on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal terminated
        terminated = True

    previous = signal.signal(signal.SIGTERM, _on_term)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sys.stdout.flush()
        for extra in plan.per_process:
            procs.append(subprocess.Popen(list(plan.argv), env={**plan.environ(env), **dict(extra)}))
        failure: WorkerFailure | None = None
        while not terminated:
            codes = [p.poll() for p in procs]
            failed = next((i for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                rc = int(codes[failed] or 0)
                failure = WorkerFailure(first_rank + failed, failed, rc, int(time.time()), -1)
                others = sum(1 for c in codes if c is None)
                how = f"was killed by {signal_name(-rc)}" if rc < 0 else f"exited with code {rc}"
                print(
                    f"nodekit: process rank {first_rank + failed} (local rank {failed}) {how}; stopping the other "
                    f"{others} process(es) on this node",
                    file=sys.stderr,
                    flush=True,
                )
                break
            if all(c == 0 for c in codes):
                return EXIT_OK, None
            time.sleep(POLL_S)
        _stop(procs)
        if failure is not None and not terminated:
            return _code(failure.exitcode), failure
        return EXIT_TERMINATED, None
    except BaseException:
        _stop(procs, grace=1.0)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_watched(plan: ExecPlan, env: Mapping[str, str], first_rank: int, dog: Watchdog | None) -> int:
    """:func:`run_group` under the peer watchdog (when there is one): its stop is SIGTERM to this process, which
    stops every local process; then the watchdog's ending decides the code (19 when another node was the cause)."""
    if dog is None:
        return run_group(plan, env, first_rank)[0]

    def _after(signum: int, frame: FrameType | None) -> None:
        # The watchdog's own SIGTERM can land after the processes ended: it was already acted on.
        if dog.alarm is None:
            raise SystemExit(EXIT_TERMINATED)

    dog.start()
    code, failure = run_group(plan, env, first_rank)
    signal.signal(signal.SIGTERM, _after)
    try:
        return dog.finish(code, failure).code
    except SystemExit:
        print("nodekit: error: terminated (SIGTERM) while waiting for the other nodes to end", file=sys.stderr)
        return EXIT_TERMINATED
