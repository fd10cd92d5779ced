"""A node stopped from outside: ``docker stop`` and ``compose down`` (SIGTERM), ``docker kill -s HUP|INT|TERM``, an
administrator. It is a stop, not a crash: the node exits 128 + the signal with one line naming it (no traceback),
and its done mark says so, so that the other nodes name it as stopped by that signal, not as failed, and never blame
themselves for the failures its stop causes in their workers. Standard library only (torch looked up lazily)."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from nodekit.launcher.watchdog.decide import SIGNAL_FROM as SIGNAL_FROM

if TYPE_CHECKING:
    from nodekit.launcher.watchdog.run import Watchdog

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""What stops a node from outside: ``docker stop`` and ``compose down`` (SIGTERM), ``docker kill -s HUP|INT|TERM``,
an administrator. The node exits 128 + the signal, saying which, and the others name it as stopped by it."""
STOPPED_BY = {128 + int(s): s.name for s in STOP_SIGNALS}
"""A node's exit codes that mean a signal from outside stopped it (128 + the signal), and the signal's name."""


class Stopped(SystemExit):
    """A stop signal from outside (:data:`STOP_SIGNALS`): exit 128 + its number. A SystemExit, so that if it lands
    inside torchrun's start-up (before torchrun installs its own handlers) the process still exits quietly."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def on_stop(signum: int, frame: FrameType | None) -> None:
    # As PID 1 in a container (or docker-init's child) a signal without a handler may be ignored, so `docker
    # compose down` during preflight would wait out the grace period and then SIGKILL; and SIGINT would raise a
    # KeyboardInterrupt wherever it landed. exec resets this handler; torchrun installs its own while it runs.
    raise Stopped(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def outside_signal(error: BaseException) -> int | None:
    """The signal an exception says stopped this node from outside: torchrun's SignalException (it turns SIGTERM,
    SIGINT and SIGHUP into one while it runs, after ending its workers with the same signal), ours, or Ctrl-C's;
    also when it is the cause or context of ``error``: torchrun's own cleanup can fail while it handles the stop
    (torch 2.13's agent once raised an UnboundLocalError there), and that is still the stop, not a crash."""
    seen: set[int] = set()
    chain: BaseException | None = error
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        signum = _signal_of(chain)
        if signum is not None:
            return signum
        chain = chain.__cause__ or chain.__context__
    return None


def _signal_of(error: BaseException) -> int | None:
    if isinstance(error, Stopped):
        return error.signum
    if isinstance(error, KeyboardInterrupt):
        return int(signal.SIGINT)
    sigval = getattr(error, "sigval", None)  # torch.distributed.elastic.multiprocessing.api.SignalException
    try:
        return int(sigval) if sigval is not None and int(sigval) in STOP_SIGNALS else None
    except (TypeError, ValueError):
        return None


def say_stopped(signum: int, code: int) -> None:
    sys.stdout.flush()
    print(f"nodekit: this node was stopped by {signal_name(signum)} ({SIGNAL_FROM}); its workers were stopped "
          f"(exit {code})", file=sys.stderr, flush=True)  # fmt: skip


def tell_watchdog(dog: Watchdog) -> None:
    """While torchrun runs, its own handler takes SIGTERM, SIGINT and SIGHUP (it ends the workers with the same
    signal, then raises): wrap it so that the watchdog learns of a stop from outside the moment it comes, not when
    torchrun is done ending the workers, by which time the other nodes' workers have failed with them. torchrun
    looks its handler up by name when it installs it; a torch without it is let be (the stop is then published
    when torchrun returns)."""
    try:
        from torch.distributed.elastic.multiprocessing import api  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    original = getattr(api, "_terminate_process_handler", None)
    if original is None or getattr(original, "nodekit_wrapped", False):
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum in STOP_SIGNALS:
            dog.stopping(signum)  # ignored once the watchdog's own alarm raised (its SIGTERM comes this way too)
        original(signum, frame)

    handler.nodekit_wrapped = True  # type: ignore[attr-defined]
    api._terminate_process_handler = handler
