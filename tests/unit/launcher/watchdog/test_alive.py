"""Main's aggregate record (issue 48), pure, on a fake clock: main's :class:`Watch` fed from the table, the record it
publishes, and a worker deciding from that record alone exactly as it did from every peer's keys."""

from __future__ import annotations

from nodekit.launcher.watchdog.alive import Alive, aggregate, reading
from nodekit.launcher.watchdog.decide import CLOSED, Alarm, Done, Lost, Reading, Watch, alarm, alarm_line, lost_line
from nodekit.launcher.watchdog.failure import WorkerFailure

T = 5.0
NAMES = {0: "10.0.0.5, host a", 1: "10.0.0.6, host b", 2: "10.0.0.7, host c", 3: "10.0.0.8, host d"}


class Cluster:
    """Main (node 0) and worker 1 of 4 nodes, one beat a second: main reads the table at ``t``, publishes, and the
    worker reads the record at ``t + 0.5``."""

    def __init__(self) -> None:
        self.main = Watch(0, 4, T, start=0.0)
        self.worker = Watch(1, 4, T, start=0.0)
        self.seq = 0
        self.last_seq: int | None = None
        self.record: Alive | None = None

    def beat(self, t: int, counts: dict[int, int], publish: bool = True, **kw: object) -> None:
        self.main.see(Reading(at=float(t), counts=counts, **kw))  # type: ignore[arg-type]
        if publish:
            self.seq += 1
            self.record = Alive.from_json(aggregate(self.seq, self.main, self.seq, None).to_json())
        self.worker.see(reading(self.record, self.last_seq, t + 0.5, 1))
        self.last_seq = self.record.seq if self.record is not None else None

    def run(self, start: int, until: int, silent_from: dict[int, int] | None = None, publish: bool = True) -> None:
        for t in range(start, until + 1):
            counts = {r: min(t, (silent_from or {}).get(r, t)) for r in (1, 2, 3)}
            self.beat(t, counts, publish)


def test_the_record_round_trips_with_counts_done_marks_and_wills() -> None:
    failure = WorkerFailure(rank=5, local_rank=1, exitcode=-9, at=1700000000, max_restarts=0)
    record = Alive(seq=7, counts=(7, 3, None, 12), done={2: Done(1, failure=failure), 0: Done(0)}, gone={3: CLOSED})
    assert Alive.from_json(record.to_json()) == record


def test_main_publishes_every_count_done_mark_and_will_it_read_and_its_own() -> None:
    w = Watch(0, 4, T, start=0.0)
    w.see(Reading(at=1.0, counts={1: 4, 2: 9, 3: 2}, done={2: Done(0)}, gone={3: CLOSED}))
    record = aggregate(11, w, 11, Done(1))
    assert record == Alive(seq=11, counts=(11, 4, 9, 2), done={2: Done(0), 0: Done(1)}, gone={3: CLOSED})


def test_nodes_that_keep_beating_are_never_lost_through_the_record() -> None:
    c = Cluster()
    c.run(0, 300)
    assert c.worker.lost(300.5) == () and alarm(c.worker, 300.5) is None


def test_a_silent_node_is_named_by_a_worker_half_a_beat_after_main() -> None:
    """Node 2's counter last moved at 10: main names it at 15 (the timeout), the worker at its next read of the
    record, 15.5; neither before."""
    c = Cluster()
    main_at = worker_at = None
    for t in range(0, 30):
        c.run(t, t, silent_from={2: 10})
        if main_at is None and c.main.lost(float(t)):
            main_at = t
        if worker_at is None and c.worker.lost(t + 0.5):
            worker_at = t + 0.5
    assert (main_at, worker_at) == (15, 15.5)
    found = alarm(c.worker, 15.5)
    assert found is not None and found.lost == (Lost(2, 19.0),)
    assert lost_line(found.lost, NAMES, "stopping this node") == (
        "nodekit: node 2 (10.0.0.7, host c) lost: no heartbeat for 19 s; stopping this node"
    )


def test_a_stale_record_names_main_lost_and_nobody_else() -> None:
    """Main's I/O thread stalled: the store still answers, but the record stands still; its seq is main's beat."""
    c = Cluster()
    c.run(0, 10)
    c.run(11, 14, publish=False)
    assert c.worker.lost(14.5) == ()
    c.run(15, 15, publish=False)
    assert c.worker.lost(15.5) == (Lost(0, 5.0),)  # the record last moved at the read of 10.5
    line = alarm_line(alarm(c.worker, 15.5) or Alarm(), NAMES)
    assert line == "nodekit: node 0 (10.0.0.5, host a) lost: no heartbeat for 5 s; stopping this node"


def test_a_worker_that_never_gets_a_record_names_main_lost() -> None:
    c = Cluster()
    for t in range(0, 7):
        c.worker.see(reading(None, None, float(t), 1))
    assert c.worker.lost(6.0) == (Lost(0, 6.0),)


def test_a_worker_whose_store_is_silent_names_main_unreachable() -> None:
    c = Cluster()
    c.run(0, 10)  # then every call hangs: no reading completes
    assert c.worker.lost(15.0) == ()
    assert c.worker.lost(15.5) == (Lost(0, 5.0, store=True),)


def test_done_failed_signalled_and_closed_nodes_reach_the_worker_through_the_record() -> None:
    c = Cluster()
    c.run(0, 5)
    c.beat(6, {1: 6, 2: 6, 3: 6}, done={2: Done(0)})
    c.run(7, 30, silent_from={2: 6})
    assert c.worker.lost(30.5) == ()  # done: never lost

    c = Cluster()
    c.run(0, 5)
    c.beat(6, {1: 6, 2: 6, 3: 6}, done={3: Done(1)})
    assert alarm(c.worker, 6.5) == Alarm(failed=((3, Done(1)),))

    c = Cluster()
    c.run(0, 5)
    c.beat(6, {1: 6, 2: 6, 3: 6}, done={3: Done(129, signal=1)})
    assert alarm(c.worker, 6.5) == Alarm(signalled=((3, Done(129, signal=1)),))

    c = Cluster()
    c.run(0, 5)
    c.beat(6, {1: 6, 2: 6, 3: 5}, gone={3: CLOSED})
    assert alarm(c.worker, 6.5) == Alarm(lost=(Lost(3, 1.0, gone=CLOSED),))


def test_a_worker_sees_main_s_done_mark_and_main_alive_after_it_returned() -> None:
    c = Cluster()
    c.run(0, 5)
    since = 5.7
    c.seq += 1
    c.record = aggregate(c.seq, c.main, c.seq, Done(0))
    c.worker.see(reading(c.record, c.last_seq, 6.5, 1))
    assert c.worker.peers[0].done == Done(0)
    c.last_seq = c.seq
    c.run(7, 8)
    assert c.worker.settled(8.5, since)
