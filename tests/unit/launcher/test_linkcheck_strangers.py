"""The link check's listener against strangers without the job secret, on loopback with real sockets: more idle
or trickling connections than it holds keep no real pair out (the oldest handshake is pushed out), a handshake
that trickles is cut at its total deadline, and a pair whose first connection fails in passing is tried once more.
In the default ``links = "warn"`` a pair that cannot connect refuses the job (exit 20): a stranger who could keep
the partner out could stop the job."""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nodekit.launcher.linkcheck import probe
from nodekit.launcher.linkcheck.listener import HANDSHAKE_S, MAX_PENDING, LinkServer
from nodekit.launcher.linkcheck.verdict import Endpoint, decide
from nodekit.launcher.store.auth import MAGIC, NONCE_LEN
from tests.factories import Front

SECRET = "job-secret-for-the-link-check"
RUN = b"r" * 16
SLACK_S = 1.5  # the listener's poll (a quarter second), ours (0.2 s) and a loaded machine
ENDS = [Endpoint(0, "h0", "127.0.0.1", "lo", 0), Endpoint(1, "h1", "127.0.0.1", "lo", 0)]


@pytest.fixture
def server() -> Iterator[LinkServer]:
    server = LinkServer(SECRET, RUN, "127.0.0.1").start()
    yield server
    server.close()


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


def _trickle(socks: list[socket.socket], every: float, stop: threading.Event) -> None:
    """One byte of a hello to each of ``socks`` every ``every`` seconds: never a whole hello in time."""
    for b in itertools.cycle(MAGIC + bytes(NONCE_LEN)):
        if stop.wait(every):
            return
        for s in socks:
            with contextlib.suppress(OSError):
                s.send(bytes([b]))


@pytest.mark.parametrize("behaviour", ["idle", "trickling"])
def test_more_strangers_than_the_listener_holds_keep_no_real_pair_out(
    server: LinkServer, held: list[socket.socket], behaviour: str
) -> None:
    for _ in range(MAX_PENDING + 8):
        held.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(held, 0.2, stop), daemon=True)
    if behaviour == "trickling":
        trickler.start()
        time.sleep(0.5)  # a few bytes in: each stranger looks like a slow handshake
    try:
        pair = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, RUN, 0.05)
        assert pair.error == "" and pair.ab.gbit and pair.ba.gbit, pair
        verdict = decide(ENDS, [pair], mode="warn", seconds=0.05)
        assert not verdict.refused and verdict.findings == (), verdict
        # Strangers still arriving: each pushes out an older one, and the next pair is measured as well.
        for _ in range(MAX_PENDING):
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
        again = probe.measure(0, 1, "127.0.0.1", server.port, SECRET, RUN, 0.05)
        assert again.error == "" and again.gbit, again
    finally:
        stop.set()
        if trickler.is_alive():
            trickler.join(5)


def _cut_after(port: int, every: float, give_up: float) -> float | None:
    """Trickle a hello, one byte every ``every`` seconds, to the listener at ``port``: seconds from the connection
    until the listener closed it, or None when it still held it after ``give_up`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        t0 = time.monotonic()
        for b in itertools.cycle(MAGIC + bytes(NONCE_LEN)):
            try:
                s.send(bytes([b]))
                readable = select.select([s], [], [], every)[0]
                gone = bool(readable) and s.recv(1) == b""
            except OSError:  # reset: it was closed with our bytes unread
                gone = True
            took = time.monotonic() - t0
            if gone:
                return took
            if took > give_up:
                return None
    return None


def test_a_stranger_trickling_its_hello_is_cut_at_the_total_handshake_deadline(server: LinkServer) -> None:
    """36 bytes at one per 0.2 s would take 7.2 s (past ``give_up``); every byte comes long before a per-read
    timeout of 3 s. Not before the deadline either: the cut is the deadline's, not a pushing out."""
    took: list[float | None] = [None] * 4
    give_up = HANDSHAKE_S + SLACK_S + 2

    def one(i: int) -> None:
        took[i] = _cut_after(server.port, 0.2, give_up)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(took))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(give_up + 5)
    for t in took:
        assert t is not None and HANDSHAKE_S - 0.5 <= t <= HANDSHAKE_S + SLACK_S, took


def test_a_pair_whose_first_connection_is_reset_is_measured_on_its_second_try(server: LinkServer) -> None:
    front = Front(server.port, resets=1)
    try:
        pair = probe.measure(0, 1, "127.0.0.1", front.port, SECRET, RUN, 0.05)
        assert pair.error == "" and pair.ab.gbit and pair.ba.gbit, pair
        assert not decide(ENDS, [pair], mode="warn").refused
        assert front.accepted == 3  # the reset one, its second try (a->b), then b->a
    finally:
        front.close()


def test_a_pair_is_tried_once_more_and_no_more_and_never_against_another_secret(server: LinkServer) -> None:
    front = Front(server.port, resets=1000)
    try:
        pair = probe.measure(0, 1, "127.0.0.1", front.port, SECRET, RUN, 0.05)
        assert pair.error and pair.gbit is None
        assert front.accepted == 2, front.accepted
        assert decide(ENDS, [pair], mode="warn").refused  # a pair that cannot connect still refuses
    finally:
        front.close()
    honest = Front(server.port, resets=0)
    try:
        wrong = probe.measure(0, 1, "127.0.0.1", honest.port, "another-secret", RUN, 0.05)
        assert wrong.error and honest.accepted == 1  # another secret is an answer, not a passing fault
    finally:
        honest.close()
