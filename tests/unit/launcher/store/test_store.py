"""The preflight store's protocol on real loopback sockets: main's server and workers' clients in this process.

Only a holder of the job secret gets in, main proves itself to every worker, and bytes recorded from a good
connection (its handshake or its frames) are refused on any other. The floods are in test_flood.py.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nodekit.launcher.datacheck import compare as samedata
from nodekit.launcher.datacheck.manifest import Entry
from nodekit.launcher.preflight.exchange import PreflightError, SecretMismatch, open_store
from nodekit.launcher.store import auth
from nodekit.launcher.store.auth import SERVER_HELLO_LEN, TO_CLIENT, TO_SERVER, NotNodekit, WrongSecret
from nodekit.launcher.store.client import Client, recv_exact
from nodekit.launcher.store.kv import ADMIT, I64, Hosted, Limits, StoreError
from nodekit.launcher.store.server import host
from tests.factories import S1, S2, STORE_LIMITS, cfg, join, wait_for


@pytest.fixture
def main() -> Iterator[Hosted]:
    hosted = host(S1, 0, timeout_s=5, host="127.0.0.1", limits=STORE_LIMITS)
    yield hosted
    hosted.close()


def closed_by_peer(sock: socket.socket, within: float = 5.0) -> int | None:
    """How many bytes the peer sent before it closed (EOF or reset), or None when it did not close within
    ``within`` seconds."""
    sock.settimeout(within)
    got = 0
    try:
        while chunk := sock.recv(1 << 16):
            got += len(chunk)
        return got
    except ConnectionResetError:
        return got
    except TimeoutError:
        return None


def raw_session(port: int, secret: str = S1) -> tuple[socket.socket, bytes]:
    """A hand-made client: the handshake done with the auth functions, then the raw socket and session key."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    nonce = os.urandom(auth.NONCE_LEN)
    sock.sendall(auth.client_hello(nonce))
    hs = auth.read_server_hello(recv_exact(sock, SERVER_HELLO_LEN), secret, nonce)
    sock.sendall(hs.client_tag(secret))
    key = hs.session_key(secret)
    header = recv_exact(sock, auth.HEADER_LEN)
    body = recv_exact(sock, auth.frame_length(header) + auth.TAG_LEN)
    assert auth.unseal(key, TO_CLIENT, 0, header, body) == ADMIT
    return sock, key


def add_request(key: str, amount: int) -> bytes:
    return b"A" + I64.pack(amount) + key.encode()


class Recorder:
    """A TCP relay in front of main that records every byte its one client sent: what an eavesdropper keeps."""

    def __init__(self, target: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.sent = target, bytearray()
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target))

        def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
            try:
                while data := src.recv(1 << 16):
                    if record:
                        self.sent += data
                    dst.sendall(data)
            except OSError:
                pass  # the other direction closed this socket first
            finally:
                dst.close()

        threading.Thread(target=pump, args=(upstream, client, False), daemon=True).start()
        pump(client, upstream, True)


def test_a_worker_and_main_share_the_four_calls(main: Hosted) -> None:
    worker = join(main)
    worker.set("nodekit/facts/1", '{"rank": 1}')
    assert main.get("nodekit/facts/1") == b'{"rank": 1}'
    assert worker.add("nodekit/claim/1", 1) == 1 and main.add("nodekit/claim/1", 1) == 2
    assert worker.add("nodekit/hb/2", 0) == 0 and main.check(["nodekit/hb/2"])  # add creates, as TCPStore's
    assert worker.check(["nodekit/facts/1", "nodekit/claim/1"]) and not worker.check(["nodekit/verdict"])
    threading.Timer(0.2, main.set, args=("nodekit/data-report", '[true, "ok"]')).start()
    assert worker.get("nodekit/data-report") == b'[true, "ok"]'  # get waits for the key, as TCPStore's
    assert worker.run_id == main.run_id and len(main.run_id) == auth.RUN_ID_LEN
    worker.close()


