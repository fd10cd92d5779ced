"""Every limit of main's preflight store whole (issue 28): frames on their way count against the total cap and stall
out, a worker's handshake ends by its connect deadline however slowly the other side answers, and a node whose
store connection ends leaves its will for the peer watchdog. Real loopback sockets, main's server in this process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from nodekit.launcher.store import auth
from nodekit.launcher.store.auth import TO_CLIENT, TO_SERVER
from nodekit.launcher.store.client import Client, recv_exact
from nodekit.launcher.store.kv import Hosted, Limits, NoHandshake
from nodekit.launcher.store.server import SMALL_FRAME, host

SECRET = "c" * 32
BIG = SMALL_FRAME * 4  # a value main holds back from the total while it arrives
TIGHT = Limits(max_value=BIG, max_total=2 * BIG + SMALL_FRAME, handshake_s=1.0, frame_idle_s=0.6)


@pytest.fixture
def tight() -> Iterator[Hosted]:
    hosted = host(SECRET, 0, timeout_s=5, host="127.0.0.1", limits=TIGHT)
    yield hosted
    hosted.close()


def session(port: int) -> tuple[socket.socket, bytes]:
    """A member's raw connection: the handshake done, then the socket and its session key."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = os.urandom(auth.NONCE_LEN)
    sock.sendall(auth.client_hello(nonce))
    hs = auth.read_server_hello(recv_exact(sock, auth.SERVER_HELLO_LEN), SECRET, nonce)
    sock.sendall(hs.client_tag(SECRET))
    key = hs.session_key(SECRET)
    header = recv_exact(sock, auth.HEADER_LEN)
    assert auth.unseal(key, TO_CLIENT, 0, header, recv_exact(sock, auth.frame_length(header) + auth.TAG_LEN))
    return sock, key


def set_frame(key: bytes, seq: int, name: bytes, value: bytes) -> bytes:
    """The ``seq``-th request (from 1) of a connection: a set."""
    return auth.seal(key, TO_SERVER, seq - 1, b"S" + len(name).to_bytes(2, "big") + name + value)


def answer(sock: socket.socket, key: bytes, seq: int) -> bytes:
    """The answer to the ``seq``-th request (main's frame 0 admitted the connection)."""
    header = recv_exact(sock, auth.HEADER_LEN)
    payload = auth.unseal(key, TO_CLIENT, seq, header, recv_exact(sock, auth.frame_length(header) + auth.TAG_LEN))
    assert payload is not None
    return payload


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def settle(hosted: Hosted, seconds: float = 0.4) -> None:
    time.sleep(seconds)  # the serving thread's accounting is refreshed every 50 ms


