"""torchrun restarts across nodes, the pure parts: main's run id reaches every node, the rendezvous each node's
torchrun gets, the worker a failed torchrun names (read from a ChildFailedError-shaped object: no torch here), and the
one line every node prints about it. The real thing runs in tests/integration/test_restarts.py."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from nodekit.launcher.config import parse_env
from nodekit.launcher.main import Passed, _rendezvous
from nodekit.launcher.plan import fallback_run_id
from nodekit.launcher.preflight.verdict import Verdict
from nodekit.launcher.watchdog.failure import WorkerFailure, first_failed, worker_failure
from nodekit.launcher.watchdog.run import EXIT_PEER_LOST, Alarm, Done, Ending, Watch, alarm_line, conclude
from tests.factories import LAUNCH_ENV, NAMES, MemStore, Node, beat, cfg, facts, run_nodes


def test_main_chooses_one_run_id_that_every_node_gets_and_a_new_one_each_run() -> None:
    first = run_nodes(MemStore(), [(cfg(r, 3), facts(r)) for r in range(3)])
    ids = {o.verdict.run_id for o in first}
    assert len(ids) == 1 and len(ids.pop()) == 16
    again = run_nodes(MemStore(), [(cfg(r, 3), facts(r)) for r in range(3)])
    assert again[0].verdict.run_id != first[0].verdict.run_id
    assert Verdict.from_json(first[0].verdict.to_json()) == first[0].verdict


def _passed(run_id: str) -> Passed:
    verdict = Verdict("ok", 2, 180.0, "10.0.0.5:29501", (facts(0), facts(1, address="10.0.0.9")), (), (), (), False)
    return Passed(store=None, verdict=Verdict(**{**verdict.__dict__, "run_id": run_id}))


def test_each_node_joins_with_main_s_id_and_its_own_address_toward_main() -> None:
    restarts = {**LAUNCH_ENV, "NODEKIT_MAX_RESTARTS": "2"}
    worker = _rendezvous(parse_env(restarts), _passed("abc"))
    assert worker is not None and (worker.run_id, worker.local_addr) == ("abc", "10.0.0.9")
    main = _rendezvous(parse_env({**restarts, "NODE_RANK": "0"}), _passed("abc"))
    assert main is not None and (main.run_id, main.local_addr) == ("abc", "10.0.0.5")
    alone = _rendezvous(parse_env({**restarts, "NODE_RANK": "0"}), None)  # preflight off
    assert alone is not None and alone.run_id == fallback_run_id(parse_env(restarts))
    assert _rendezvous(parse_env(LAUNCH_ENV), _passed("abc")) is None  # max_restarts = 0: static, as before
    assert _rendezvous(parse_env({**restarts, "NODEKIT_LAUNCHER": "env"}), _passed("abc")) is None


@dataclass
class _ProcessFailure:  # the fields of torch's ProcessFailure that nodekit reads
    local_rank: int
    exitcode: int
    timestamp: int
    pid: int = 4242


class _ChildFailedError(Exception):
    def __init__(self, failures: dict[int, _ProcessFailure]) -> None:
        super().__init__("train.py FAILED")
        self.failures = failures

    def get_first_failure(self) -> tuple[int, _ProcessFailure]:
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]


def test_the_failed_worker_is_read_from_torchrun_s_error() -> None:
    error = _ChildFailedError({3: _ProcessFailure(1, -9, 100), 2: _ProcessFailure(0, 1, 101)})
    failure = worker_failure(error, 3)
    assert failure == WorkerFailure(rank=3, local_rank=1, exitcode=-9, at=100, max_restarts=3)
    assert (
        failure.describe() == "worker rank 3 (local rank 1) was killed by SIGKILL; no restarts left (max_restarts = 3)"
    )
    assert worker_failure(RuntimeError("RendezvousClosedError"), 3) is None
    assert WorkerFailure(0, 0, 3, 0, 0).describe() == (
        "worker rank 0 (local rank 0) exited with code 3; torchrun restarts no worker (max_restarts = 0)"
    )
    done = Done(1, failure=failure)
    assert Done.from_json(done.to_json()) == done


def test_the_failed_worker_s_exception_is_named_on_every_node() -> None:
    """The exception the worker left (stacks/hook.py) travels in its node's done mark: main's last line quotes it
    when the failing rank is on another machine, whose traceback main never sees."""
    error = _ChildFailedError({1: _ProcessFailure(0, 1, 100, pid=77)})
    failure = worker_failure(error, 0, {77: "RuntimeError: boom"}.get)
    assert failure == WorkerFailure(1, 0, 1, 100, 0, raised="RuntimeError: boom")
    assert Done.from_json(Done(1, failure=failure).to_json()) == Done(1, failure=failure)
    on0 = Watch(0, 2, 15.0, start=0.0)
    beat(on0, 1.0, {1: 1}, done={1: Done(1, failure=failure)})
    later = WorkerFailure(0, 0, 1, 101, 3)  # gloo's "Connection closed by peer" on main, a second later
    assert conclude(on0, 2.0, Done(1, failure=later), None, NAMES).line == (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local rank 0) raised RuntimeError: boom (exit "
        "code 1); torchrun restarts no worker (max_restarts = 0); then node 0 (10.0.0.5, host gpu-a) failed: worker "
        "rank 0 (local rank 0) exited with code 1; no restarts left (max_restarts = 3); the job failed (this node "
        "exits 19)"
    )
    killed = worker_failure(_ChildFailedError({1: _ProcessFailure(0, -9, 100, pid=77)}), 0, {77: "x"}.get)
    assert killed is not None and killed.raised == ""  # a signal ends a process without an exception
    long = Done.from_json(Done(1, failure=WorkerFailure(1, 0, 1, 0, 0, raised="E" * 5000)).to_json())
    assert long.failure is not None and len(long.failure.raised) == 1000  # a peer's record is bounded


KILLED = WorkerFailure(rank=1, local_rank=0, exitcode=-9, at=100, max_restarts=3)
FOLLOWED = WorkerFailure(rank=0, local_rank=0, exitcode=1, at=100, max_restarts=3)  # gloo: connection closed by peer


def test_the_first_failure_is_named_first() -> None:
    """What a peer's death looks like (exit 1, SIGABRT) comes after anything else, even a second earlier (torchrun
    notices deaths 0.1 s apart, and the second can turn in between); then the earlier; then the lower node."""
    assert [r for r, _ in first_failed([(0, FOLLOWED), (1, KILLED)])] == [1, 0]
    assert [r for r, _ in first_failed([(0, FOLLOWED), (1, WorkerFailure(1, 0, -9, 101, 3))])] == [1, 0]
    aborted = WorkerFailure(0, 0, -6, 99, 3)
    assert [r for r, _ in first_failed([(0, aborted), (1, WorkerFailure(1, 0, 3, 100, 3))])] == [1, 0]
    assert [r for r, _ in first_failed([(2, FOLLOWED), (0, WorkerFailure(0, 0, 1, 101, 3))])] == [2, 0]
    assert [r for r, _ in first_failed([(1, FOLLOWED), (0, FOLLOWED)])] == [0, 1]
    assert [r for r, _ in first_failed([(0, None), (2, FOLLOWED)])] == [2, 0]  # a worker named before none


def test_an_exception_of_the_job_s_own_is_named_before_a_peer_s_gloo_error_of_the_same_second() -> None:
    """Rank 1 raises; rank 0's collective fails with gloo's "Connection closed by peer" in the same second (torchrun's
    timestamps are whole seconds): both exit 1. The lower node no longer wins the tie with its consequence, and an
    exception of the job's own comes before a failure that names none (a SIGABRT from a destructor)."""
    boom = WorkerFailure(1, 0, 1, 100, 0, raised="RuntimeError: boom on rank 1")
    gloo = WorkerFailure(0, 0, 1, 100, 0, raised="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed "
                         "by peer [10.0.0.6]:4711")  # fmt: skip
    reset = WorkerFailure(2, 0, 1, 99, 0, raised="torch.distributed.DistNetworkError: Connection reset by peer")
    assert [r for r, _ in first_failed([(0, gloo), (1, boom)])] == [1, 0]
    assert [r for r, _ in first_failed([(2, reset), (0, gloo), (1, boom)])] == [1, 2, 0]
    assert [r for r, _ in first_failed([(0, WorkerFailure(0, 0, -6, 99, 0)), (1, boom)])] == [1, 0]
    assert [r for r, _ in first_failed([(0, KILLED), (1, boom)])] == [0, 1]  # a kill is still named first