def test_a_client_without_the_secret_is_refused_and_changes_nothing(main: Hosted) -> None:
    main.set("nodekit/verdict", "main's")
    with pytest.raises(WrongSecret):  # the client learns it first: main's proof does not verify with its secret
        join(main, S2)
    # A client that ignores main's proof and answers with a guess is cut off before any frame is read.
    sock = socket.create_connection(("127.0.0.1", main.port), timeout=5)
    sock.sendall(auth.client_hello(os.urandom(auth.NONCE_LEN)))
    recv_exact(sock, SERVER_HELLO_LEN)
    sock.sendall(os.urandom(auth.PROOF_LEN) + auth.seal(b"guess", TO_SERVER, 0, b"S\x00\x0fnodekit/verdictforged"))
    assert closed_by_peer(sock) == 0  # cut off at the proof: not even admitted
    assert main.get("nodekit/verdict") == b"main's" and len(main.table) == 1
    assert wait_for(lambda: main.stats().refused == 1)


def test_a_recorded_handshake_and_its_frames_are_refused_when_replayed(main: Hosted) -> None:
    spy = Recorder(main.port)
    worker = Client.connect("127.0.0.1", spy.port, S1, timeout_s=5, connect_s=5, limits=STORE_LIMITS)
    worker.set("nodekit/verdict", "mismatch")
    assert worker.add("nodekit/claim/1", 1) == 1
    worker.close()
    assert wait_for(lambda: len(spy.sent) > auth.CLIENT_HELLO_LEN + auth.PROOF_LEN)
    main.set("nodekit/verdict", "ok")
    for _ in range(3):
        replay = socket.create_connection(("127.0.0.1", main.port), timeout=5)
        replay.sendall(bytes(spy.sent))
        assert closed_by_peer(replay) == SERVER_HELLO_LEN  # main's fresh hello, then cut off at the proof
    assert main.get("nodekit/verdict") == b"ok" and main.add("nodekit/claim/1", 0) == 1
    assert wait_for(lambda: main.stats().refused == 3)


def test_a_frame_replayed_within_or_across_connections_is_refused(main: Hosted) -> None:
    first, key = raw_session(main.port)
    frame = auth.seal(key, TO_SERVER, 0, add_request("nodekit/hb/1", 1))
    first.sendall(frame)
    recv_exact(first, auth.HEADER_LEN + 1 + I64.size + auth.TAG_LEN)
    first.sendall(frame)  # the same bytes again: its sequence number is spent
    assert closed_by_peer(first) == 0
    second, _ = raw_session(main.port)
    second.sendall(frame)  # another connection's session key
    assert closed_by_peer(second) == 0
    assert main.add("nodekit/hb/1", 0) == 1


def test_an_authenticated_client_cannot_make_main_read_an_oversized_frame(main: Hosted) -> None:
    for length in (STORE_LIMITS.max_frame + 1, 0xFFFFFFFF, 0):
        sock, _ = raw_session(main.port)
        sock.sendall(length.to_bytes(4, "big"))  # the header alone: main must refuse before any body arrives
        assert closed_by_peer(sock, within=2.0) == 0
    worker = join(main)
    with pytest.raises(StoreError, match="store refused a key of 3 or a value of"):
        worker.set("big", b"x" * (STORE_LIMITS.max_value + 1))
    assert len(main.table) == 0


def test_the_caps_on_keys_and_total_bytes_hold_for_members_too() -> None:
    small = Limits(max_value=100, max_keys=3, max_total=250, handshake_s=0.5)
    hosted = host(S1, 0, timeout_s=5, host="127.0.0.1", limits=small)
    try:
        worker = Client.connect("127.0.0.1", hosted.port, S1, timeout_s=5, connect_s=5, limits=small)
        worker.set("a", "x" * 100)
        worker.set("b", "x" * 100)
        with pytest.raises(StoreError, match="store is full"):
            worker.set("c", "x" * 100)
        worker.set("c", "x")
        with pytest.raises(StoreError, match="3 keys"):
            worker.set("d", "x")
        worker.set("a", "y")  # replacing frees its bytes
        worker.set("b", "y" * 100)
        assert hosted.table.stored == 2 + 101 + 2 and len(hosted.table) == 3
    finally:
        hosted.close()


