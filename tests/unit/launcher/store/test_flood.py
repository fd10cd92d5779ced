"""Hostile clients without the secret against main's preflight store, on loopback: thousands of connections,
garbage, oversized length prefixes and handshakes that never finish change no value main holds, keep nobody out
and grow main's memory by no more than its caps allow."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.launcher.store import auth
from nodekit.launcher.store.client import recv_exact
from nodekit.launcher.store.kv import Hosted
from nodekit.launcher.store.server import host
from tests.unit.launcher.store.test_store import FAST, S1, join, wait_for

BEHAVIOURS = ("close", "garbage", "length", "partial", "guess", "silent")


def rss() -> int:
    """This process's resident memory in bytes (main's server runs in it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def hostile(port: int, behaviour: str, held: list[socket.socket]) -> None:
    """One connection of a client without the secret; the ones meant to linger are kept open in ``held``."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    try:
        if behaviour == "garbage":
            sock.sendall(os.urandom(64 << 10))
        elif behaviour == "length":  # what a length-prefixed protocol would read as a 4 GiB frame, and then some
            sock.sendall(b"\xff\xff\xff\xff" * 16)
        elif behaviour == "partial":  # slowloris: a hello that never finishes
            sock.sendall(auth.MAGIC + b"\x00" * 10)
        elif behaviour == "guess":  # a well-formed hello, then a proof made up without the secret
            sock.sendall(auth.client_hello(os.urandom(auth.NONCE_LEN)))
            recv_exact(sock, auth.SERVER_HELLO_LEN)
            sock.sendall(os.urandom(auth.PROOF_LEN) + b"\x00\x00\x00\x10" + os.urandom(48))
    except (OSError, EOFError):  # EOFError: recv_exact's word for a connection closed mid-read
        pass  # main cut it off: what it should do (the attacker goes on with its next connection)
    if behaviour in ("partial", "silent", "length"):
        held.append(sock)
        if len(held) > 200:  # the client's own descriptors: keep its latest 200 open
            held.pop(0).close()
    else:
        sock.close()


@pytest.fixture
def main() -> Iterator[Hosted]:
    hosted = host(S1, 0, timeout_s=5, host="127.0.0.1", limits=FAST)
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
    assert wait_for(lambda: main.stats().pending == 0, within=FAST.handshake_s + 2)
    stats = main.stats()
    assert stats.sessions == 2 and stats.refused > 0 and stats.evicted > 0
    assert stats.peak_pending <= FAST.max_pending
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
    assert main.stats().peak_pending <= FAST.max_pending
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
    assert wait_for(lambda: main.stats().pending == 0, within=FAST.handshake_s + 2)
    assert main.stats().peak_pending <= FAST.max_pending and main.stats().sessions == 1
    for sock in held:
        sock.close()