def test_a_node_whose_workers_failed_after_another_s_exits_19_and_every_node_names_the_first() -> None:
    line = (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local rank 0) was killed by SIGKILL; "
        "no restarts left (max_restarts = 3); then node 0 (10.0.0.5, host gpu-a) failed: worker rank 0 (local rank "
        "0) exited with code 1; no restarts left (max_restarts = 3); the job failed (this node exits {})"
    )
    on0 = Watch(0, 2, 15.0, start=0.0)
    beat(on0, 1.0, {1: 1}, done={1: Done(1, failure=KILLED)})
    assert conclude(on0, 2.0, Done(1, failure=FOLLOWED), None, NAMES) == Ending(EXIT_PEER_LOST, line.format(19))
    on1 = Watch(1, 2, 15.0, start=0.0)
    beat(on1, 1.0, {0: 1}, done={0: Done(1, failure=FOLLOWED)})
    assert conclude(on1, 2.0, Done(1, failure=KILLED), None, NAMES) == Ending(1, line.format(1))
    alone = Watch(1, 2, 15.0, start=0.0)
    beat(alone, 1.0, {0: 1})
    assert conclude(alone, 2.0, Done(1, failure=KILLED), None, NAMES).line == (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local rank 0) was killed by SIGKILL; "
        "no restarts left (max_restarts = 3); the job failed (this node exits 1)"
    )
    assert alarm_line(Alarm(failed=((1, Done(1, failure=KILLED)),)), NAMES) == (
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local rank 0) was killed by SIGKILL; "
        "no restarts left (max_restarts = 3); stopping this node"
    )


