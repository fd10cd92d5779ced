"""torchrun in the launcher's own process: its entry point called after the preflight (torch is imported already),
alone or under the peer watchdog, a stop from outside said as a stop, a failure as one line with torchrun's report in
the run log. Standard library and torch only (this runs in the image)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from nodekit.launcher import runlog
from nodekit.launcher.contract import EXIT_OK
from nodekit.launcher.runlog import err
from nodekit.launcher.stacks import collect
from nodekit.launcher.stops import STOP_SIGNALS, Stopped, outside_signal, say_stopped, signal_name, tell_watchdog
from nodekit.launcher.watchdog.failure import worker_failure
from nodekit.launcher.watchdog.run import Watchdog


def torchrun_path() -> str:
    # The torchrun next to this interpreter, so the workers run in the same environment as the launcher.
    sibling = Path(sys.executable).with_name("torchrun")
    return str(sibling) if sibling.is_file() else "torchrun"


def in_process(argv: Sequence[str]) -> int:
    """Run torchrun's own entry point in this process, after a preflight that has already imported torch.

    Exec'ing the torchrun script would import torch a second time on the critical path (about 2 s here, the
    whole of preflight's cost). The argv is exactly the one exec would get; torchrun's errors propagate as they
    would from its console script (traceback, exit 1).
    """
    from torch.distributed.run import main as torchrun_main  # type: ignore[import-not-found, unused-ignore]

    from nodekit.launcher.phases import mark_rendezvous

    mark_rendezvous()
    sys.argv = list(argv)
    sys.stdout.flush()
    torchrun_main(list(argv[1:]))
    return EXIT_OK


def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def distinct_node(node_rank: int) -> None:
    """c10d tells the nodes of a rendezvous apart by (address, PID, a per-process counter). Two containers on one
    machine (``nodekit up`` twice with main 127.0.0.1) have the same address and, under docker-init, the same PID:
    they would count as one node and the rendezvous would never fill. Starting this node's counter at its node rank
    keeps them apart, and orders their group ranks as their node ranks. torch's own state; nothing to do where a
    torch lacks it."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (  # type: ignore[import-not-found, unused-ignore]
            DynamicRendezvousHandler,
        )

        generator = DynamicRendezvousHandler._node_desc_generator
        with getattr(generator, "_lock", contextlib.nullcontext()):
            generator._local_id = max(int(generator._local_id), node_rank)
    except (ImportError, AttributeError, TypeError, ValueError):
        pass


def alone(argv: Sequence[str], max_restarts: int, log: Path) -> int:
    """:func:`in_process` without a watchdog (one node, or peer_timeout = 0): a stop from outside is
    still a stop, exit 128 + the signal with one line, not a crash with torchrun's traceback; a failure is one line
    here and its traceback in the run log."""
    try:
        return in_process(argv)
    except BaseException as e:
        signum = outside_signal(e)
        if signum is not None:
            say_stopped(signum, 128 + signum)
            return 128 + signum
        if not isinstance(e, Exception):
            raise
        err(runlog.torchrun_failed(e, log, worker_failed=worker_failure(e, max_restarts) is not None))
        return 1


def watched(
    argv: Sequence[str], dog: Watchdog, max_restarts: int = 0, log: Path | None = None, worker_dir: str = ""
) -> int:
    """:func:`in_process` with the peer watchdog running; the exit code is torchrun's unless the watchdog
    stopped it, or found after torchrun failed that a node was lost (then 19) or failed first (19 too).

    The watchdog stops torchrun with SIGTERM to this process: torchrun's handler raises its SignalException in the
    main thread, and its agent stops the workers (SIGTERM, SIGKILL 30 s later) before re-raising it. While torchrun
    restarts workers (max_restarts) this process lives on and keeps beating, so a restart is never a lost node; a
    torchrun that gives up publishes the worker it gave up on, which every node names, with the exception that ended
    it where the worker left one in ``worker_dir`` (:mod:`nodekit.launcher.stacks.hook`).
    """

    def _after(signum: int, frame: FrameType | None) -> None:
        # torchrun leaves its handler installed, which would raise its SignalException anywhere below. The
        # watchdog's own signal can land after torchrun returned: it was already acted on.
        if dog.alarm is None:
            raise Stopped(signum)

    tell_watchdog(dog)
    dog.start()
    error: BaseException | None = None
    outside: int | None = None
    try:
        try:
            in_process(argv)
        finally:
            for s in STOP_SIGNALS:
                signal.signal(s, _after)
        code = EXIT_OK
    except BaseException as e:  # a stop from outside; SystemExit; else (ChildFailedError) exit 1, said in one line
        outside = outside_signal(e) if dog.alarm is None else None
        if outside is not None:
            code = 128 + outside
        elif isinstance(e, SystemExit):
            code = e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else 1)
        else:
            code, error = 1, e
    if outside is not None:  # a stop, not a crash: no traceback; torchrun already ended the workers with it
        say_stopped(outside, code)
    failure = None
    if error is not None and dog.alarm is None:
        failure = worker_failure(error, max_restarts, lambda pid: collect.raised(worker_dir, pid) if worker_dir else "")
    if error is not None and dog.alarm is None:
        # Said now, as an uncaught exception would be, not after the wait for the other nodes below.
        if log is None:
            traceback.print_exception(error)
        else:
            err(runlog.torchrun_failed(error, log, worker_failed=failure is not None))
        sys.stderr.flush()
    try:
        return dog.finish(code, failure, signal=outside or 0).code
    except Stopped as e:
        err(f"stopped by {signal_name(e.signum)} while waiting for the other nodes to end")
        return 128 + e.signum if outside is None else code
