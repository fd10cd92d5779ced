"""The stall watch: when no rank made progress (nodekit/launcher/watchdog/stall.py, pure, on a fake clock), the store
traffic between two nodes that carries main's ask for stacks and its notice (stallio.py, an in-memory store), and the
peer watchdog's threads stopping the job with exit 22, or only warning (real threads, time scaled down)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from nodekit.launcher.contract import EXIT_STALLED
from nodekit.launcher.preflight.exchange import Clock
from nodekit.launcher.watchdog.run import Done, Watchdog, conclude
from nodekit.launcher.watchdog.stall import LEAD_S, STACKS_WAIT_S, NodeProgress, Notice, StallWatch, merge
from nodekit.launcher.watchdog.stallio import StallConfig, StallIO
from tests.factories import STACK_FIXTURES as FIXTURES
from tests.factories import MemStore

T = 20.0


def job(ranks: dict[int, tuple[int, int]], world: int | None = 2) -> NodeProgress:
    return NodeProgress(world, ranks)


# ---- the decision, pure --------------------------------------------------------------------------------------


def test_a_job_whose_ranks_keep_progressing_is_never_stalled() -> None:
    w = StallWatch(T, start=0.0)
    for t in range(0, 3600):
        # Rank 0 alone moves (it computes while rank 1 waits for it); rank 1 stands still the whole hour.
        w.see(float(t), job({0: (50, t // 7), 1: (50, 3)}))
        assert not w.ask_due(float(t)) and not w.due(float(t))


def test_no_change_for_the_timeout_is_a_stall_asked_for_stacks_first_and_reported_once() -> None:
    w = StallWatch(T, start=0.0)
    for t in range(0, 11):
        w.see(float(t), job({0: (t, 0), 1: (t, 0)}))
    assert w.since == 10.0
    for t in range(11, 27):
        w.see(float(t), job({0: (10, 0), 1: (10, 0)}))
        assert not w.ask_due(float(t)), t
    w.see(27.0, job({0: (10, 0), 1: (10, 0)}))
    assert w.ask_due(27.0) and not w.due(27.0)  # LEAD_S before the timeout
    w.asked = w.episode
    assert not w.ask_due(28.0)
    w.see(30.0, job({0: (10, 0), 1: (10, 0)}))
    assert w.due(30.0) and w.still(30.0) == T
    w.reported = w.episode
    assert not w.due(600.0)  # one report per stall
    w.see(601.0, job({0: (11, 0), 1: (10, 0)}))  # it moved again: a new episode, its own clock
    w.see(630.0, job({0: (11, 0), 1: (10, 0)}))
    assert w.due(630.0) and not w.due(620.0) and LEAD_S == 3.0


def test_nothing_is_judged_until_every_rank_of_the_world_reported() -> None:
    w = StallWatch(T, start=0.0)
    for t in range(0, 200):
        w.see(float(t), job({0: (5, 5)}, world=2))  # rank 1 not in its process group yet, or restarting
    assert w.still(199.0) == 0.0 and not w.due(199.0)
    for t in range(200, 400):
        w.see(float(t), job({0: (5, 5), 1: (5, 5)}, world=None))  # no rank said how large the world is
    assert not w.due(399.0)


def test_node_readings_merge_into_the_job_and_travel_as_json() -> None:
    a, b = job({0: (1, 2)}), NodeProgress(None, {1: (3, 4)})
    assert merge({0: a, 1: b}) == NodeProgress(2, {0: (1, 2), 1: (3, 4)})
    assert NodeProgress.from_json(a.to_json()) == a
    assert Notice.from_json(Notice(3, "line", True).to_json()) == Notice(3, "line", True)
    short = StallWatch(6.0, start=0.0)
    assert short.lead == 3.0 and StallWatch(4.0, 0.0).lead == 2.0  # at most half the timeout


# ---- two nodes through a store ------------------------------------------------------------------------------


def never(_dir: str) -> str:
    """A node whose reader never answers (its dump thread waits for ever)."""
    threading.Event().wait()
    return ""


def constant(reading: NodeProgress) -> Callable[[str], NodeProgress]:
    return lambda _dir: reading


def fixture_stacks(node: int) -> Callable[[str], str]:
    """What node ``node``'s reader printed in the captured deadlock (tests/unit/launcher/fixtures)."""
    return lambda _dir: (FIXTURES / f"mismatch-node{node}.json").read_text()


