"""The peer watchdog: who is lost, failed or settled, decided from counter readings on a fake clock (pure), and the
threads against an in-memory store with real time scaled down (a beat of 20 ms instead of 1 s). No torch."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import pytest

from nodekit.launcher.watchdog.run import (
    EXIT_PEER_LOST,
    Alarm,
    Done,
    Ending,
    Lost,
    Watch,
    alarm,
    alarm_line,
    conclude,
    lost_line,
    node_names,
)
from tests.factories import NAMES, MemStore, Node, beat, facts

T = 15.0  # the peer timeout


def run_beats(watch: Watch, until: float, *, silent_from: dict[int, float] | None = None, start: int = 0) -> None:
    """Every second up to ``until``, every peer's counter moves, except a peer's from its ``silent_from`` time on."""
    silent_from = silent_from or {}
    for t in range(start, int(until) + 1):
        counts = {r: min(t, int(silent_from.get(r, t))) for r in watch.peers}
        beat(watch, float(t), counts)


# ---- lost -------------------------------------------------------------------------------------------------------


def test_nodes_that_keep_beating_are_never_lost() -> None:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, 600)
    assert w.lost(600.0) == () and alarm(w, 600.0) is None


def test_a_node_whose_counter_stops_is_lost_after_the_timeout_and_not_before() -> None:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, 34, silent_from={2: 20})
    assert w.lost(34.0) == ()  # last moved at 20: 14 s of silence
    run_beats(w, 35, silent_from={2: 20}, start=35)
    assert w.lost(35.0) == (Lost(2, 15.0),)
    assert alarm(w, 35.0) == Alarm(lost=(Lost(2, 15.0),))


def test_only_counter_values_matter_not_their_size_or_the_other_clock() -> None:
    """A counter is never compared across nodes: any change is a beat, whatever the value."""
    w = Watch(1, 2, T, start=100.0)
    for i, t in enumerate(range(100, 200)):
        beat(w, float(t), {0: 10**9 - i})
    assert w.lost(200.0) == ()


def test_a_node_that_never_beats_is_lost_a_timeout_after_the_first_read() -> None:
    w = Watch(0, 2, T, start=0.0)
    for t in range(0, 16):
        beat(w, float(t) + 0.5, {1: 0})
    assert w.lost(15.5) == (Lost(1, 15.0),)


def test_a_node_marked_done_is_never_lost() -> None:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, 10)
    beat(w, 11.0, {1: 11, 2: 10}, done={2: Done(0)})
    run_beats(w, 100, silent_from={2: 10}, start=12)
    assert w.lost(100.0) == () and alarm(w, 100.0) is None


def test_a_worker_that_cannot_reach_the_store_loses_main_not_the_others() -> None:
    w = Watch(2, 3, T, start=0.0)
    run_beats(w, 10)  # last successful round at 10; then every call fails or hangs
    assert w.lost(24.9) == ()
    assert w.lost(25.0) == (Lost(0, 15.0, store=True),)  # node 1's counter was moving while we could read it


def test_a_store_that_answers_slowly_is_not_lost() -> None:
    w = Watch(1, 2, T, start=0.0)
    for t in range(0, 120, 10):  # one round every 10 s: slow, but each one moved the counter
        beat(w, float(t), {0: t})
    assert w.lost(119.0) == ()


# ---- failed -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("done", "raised"),
    [
        (Done(1), True),
        (Done(3), True),
        (Done(0), False),
        (Done(EXIT_PEER_LOST, stopped=True), False),  # stopped by its own watchdog: not the cause
    ],
)
def test_a_node_that_failed_on_its_own_raises_the_alarm(done: Done, raised: bool) -> None:
    w = Watch(0, 2, T, start=0.0)
    beat(w, 1.0, {1: 1}, done={1: done})
    assert (alarm(w, 1.0) is not None) == raised
    if raised:
        assert alarm(w, 1.0) == Alarm(failed=((1, done),))


def test_done_round_trips_through_the_store() -> None:
    for d in (Done(0), Done(1), Done(19, stopped=True)):
        assert Done.from_json(d.to_json()) == d
    assert Done.from_json(b'{"code": 2}') == Done(2)


# ---- settled: how long a node waits after its own torchrun returned ---------------------------------------------


def test_a_worker_whose_job_failed_is_settled_once_every_other_node_beat_again() -> None:
    w = Watch(1, 3, T, start=0.0)
    run_beats(w, 10)
    since = 10.2
    beat(w, 11.0, {0: 11, 2: 11})  # can be beats sent before since
    assert not w.settled(11.0, since)
    beat(w, 12.0, {0: 12, 2: 12})
    assert w.settled(12.0, since)


def test_a_worker_whose_job_failed_waits_for_a_silent_node_until_it_is_lost() -> None:
    w = Watch(1, 3, T, start=0.0)
    run_beats(w, 10, silent_from={2: 9})  # node 2 died at 9; gloo ended our job at 10
    since = 10.0
    run_beats(w, 23, silent_from={2: 9}, start=11)
    assert not w.settled(23.0, since)
    run_beats(w, 24, silent_from={2: 9}, start=24)
    assert w.settled(24.0, since) and w.lost(24.0) == (Lost(2, 15.0),)


def test_a_worker_is_settled_when_every_other_node_is_done() -> None:
    w = Watch(2, 3, T, start=0.0)
    run_beats(w, 5)
    beat(w, 6.0, {0: 5, 1: 5}, done={0: Done(1), 1: Done(19, stopped=True)})
    assert w.settled(6.0, since=5.5)


def test_a_worker_stops_waiting_once_the_store_is_gone_after_main_was_done() -> None:
    w = Watch(1, 3, T, start=0.0)
    run_beats(w, 5)
    beat(w, 6.0, {0: 6, 2: 5}, done={0: Done(0)})
    w.store_gone = True
    assert w.settled(6.5, since=5.5) and w.lost(30.0) == ()  # main done: its store closing is no loss


def test_main_waits_for_every_bye_or_silence() -> None:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, 5)
    beat(w, 6.0, {1: 6, 2: 6}, done={1: Done(0), 2: Done(0)}, bye=frozenset({1}))
    assert not w.settled(6.0, since=5.5)
    beat(w, 7.0, {1: 6, 2: 7}, bye=frozenset({2}))
    assert w.settled(7.0, since=5.5)
    # A worker that died before its bye (done, then silent) is waited for until the timeout only.
    w = Watch(0, 2, T, start=0.0)
    run_beats(w, 5)
    beat(w, 6.0, {1: 6}, done={1: Done(1)})
    run_beats(w, 20, silent_from={1: 6}, start=7)
    assert not w.settled(20.0, since=5.5)
    run_beats(w, 21, silent_from={1: 6}, start=21)
    assert w.settled(21.0, since=5.5)


# ---- conclude and the lines ------------------------------------------------------------------------------------


def _lost_2_at(t: float) -> Watch:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, t, silent_from={2: t - 15})
    return w


def test_conclude_names_a_lost_node_after_this_node_failed() -> None:
    ending = conclude(_lost_2_at(40), 40.0, Done(1), None, NAMES)
    assert ending == Ending(
        EXIT_PEER_LOST,
        "nodekit: node 2 (172.31.250.12, host h2) lost: no heartbeat for 15 s; "
        "this node's job had ended with exit code 1",
    )


def test_conclude_keeps_the_job_s_code_when_nobody_was_lost() -> None:
    w = Watch(0, 3, T, start=0.0)
    run_beats(w, 40)
    assert conclude(w, 40.0, Done(0), None, NAMES) == Ending(0)
    assert conclude(w, 40.0, Done(1), None, NAMES) == Ending(1)


def test_conclude_after_an_alarm_exits_19_without_repeating_the_line() -> None:
    w = _lost_2_at(40)
    raised = Alarm(lost=(Lost(2, 15.0),))
    assert conclude(w, 40.0, Done(1, stopped=True), raised, NAMES) == Ending(EXIT_PEER_LOST)
    failed = Alarm(failed=((1, Done(1)),))
    assert conclude(w, 40.0, Done(1, stopped=True), failed, NAMES).code == EXIT_PEER_LOST
    assert "node 2" in str(conclude(w, 40.0, Done(1, stopped=True), failed, NAMES).line)


def test_a_node_lost_after_the_job_succeeded_is_noted_but_the_job_succeeded() -> None:
    ending = conclude(_lost_2_at(40), 40.0, Done(0), None, NAMES)
    assert ending.code == 0 and ending.line is not None and "succeeded" in ending.line


def test_the_lines() -> None:
    assert alarm_line(Alarm(lost=(Lost(2, 15.4),)), NAMES) == (
        "nodekit: node 2 (172.31.250.12, host h2) lost: no heartbeat for 15 s; stopping this node"
    )
    assert alarm_line(Alarm(lost=(Lost(1, 16.0), Lost(2, 15.0))), NAMES) == (
        "nodekit: nodes 1 (10.0.0.6, host gpu-b) and 2 (172.31.250.12, host h2) lost: no heartbeat for 15 s; "
        "stopping this node"
    )
    assert alarm_line(Alarm(lost=(Lost(0, 15.2, store=True),)), NAMES) == (
        "nodekit: node 0 (10.0.0.5, host gpu-a) lost: main's store unreachable for 15 s; stopping this node"
    )
    assert alarm_line(Alarm(failed=((1, Done(1)),)), NAMES) == (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed with exit code 1; stopping this node"
    )
    assert alarm_line(Alarm(failed=((1, Done(1)), (2, Done(3)))), NAMES) == (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed with exit code 1; then node 2 (172.31.250.12, host h2) "
        "failed with exit code 3; stopping this node"
    )
    assert lost_line((Lost(5, 20.0),), NAMES, "x") == "nodekit: node 5 (?) lost: no heartbeat for 20 s; x"
    assert node_names((facts(0), facts(2))) == {0: "10.0.0.5, host host-0", 2: "10.0.0.7, host host-2"}


# ---- the threads, against an in-memory store --------------------------------------------------------------------


def run_all(nodes: list[Node], work: Callable[[Node], int]) -> list[Ending]:
    """Start every watchdog, run ``work`` (the job, returning its code) per node in a thread, then finish."""
    endings: list[Ending | None] = [None] * len(nodes)

    def go(i: int, n: Node) -> None:
        n.dog.start()
        endings[i] = n.dog.finish(work(n))

    threads = [threading.Thread(target=go, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(e is not None for e in endings), "a watchdog did not finish"
    return [e for e in endings if e is not None]


def test_a_job_that_ends_normally_raises_no_alarm_and_main_waits_for_every_bye() -> None:
    store = MemStore()
    nodes = [Node(store, r, 3, timeout=3.0) for r in range(3)]
    endings = run_all(nodes, lambda n: time.sleep(0.3) or 0)  # type: ignore[func-returns-value]
    assert endings == [Ending(0)] * 3
    assert [n.lines for n in nodes] == [[], [], []] and not any(n.stopped.is_set() for n in nodes)
    assert store.check([f"nodekit/bye/{r}" for r in (1, 2)])
    assert [Done.from_json(store.get(f"nodekit/done/{r}")) for r in range(3)] == [Done(0)] * 3


def test_a_silent_node_stops_the_others_with_one_line_naming_it() -> None:
    store = MemStore()  # node 2 never beats: it died right after preflight
    nodes = [Node(store, r, 3, timeout=0.5) for r in range(2)]
    started = time.monotonic()

    def job(n: Node) -> int:
        assert n.stopped.wait(10), "the watchdog never stopped this node"
        return 1  # what torchrun's SignalException makes of it

    endings = run_all(nodes, job)
    assert time.monotonic() - started < 5
    assert [e.code for e in endings] == [EXIT_PEER_LOST] * 2
    for n in nodes:
        assert len(n.lines) == 1
        assert re.fullmatch(
            r"nodekit: node 2 \(172\.31\.250\.12, host h2\) lost: no heartbeat for \d s; stopping this node", n.lines[0]
        )
        assert n.dog.alarm is not None and n.exits == []
    assert Done.from_json(store.get("nodekit/done/1")) == Done(1, stopped=True)


def test_a_node_that_fails_stops_the_others_and_is_named_as_failed() -> None:
    store = MemStore()
    nodes = [Node(store, r, 3, timeout=3.0) for r in range(3)]

    def job(n: Node) -> int:
        if n.dog.rank == 1:
            time.sleep(0.2)
            return 1
        assert n.stopped.wait(10)
        return 1

    endings = run_all(nodes, job)
    assert [e.code for e in endings] == [EXIT_PEER_LOST, 1, EXIT_PEER_LOST]
    assert nodes[0].lines == ["nodekit: node 1 (10.0.0.6, host gpu-b) failed with exit code 1; stopping this node"]
    assert nodes[1].lines == [] and nodes[2].lines == nodes[0].lines


def test_a_worker_that_loses_the_store_names_main() -> None:
    store = MemStore()
    worker = Node(store, 1, 2, timeout=0.5)
    main = Node(store, 0, 2, timeout=0.5)

    def job(n: Node) -> int:
        if n.dog.rank == 0:
            time.sleep(0.2)
            store.broken = True  # main's host is gone: every call fails from now on
            return 0
        assert n.stopped.wait(10)
        return 1

    main.dog.start()
    worker.dog.start()
    t = threading.Thread(target=lambda: main.dog.finish(job(main)))
    t.start()
    ending = worker.dog.finish(job(worker))
    t.join(10)
    assert ending.code == EXIT_PEER_LOST
    assert len(worker.lines) == 1
    assert re.fullmatch(
        r"nodekit: node 0 \(10\.0\.0\.5, host gpu-a\) lost: main's store unreachable for \d s; stopping this node",
        worker.lines[0],
    )
    assert worker.dog.broken == "Connection reset by peer"


def test_a_job_that_does_not_stop_is_ended_by_the_watchdog() -> None:
    node = Node(MemStore(), 0, 2, timeout=0.3, stop_grace_s=0.3)
    node.dog.start()
    deadline = time.monotonic() + 10
    while not node.exits and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.exits == [EXIT_PEER_LOST] and node.stopped.is_set()
    assert node.lines[-1].startswith("nodekit: torchrun did not stop within 0.3 s")
