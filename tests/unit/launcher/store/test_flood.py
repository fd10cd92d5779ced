"""Hostile clients without the secret against main's preflight store, on loopback: thousands of connections,
garbage, oversized length prefixes and handshakes that never finish change no value main holds, keep nobody out
and grow main's memory by no more than its caps allow."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.launcher.store.kv import Hosted
from nodekit.launcher.store.server import host
from tests.factories import BEHAVIOURS, S1, STORE_LIMITS, hostile, join, wait_for


def rss() -> int:
    """This process's resident memory in bytes (main's server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def main() -> Iterator[Hosted]:
    hosted = host(S1, 0, timeout_s=5, host="127.0.0.1", limits=STORE_LIMITS)
    yield hosted
    hosted.close()


def test_thousands_of_hostile_connections_change_nothing_and_grow_no_memory(main: Hosted) -> None:
    worker = join(main)
    main.set("nodekit/verdict", '{"status": "ok"}')
    worker.set("nodekit/facts/1", '{"rank": 1}')
    time.sleep(0.3)
    before, peak = rss(), [0]
    threads_before = set(threading.enumerate())  # other tests' threads may end meanwhile: compare objects
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    def attack(offset: int) -> None:
        held: list[socket.socket] = []
        for i in range(750):
            hostile(main.port, BEHAVIOURS[(i + offset) % len(BEHAVIOURS)], held)
        for sock in held:
            sock.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    attackers = [threading.Thread(target=attack, args=(k,)) for k in range(4)]
    for t in attackers:
        t.start()
    beats = 0
    late = None
    while any(t.is_alive() for t in attackers):
        worker.add("nodekit/hb/1", 1)  # the worker already in keeps its heartbeat going through the flood
        beats += 1
        if late is None and beats == 20:
            late = join(main, connect_s=30)  # and a worker arriving mid-flood still gets in
            late.add("nodekit/claim/2", 1)
        time.sleep(0.01)
    for t in attackers:
        t.join(timeout=120)
    stop.set()
    sampler.join()
    assert main.get("nodekit/verdict") == b'{"status": "ok"}' and main.get("nodekit/facts/1") == b'{"rank": 1}'
    assert main.add("nodekit/hb/1", 0) == beats and worker.check(["nodekit/claim/2"])
    assert sorted(k.decode() for k in main.table._data) == [
        "nodekit/claim/2", "nodekit/facts/1", "nodekit/hb/1", "nodekit/verdict",
    ]  # fmt: skip
    assert late is not None and late.add("nodekit/claim/2", 0) == 1
    assert wait_for(lambda: main.stats().pending == 0, within=STORE_LIMITS.handshake_s + 2)
    stats = main.stats()
    assert stats.sessions == 2 and stats.refused > 0 and stats.evicted > 0
    assert stats.peak_pending <= STORE_LIMITS.max_pending
    # Per connection in the handshake main holds at most the 36-byte hello and its own 84-byte answer.
    assert stats.peak_buffered < 64 << 10
    assert peak[0] - before < 16 << 20, f"main's process grew by {(peak[0] - before) >> 20} MiB under the flood"
    # One serving thread, none per connection: every thread alive now was alive before the flood.
    assert [t.name for t in threading.enumerate() if t not in threads_before] == []


def test_handshakes_that_never_finish_expire_and_keep_no_worker_out(main: Hosted) -> None:
    held: list[socket.socket] = []
    for _ in range(100):
        hostile(main.port, "partial", held)
    assert wait_for(lambda: main.stats().peak_pending > 0)
    assert main.stats().peak_pending <= STORE_LIMITS.max_pending
    stop = threading.Event()

    def keep_flooding() -> None:
        while not stop.is_set():
            hostile(main.port, "partial", held)
            time.sleep(0.002)

    flood = threading.Thread(target=keep_flooding)
    flood.start()
    try:
        worker = join(main, connect_s=30)
        worker.set("nodekit/facts/1", "ok")
    finally:
        stop.set()
        flood.join()
    assert main.get("nodekit/facts/1") == b"ok"
    assert wait_for(lambda: main.stats().pending == 0, within=STORE_LIMITS.handshake_s + 2)
    assert main.stats().peak_pending <= STORE_LIMITS.max_pending and main.stats().sessions == 1
    for sock in held:
        sock.close()
