"""A signal to a node's container is a stop, not a crash (issue 28): the signalled node exits 128 + the signal, and
the others name it as stopped by it, not as failed, and not themselves. Pure decisions, then the watchdog's
threads on an in-memory store (no torch); tests/integration/test_container_signals.py has the real engine."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

import pytest

from nodekit.launcher.preflight.exchange import Clock
from nodekit.launcher.stops import Stopped, outside_signal
from nodekit.launcher.watchdog.decide import Alarm, Done, Ending, Reading, Watch, alarm, alarm_line, conclude
from nodekit.launcher.watchdog.failure import WorkerFailure
from nodekit.launcher.watchdog.run import Watchdog
from tests.factories import MemStore

NAMES = {0: "10.0.0.5, host a", 1: "10.0.0.6, host b"}
HUP, INT, TERM = int(signal.SIGHUP), int(signal.SIGINT), int(signal.SIGTERM)


@dataclass
class SignalException(Exception):  # torch.distributed.elastic.multiprocessing.api's, as torchrun raises it
    sigval: signal.Signals


def test_the_signal_is_read_from_torchrun_s_exception_ours_or_ctrl_c() -> None:
    assert outside_signal(SignalException(signal.SIGHUP)) == HUP
    assert outside_signal(SignalException(signal.SIGTERM)) == TERM
    assert outside_signal(Stopped(INT)) == INT and Stopped(INT).code == 130
    assert outside_signal(KeyboardInterrupt()) == INT
    assert outside_signal(SignalException(signal.SIGQUIT)) is None  # not a stop: a crash report, as before
    assert outside_signal(RuntimeError("gloo: Connection closed by peer")) is None


def _raised_while_stopping(signum: int) -> BaseException:
    """What torchrun's own shutdown can raise when the stop lands in its cleanup: torch 2.13's agent read a local
    variable it had not set yet (an UnboundLocalError), seen once in a cleaned machine's suite (2026-12-06)."""
    try:
        try:
            raise SignalException(signal.Signals(signum))
        except SignalException:
            start: float
            print(start)  # noqa: F821 - the very error torchrun raised
    except UnboundLocalError as e:
        return e
    raise AssertionError("unreachable")


@pytest.mark.parametrize("signum", [HUP, INT, TERM])
def test_an_error_torchrun_raises_while_it_handles_a_stop_is_still_that_stop(signum: int) -> None:
    error = _raised_while_stopping(signum)
    assert isinstance(error, UnboundLocalError) and isinstance(error.__context__, SignalException)
    assert outside_signal(error) == signum
    chained = RuntimeError("in the agent")
    chained.__cause__ = error
    assert outside_signal(chained) == signum
    assert outside_signal(ValueError("a crash, no stop in its chain")) is None


@pytest.mark.parametrize("signum", [HUP, INT, TERM])
def test_the_others_name_a_signalled_node_as_stopped_and_never_themselves(signum: int) -> None:
    """Before: HUP and TERM gave exit 1 and "node 1 failed with exit code 1"; with INT main blamed itself (its own
    worker's gloo failure came first). Now the stop is the cause every node names, and the others exit 19."""
    done = Done(128 + signum, signal=signum)
    assert Done.from_json(done.to_json()) == done and not done.failed
    w = Watch(0, 2, 15.0, start=0.0)
    w.see(Reading(at=1.0, counts={1: 1}, done={1: done}))
    found = alarm(w, 1.0)
    assert found == Alarm(signalled=((1, done),))
    name = signal.Signals(signum).name
    assert alarm_line(found, NAMES) == (
        f"nodekit: node 1 (10.0.0.6, host b) was stopped by {name} (a signal to its container: nodekit down, "
        "docker stop, docker "
        "kill or an administrator); stopping this node"
    )
    # This node's own worker failed first (gloo lost its peer), and no alarm was raised yet: still the stop.
    own = Done(1, failure=WorkerFailure(rank=0, local_rank=0, exitcode=1, at=0, max_restarts=0))
    ending = conclude(w, 2.0, own, None, NAMES)
    assert ending.code == 19 and ending.line is not None
    assert f"node 1 (10.0.0.6, host b) was stopped by {name}" in ending.line and "node 0" not in ending.line
    # The signalled node itself: its own line was printed when the signal came; it keeps 128 + the signal.
    assert conclude(Watch(1, 2, 15.0, start=0.0), 2.0, done, None, NAMES) == Ending(128 + signum)


def test_a_stop_is_published_the_moment_it_comes_and_the_others_stop_naming_it() -> None:
    """The signalled node's done mark goes out when the signal comes (torchrun is still ending its workers), so
    the others stop on its word before their own workers' failures could be taken for the cause."""
    store = MemStore()
    lines: dict[int, list[str]] = {0: [], 1: []}
    stopped = {0: threading.Event(), 1: threading.Event()}

    def dog(r: int) -> Watchdog:
        return Watchdog(store, r, 2, 30.0, NAMES, stop=stopped[r].set, clock=Clock(log=lines[r].append),
                        err=lines[r].append, hard_exit=lambda code: None, beat_s=0.02, judge_s=0.01)  # fmt: skip

    dogs = {r: dog(r) for r in (0, 1)}
    for d in dogs.values():
        d.start()
    time.sleep(0.2)
    dogs[1].stopping(HUP)  # from torchrun's signal handler, while it ends node 1's workers
    assert stopped[0].wait(5), "node 0 did not stop on node 1's stop"
    assert Done.from_json(store.get("nodekit/done/1")) == Done(129, signal=HUP)
    assert not stopped[1].is_set()
    endings: dict[int, Ending] = {}

    def finish(r: int, code: int, signum: int) -> None:
        endings[r] = dogs[r].finish(code, signal=signum)

    threads = [threading.Thread(target=finish, args=a) for a in ((0, 19, 0), (1, 129, HUP))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert endings == {0: Ending(19), 1: Ending(129)}
    assert lines[0] == [
        "nodekit: node 1 (10.0.0.6, host b) was stopped by SIGHUP (a signal to its container: nodekit down, "
        "docker stop, docker "
        "kill or an administrator); stopping this node"
    ]