def test_a_fake_main_without_the_secret_is_detected_by_the_worker() -> None:
    # Main with another secret (another job on the port), and an impostor replaying a real main's recorded hello.
    other = host(S2, 0, timeout_s=5, host="127.0.0.1", limits=STORE_LIMITS)
    try:
        with pytest.raises(WrongSecret):
            join(other, S1)
        sock = socket.create_connection(("127.0.0.1", other.port), timeout=5)
        sock.sendall(auth.client_hello(os.urandom(auth.NONCE_LEN)))
        recorded = recv_exact(sock, SERVER_HELLO_LEN)
    finally:
        other.close()
    recorded_s1 = record_hello(S1)
    impostor = socket.create_server(("127.0.0.1", 0))

    def serve(hello: bytes) -> None:
        conn, _ = impostor.accept()
        recv_exact(conn, auth.CLIENT_HELLO_LEN)
        conn.sendall(hello)
        time.sleep(1)
        conn.close()

    for hello in (recorded, recorded_s1):
        threading.Thread(target=serve, args=(hello,), daemon=True).start()
        with pytest.raises(WrongSecret):
            Client.connect("127.0.0.1", impostor.getsockname()[1], S1, timeout_s=5, connect_s=5)
    impostor.close()


def record_hello(secret: str) -> bytes:
    hosted = host(secret, 0, timeout_s=5, host="127.0.0.1", limits=STORE_LIMITS)
    try:
        sock = socket.create_connection(("127.0.0.1", hosted.port), timeout=5)
        sock.sendall(auth.client_hello(os.urandom(auth.NONCE_LEN)))
        return recv_exact(sock, SERVER_HELLO_LEN)
    finally:
        hosted.close()


def test_open_store_names_each_way_a_worker_cannot_join() -> None:
    other = host(S2, 0, timeout_s=5, host="127.0.0.1")
    worker = cfg(1, 2, 5.0, MASTER_ADDR="127.0.0.1", NODEKIT_PREFLIGHT_PORT=str(other.port), NODEKIT_JOB_SECRET=S1)
    with pytest.raises(SecretMismatch, match="another NODEKIT_JOB_SECRET than this node's"):
        open_store(worker, 5, connect_s=2)
    other.close()
    with pytest.raises(PreflightError, match="ended the job before this node joined"):
        open_store(worker, 5, connect_s=0.3)  # nothing listens any more
    silent = socket.create_server(("127.0.0.1", 0))  # a port that takes connections and never answers
    port = silent.getsockname()[1]
    worker = cfg(1, 2, 5.0, MASTER_ADDR="127.0.0.1", NODEKIT_PREFLIGHT_PORT=str(port), NODEKIT_JOB_SECRET=S1)
    with pytest.raises(PreflightError, match="completed no nodekit store handshake"):
        open_store(worker, 5, connect_s=0.5)
    silent.close()
    with pytest.raises(NotNodekit):
        auth.read_server_hello(b"HTTP/1.1 400 Bad Request\r\n".ljust(SERVER_HELLO_LEN), S1, b"n" * 32)


def test_a_manifest_of_100000_files_fits_the_value_cap(main: Hosted) -> None:
    entries = tuple(
        Entry(f"train/shard-{i // 1000:03d}/sample-{i:06d}.jpg", 1000 + i, "f" * 64) for i in range(100_000)
    )
    worker = Client.connect("127.0.0.1", main.port, S1, timeout_s=30, connect_s=5)  # production caps
    samedata.publish_own(worker, 1, [("/data", "hashes")], scan=lambda target, hashes: entries)
    view = samedata.Published(**json.loads(main.get("nodekit/data//data/1")))
    assert view.files == 100_000 and not view.error
    assert 10 << 20 < main.table.stored < main.table.limits.max_value  # ~13 MB: about a fifth of the cap