class Node:
    def __init__(self, store: MemStore, rank: int, progress: dict[int, tuple[int, int]], *, stop: bool = True,
                 answers: bool = True) -> None:  # fmt: skip
        self.lines: list[str] = []
        self.progress = progress
        config = StallConfig(
            T,
            stop,
            "/nonexistent",
            progress=lambda _dir: NodeProgress(2, dict(self.progress)),
            stacks=fixture_stacks(rank) if answers else never,
        )
        self.io = StallIO(config, rank, 2, 0.0, err=self.lines.append)
        self.store, self.answers = store, answers

    def round(self, now: float) -> Notice | None:
        """One round; a dump it started has finished before the next (rounds are a second apart in the launcher)."""
        notice = self.io.round(self.store, now)
        deadline = time.monotonic() + 5
        while self.answers and self.io._dumping is not None and time.monotonic() < deadline:
            time.sleep(0.005)
        return notice


def rounds(nodes: list[Node], start: int, end: int) -> dict[int, list[tuple[int, Notice]]]:
    seen: dict[int, list[tuple[int, Notice]]] = {n.io.rank: [] for n in nodes}
    for t in range(start, end):
        for n in reversed(nodes):
            notice = n.round(float(t))
            if notice is not None:
                seen[n.io.rank].append((t, notice))
    return seen


def test_main_asks_every_node_for_its_stacks_and_every_node_gets_the_notice_with_both_places() -> None:
    store = MemStore()
    main, worker = Node(store, 0, {0: (0, 0)}), Node(store, 1, {1: (0, 0)})
    for t in range(0, 10):
        main.progress[0], worker.progress[1] = (t, 0), (t, 1)
        assert rounds([main, worker], t, t + 1) == {0: [], 1: []}
    seen = rounds([main, worker], 10, 40)
    [(at0, notice)] = seen[0]
    [(at1, same)] = seen[1]
    # The last change was read at t = 9: the notice at 9 + T on main, a round later on the worker.
    assert same == notice and notice.stop and at0 == 9 + T and at1 == at0 + 1
    ask = json.loads(store.data["nodekit/stall"])["ask"]
    assert {f"nodekit/stacks/{ask}/0", f"nodekit/stacks/{ask}/1"} <= set(store.data)
    line = notice.line
    assert line.startswith(f"nodekit: no rank made progress for {T:.0f} s (stall_timeout): rank 0 in all_reduce at ")
    assert "; rank 1 in all_gather at stall.py:" in line
    assert line.endswith(f"; stopping this node (exit {EXIT_STALLED})")
    [report] = main.lines
    assert report.startswith("nodekit: the job stalled: no rank made progress for 20 s")
    assert "\n2 rank(s) on 2 node(s), 2 place(s):\n" in report and worker.lines == []


def test_progress_before_the_timeout_forgets_the_stacks_it_asked_for() -> None:
    store = MemStore()
    main, worker = Node(store, 0, {0: (0, 0)}), Node(store, 1, {1: (0, 0)})
    assert rounds([main, worker], 0, int(T) - 1) == {0: [], 1: []}  # asked at T - LEAD_S
    assert json.loads(store.data["nodekit/stall"]).get("ask")
    worker.progress[1] = (1, 0)  # rank 1 finished its long call and issued a collective
    assert rounds([main, worker], int(T) - 1, 2 * int(T) - 2) == {0: [], 1: []}
    seen = rounds([main, worker], 2 * int(T) - 2, 2 * int(T) + 5)
    assert [t for t, _ in seen[0]] == [2 * int(T) - 1]


def test_warn_reports_once_per_stall_and_a_silent_node_is_named() -> None:
    store = MemStore()
    main = Node(store, 0, {0: (0, 0)}, stop=False)
    worker = Node(store, 1, {1: (0, 0)}, stop=False, answers=False)
    seen = rounds([main, worker], 0, 100)
    [(at, notice)] = seen[0]
    assert at == int(T + STACKS_WAIT_S) and not notice.stop  # it waited for node 1's stacks, then went on
    assert notice.line.endswith('; node(s) 1 sent no stacks; not stopped (stall_action "warn")')
    assert [n.stop for _, n in seen[1]] == [False]


# ---- the watchdog's threads ----------------------------------------------------------------------------------


def watchdogs(store: MemStore, stop: bool) -> tuple[list[Watchdog], list[list[str]], list[threading.Event]]:
    """Two nodes' watchdogs whose ranks never progress (a stall timeout of 0.6 s, beats of 20 ms)."""
    lines: list[list[str]] = [[], []]
    stopped = [threading.Event(), threading.Event()]
    dogs = []
    for rank in (0, 1):
        reading = constant(NodeProgress(2, {rank: (7, 7)}))
        config = StallConfig(0.6, stop, "/nonexistent", progress=reading, stacks=fixture_stacks(rank))
        dogs.append(Watchdog(store, rank, 2, 5.0, {0: "10.0.0.5, host a", 1: "10.0.0.6, host b"},
                             stop=stopped[rank].set, clock=Clock(log=lines[rank].append), err=lines[rank].append,
                             beat_s=0.02, judge_s=0.01, stall=config))  # fmt: skip
    return dogs, lines, stopped