def test_unfinished_frames_count_against_the_total_and_stall_out(tight: Hosted) -> None:
    """Before: each member connection could hold a whole unfinished frame beside the total cap, for ever (12 of
    them held 788 MiB outside the 1 GiB cap). Now the frames on their way are part of the total: main buffers at
    most the cap, answers a frame that does not fit "store is full" (the connection stays usable), and drops a
    connection whose frame stalls for ``frame_idle_s``."""
    value = b"v" * (BIG - 64)
    stalled = []
    for i in range(5):
        sock, key = session(tight.port)
        frame = set_frame(key, 1, f"k{i}".encode(), value)
        sock.sendall(frame[: len(frame) // 2])  # half a frame, then nothing
        stalled.append(sock)
    settle(tight)
    stats = tight.stats()
    assert stats.peak_buffered <= TIGHT.max_total, stats
    assert stats.held <= TIGHT.max_total, stats
    sock, key = session(tight.port)
    sock.sendall(set_frame(key, 1, b"late", value))
    assert answer(sock, key, 1).startswith(b"Estore is full"), "a frame that does not fit is answered, not kept"
    sock.sendall(set_frame(key, 2, b"small", b"x"))
    assert answer(sock, key, 2) == b"O"
    began = time.monotonic()
    assert all(closed_within(s, 3.0) for s in stalled), "a stalled frame kept its connection"
    assert time.monotonic() - began < 2.5
    settle(tight)
    assert tight.stats().held == 0 and tight.stats().buffered == 0
    sock.sendall(set_frame(key, 3, b"big", value))
    assert answer(sock, key, 3) == b"O", "the space the stalled frames held is free again"
    assert tight.get("small") == b"x" and len(tight.get("big")) == len(value)
    sock.close()


def test_a_frame_that_does_not_fit_is_still_checked() -> None:
    """A skimmed frame's MAC is checked piece by piece: a forged one ends the connection, as a kept one would."""
    hosted = host(SECRET, 0, timeout_s=5, host="127.0.0.1", limits=TIGHT)
    try:
        filler, key = session(hosted.port)
        for i in range(2):
            filler.sendall(set_frame(key, i + 1, f"f{i}".encode(), b"v" * (BIG - 64)))
            assert answer(filler, key, i + 1) == b"O"
        sock, key = session(hosted.port)
        frame = bytearray(set_frame(key, 1, b"late", b"v" * (BIG - 64)))
        frame[100] ^= 1
        sock.sendall(bytes(frame))
        assert closed_within(sock, 3.0)
    finally:
        hosted.close()


def squatter(byte_every: float) -> tuple[socket.socket, threading.Event]:
    """A port that takes the hello and answers with a server hello one byte at a time."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                recv_exact(conn, auth.CLIENT_HELLO_LEN)
                for b in auth.MAGIC + os.urandom(auth.SERVER_HELLO_LEN - len(auth.MAGIC)):
                    if done.wait(byte_every):
                        break
                    conn.sendall(bytes([b]))
            except (OSError, EOFError):
                pass
            finally:
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, done


def test_a_handshake_ends_by_the_connect_deadline_however_slowly_main_answers() -> None:
    """Before: the connect deadline bounded each read, so a squatter answering a byte every 0.1 s kept a worker
    for the whole 84-byte hello and more (0.5 s deadline: 33.6 s). Now the handshake ends by the deadline."""
    listener, done = squatter(0.1)
    began = time.monotonic()
    try:
        with pytest.raises(NoHandshake):
            port = listener.getsockname()[1]
            Client.connect("127.0.0.1", port, SECRET, timeout_s=5, connect_s=0.5, limits=Limits(handshake_s=5.0))
    finally:
        done.set()
        listener.close()
    assert time.monotonic() - began < 1.5


WORKER = """
import sys, time
from nodekit.launcher.store.client import Client
c = Client.connect("127.0.0.1", int(sys.argv[1]), sys.argv[2], timeout_s=5, connect_s=5)
c.will("nodekit/gone/1")
c.add("nodekit/hb/1", 1)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_worker_leaves_closed_and_a_connection_cut_mid_frame_leaves_cut() -> None:
    """The will main keeps for a worker's connection: a worker process SIGKILLed between calls (what `docker kill`
    does to a container) leaves ``closed`` at once; a connection that ends in the middle of a frame, ``cut``; a
    connection main closes itself (its own end) leaves nothing."""
    hosted = host(SECRET, 0, timeout_s=5, host="127.0.0.1")
    try:
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(hosted.port), SECRET], stdout=subprocess.PIPE,
                                  text=True)  # fmt: skip
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        assert not hosted.check(["nodekit/gone/1"])
        killed = time.monotonic()
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert hosted.get("nodekit/gone/1") == b"closed"  # waits up to the store's timeout
        assert time.monotonic() - killed < 1.0
        client = Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=5, connect_s=5)
        client.will("nodekit/gone/2")
        client._sock.sendall(b"\x00\x00\x01\x00partial")  # a frame begun, then the connection ends
        client._sock.close()
        assert hosted.get("nodekit/gone/2") == b"cut"
        last = Client.connect("127.0.0.1", hosted.port, SECRET, timeout_s=5, connect_s=5)
        last.will("nodekit/gone/3")
    finally:
        hosted.close()
    time.sleep(0.3)
    assert not hosted.table.check([b"nodekit/gone/3"])
    last.close()