def test_past_max_restarts_every_node_stops_within_a_beat_naming_the_worker() -> None:
    """Node 1's torchrun gives up on a killed worker; node 0's is still running (waiting in the next rendezvous
    round): its watchdog stops it at once with the worker named, long before the peer timeout."""
    store = MemStore()
    nodes = [Node(store, r, 2, timeout=5.0) for r in range(2)]
    endings: dict[int, Ending] = {}

    def node0() -> None:
        nodes[0].dog.start()
        stopped = nodes[0].stopped.wait(5)
        endings[0] = nodes[0].dog.finish(1 if stopped else 0)

    def node1() -> None:
        nodes[1].dog.start()
        time.sleep(0.2)
        endings[1] = nodes[1].dog.finish(1, KILLED)

    started = time.monotonic()
    threads = [threading.Thread(target=f) for f in (node0, node1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert time.monotonic() - started < 3 and nodes[0].stopped.is_set()
    assert endings == {0: Ending(EXIT_PEER_LOST), 1: Ending(1, endings[1].line)}
    assert nodes[0].lines == [
        "nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local rank 0) was killed by SIGKILL; "
        "no restarts left (max_restarts = 3); stopping this node"
    ]
    assert nodes[1].lines == [str(endings[1].line)]
    assert str(endings[1].line).startswith("nodekit: node 1 (10.0.0.6, host gpu-b) failed: worker rank 1 (local")
