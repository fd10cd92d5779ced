"""512 nodes' watchdogs against main's real store on loopback (issue 48): one node's host vanishes (its store calls
hang, no FIN), every other node names it within the peer timeout plus the beats the aggregate adds, and main's
store does O(N) operations per second, not N x (N - 1).

The nodes are the real :class:`Watchdog`, beating at the real rate (1 s), in this one process: 511 workers share 8
authenticated client connections (the calls of one connection take turns), main's runs on the hosted store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from nodekit.launcher.store.client import Client
from nodekit.launcher.store.kv import Hosted, Limits
from nodekit.launcher.store.server import host
from nodekit.launcher.watchdog.run import Watchdog

SECRET = "s" * 32
N = 512
TIMEOUT = 4.0  # short, for a short test; one beat more than 3 s against the 2 shared cores' hiccups
BEAT_S, JUDGE_S = 1.0, 0.5
CONNECTIONS = 8
VICTIM = 337


class Node:
    """One simulated node's store: a shared connection, with its calls counted, that hangs when its host
    vanishes."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls = 0
        self.vanished = threading.Event()
        self.forever = threading.Event()  # never set: a call to a vanished host does not return

    def _call(self) -> None:
        if self.vanished.is_set():
            self.forever.wait()
        self.calls += 1

    def set(self, key: str, value: str | bytes) -> None:
        self._call()
        self.client.set(key, value)

    def get(self, key: str) -> bytes:
        self._call()
        return self.client.get(key)

    def add(self, key: str, amount: int) -> int:
        self._call()
        return self.client.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        self._call()
        return self.client.check(keys)


@contextmanager
def hosted_store() -> Iterator[Hosted]:
    hosted = host(SECRET, 0, timeout_s=10, host="127.0.0.1", limits=Limits(max_sessions=4 * CONNECTIONS))
    try:
        yield hosted
    finally:
        hosted.close()


def test_512_nodes_name_a_vanished_node_in_time_with_o_n_store_operations() -> None:
    names = {r: f"10.0.{r // 256}.{r % 256}, host h{r}" for r in range(N)}
    alarms: dict[int, float] = {}
    lines: dict[int, str] = {}
    lock = threading.Lock()

    def dog(rank: int, store: object) -> Watchdog:
        def stop() -> None:
            with lock:
                alarms.setdefault(rank, time.monotonic())

        def err(line: str) -> None:
            with lock:
                lines.setdefault(rank, line)

        return Watchdog(
            store,  # type: ignore[arg-type]
            rank, N, TIMEOUT, names, stop=stop, err=err, hard_exit=lambda code: None, beat_s=BEAT_S, judge_s=JUDGE_S,
        )  # fmt: skip

    def end(dogs: list[Watchdog]) -> None:
        nodes[VICTIM].forever.set()  # its calls now fail on the closed connection: its thread ends
        for d in dogs:
            d._quit.set()
            d._wake.set()

    with ExitStack() as stack:
        hosted = stack.enter_context(hosted_store())
        clients = [
            Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=10, connect_s=5) for _ in range(CONNECTIONS)
        ]
        for c in clients:
            stack.callback(c.close)
        nodes = {r: Node(clients[r % CONNECTIONS]) for r in range(1, N)}
        dogs = [dog(0, hosted), *(dog(r, nodes[r]) for r in range(1, N))]
        stack.callback(end, dogs)
        for d in dogs:
            d.start()
        time.sleep(3 * BEAT_S)  # every node has beaten, main has published, every worker has read a record
        ops0, calls0, t0 = hosted.table.ops, sum(n.calls for n in nodes.values()), time.monotonic()
        time.sleep(3 * BEAT_S)
        window = time.monotonic() - t0
        ops_s = (hosted.table.ops - ops0) / window
        calls_per_node_s = (sum(n.calls for n in nodes.values()) - calls0) / window / (N - 1)
        assert not alarms, f"an alarm while every node beat: {sorted(lines.values())[:3]}"

        nodes[VICTIM].vanished.set()
        vanished = time.monotonic()
        deadline = vanished + TIMEOUT + 2 * BEAT_S + JUDGE_S + 5.0
        while len(alarms) < N and time.monotonic() < deadline:
            time.sleep(0.1)
        named = {r: at for r, at in alarms.items() if r != VICTIM}  # it lost main: its own calls hang

    latest = max(named.values(), default=vanished) - vanished
    missing = sorted(set(range(N)) - {VICTIM} - set(named))
    assert not missing, f"{len(missing)} nodes named nobody, e.g. {missing[:5]}"
    assert all(f"node {VICTIM} (10.0.1.81, host h{VICTIM}) lost: no heartbeat for" in lines[r] for r in named)
    # The aggregate adds at most one beat (main's publish) to a worker's read, and a judge's tick: beside that,
    # the 2 shared cores this runs on.
    assert latest <= TIMEOUT + 2 * BEAT_S + JUDGE_S + 2.5, f"the last node named it {latest:.1f} s after it vanished"
    # Per beat: each worker 2 round trips (its beat, the record), main 3 calls per node in its own process (a
    # counter, a will, a done mark) and one publish. Every node reading every other would be ~3 x 512 x 511.
    assert calls_per_node_s <= 2.5 / BEAT_S, calls_per_node_s
    assert ops_s <= 6 * N / BEAT_S, ops_s