def finish_all(dogs: list[Watchdog], code: int) -> list[int]:
    endings: dict[int, int] = {}

    def one(rank: int) -> None:
        endings[rank] = dogs[rank].finish(code).code

    threads = [threading.Thread(target=one, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return [endings[r] for r in (0, 1)]


def test_the_watchdog_stops_every_node_and_each_exits_20() -> None:
    dogs, lines, stopped = watchdogs(MemStore(), stop=True)
    for d in dogs:
        d.start()
    assert all(s.wait(10) for s in stopped), lines
    assert finish_all(dogs, 1) == [EXIT_STALLED, EXIT_STALLED], lines  # torchrun, stopped by SIGTERM, returns 1
    for r in (0, 1):
        stall = [ln for ln in lines[r] if ln.startswith("nodekit: no rank made progress")]
        assert len(stall) == 1 and "rank 1 in all_gather at stall.py:" in stall[0], lines[r]
    assert lines[0][0].startswith("nodekit: the job stalled")  # main's report, before its own line


def test_a_node_whose_job_failed_before_it_read_mains_stall_notice_exits_as_the_stall() -> None:
    """Main stops its own job once it wrote the notice; the other node's workers can fail in their collective (the
    peer's process is gone) before that node reads it (here: its beat is 3 s). It still reads it while it lingers,
    and exits 22 with the stall's line, not 1 as a failure of its own (CI saw exit codes [22, 1])."""
    store = MemStore()
    lines: list[list[str]] = [[], []]
    stopped = [threading.Event(), threading.Event()]
    dogs = []
    for rank, beat in ((0, 0.02), (1, 3.0)):
        reading = constant(NodeProgress(2, {rank: (7, 7)}))
        config = StallConfig(0.6, True, "/nonexistent", progress=reading, stacks=fixture_stacks(rank))
        dogs.append(Watchdog(store, rank, 2, 5.0, {0: "10.0.0.5, host a", 1: "10.0.0.6, host b"},
                             stop=stopped[rank].set, clock=Clock(log=lines[rank].append), err=lines[rank].append,
                             beat_s=beat, judge_s=0.01, stall=config))  # fmt: skip
    for d in dogs:
        d.start()
    assert stopped[0].wait(10), lines
    assert not stopped[1].is_set()  # node 1 has not read the notice: its workers fail first
    assert finish_all(dogs, 1) == [EXIT_STALLED, EXIT_STALLED], lines
    stall = [ln for ln in lines[1] if ln.startswith("nodekit: no rank made progress")]
    assert len(stall) == 1 and stall[0].endswith(f"stopping this node (exit {EXIT_STALLED})"), lines[1]


def test_with_warn_the_watchdog_reports_once_and_stops_nothing() -> None:
    dogs, lines, stopped = watchdogs(MemStore(), stop=False)
    for d in dogs:
        d.start()
    time.sleep(2.0)
    assert not any(s.is_set() for s in stopped)
    assert [sum("no rank made progress" in ln for ln in lines[r]) for r in (0, 1)] == [1, 1], lines
    assert finish_all(dogs, 0) == [0, 0]


def test_a_lost_node_explains_a_stall_and_a_job_that_ended_well_exits_0() -> None:
    from nodekit.launcher.watchdog.decide import Alarm, Halt, Lost, Watch, alarm, alarm_line

    w = Watch(1, 2, 15.0, start=0.0)
    stall = Halt("nodekit: no rank made progress for 20 s (stall_timeout): ...; stopping this node (exit 22)", 22)
    found = alarm(w, 1.0, stall)
    assert found == Alarm(halt=stall) and alarm_line(found, {}) == stall.line
    assert conclude(w, 2.0, Done(1, stopped=True), found, {}).code == EXIT_STALLED
    assert conclude(w, 2.0, Done(0, stopped=True), found, {}).code == 0
    lost = alarm(w, 16.0, stall)
    assert lost is not None and lost.lost == (Lost(0, 16.0, store=True),)  # main silent: lost wins over the stall


@pytest.mark.parametrize("raw", ['{"ask": 0}', '{"ask": 1, "notice": {"episode": 1, "line": "x", "stop": false}}'])
def test_the_stall_key_is_read_as_main_writes_it(raw: str) -> None:
    store = MemStore()
    store.set("nodekit/stall", raw)
    io = StallIO(StallConfig(T, progress=lambda _d: NodeProgress(None, {}), stacks=lambda _d: "{}"), 1, 2, 0.0,
                 err=lambda _l: None)  # fmt: skip
    notice = io.round(store, 1.0)
    assert (notice is not None) == ("notice" in raw)
    assert io.round(store, 2.0) is None  # a notice is acted on once
