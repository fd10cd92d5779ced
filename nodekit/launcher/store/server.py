"""Main's side of the preflight store: one thread serving every connection (``selectors``, non-blocking sockets).

One thread, no thread per connection, so a flood of connections costs main file descriptors for at most
``max_pending + max_sessions`` sockets and a few bytes each, never threads. Per connection main reads exactly the
bytes the current step needs: the 36-byte hello, the 32-byte proof, then for an admitted client a 4-byte frame
header, checked against the frame cap before the body is read. It reads nothing more from a connection while its
answer is still being sent, so a client that does not read its answers cannot make main queue them. A
connection in the handshake is dropped after ``handshake_s``, on a wrong hello or proof, or when it is the oldest
of ``max_pending`` and another arrives (``pending.py``, kept by the link check's listener too); an admitted one on
an oversized, forged or malformed frame, or when a frame it started stalls for ``frame_idle_s``.

Frames on their way count against the store's total: a frame's declared length is held back from its header to its
last byte, and one that does not fit beside what is stored and held is read without being kept (its MAC checked
piece by piece) and answered "store is full". Requests of at most :data:`SMALL_FRAME` bytes (every get, add,
check and heartbeat) always fit: with ``max_sessions`` connections that is at most a few MiB beside the cap.

A connection may leave a *will* (the ``W`` request, :meth:`nodekit.launcher.store.client.Client.will`): a key main
sets when that connection ends, to ``closed`` when the peer closed it between frames (its process ended: the kernel
closes its sockets) and to ``cut`` for anything less clear (a reset, a close mid-frame, a connection main dropped).
The peer watchdog reads it to name a node whose container was killed at once, instead of a peer timeout later.

:func:`host` gives main's launcher a ``store.Hosted``: main's own calls go to the table directly, and the port is
served for as long as that object lives (the peer watchdog keeps it for the whole job) or until it is closed.
"""

from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from nodekit.launcher.store.auth import (
    CLIENT_HELLO_LEN,
    HEADER_LEN,
    NONCE_LEN,
    PROOF_LEN,
    RUN_ID_LEN,
    TAG_LEN,
    TO_CLIENT,
    TO_SERVER,
    Handshake,
    NotNodekit,
    frame_length,
    frame_mac,
    notice_rank,
    proof_ok,
    read_client_hello,
    seal,
    server_hello,
    tag_ok,
    unseal,
)
from nodekit.launcher.store.kv import ADMIT, LIMITS, Hosted, Limits, StoreError, Table
from nodekit.launcher.store.pending import Pending

HELLO, PROOF, HEADER, BODY = range(4)
SWEEP_S = 0.25  # how often expired handshakes are dropped when nothing else happens
ACCEPT_BATCH = 16  # connections taken per wake-up, so that a flood cannot starve the reads of those accepted
READ_CHUNK = 1 << 20
SMALL_FRAME = 64 << 10  # a request this small is never held back by the total (see the module docstring)
MAX_NOTICES = 64  # distinct (rank, address) wrong-secret notices kept: a stranger can send them too
CLOSED, CUT = b"closed", b"cut"  # what a will says: the peer closed between frames, or anything less clear


@dataclass(frozen=True)
class Stats:
    """Main's accounting, refreshed by the serving thread (tests read it to check that nothing grows)."""

    pending: int = 0
    sessions: int = 0
    buffered: int = 0  # bytes held for connections: partial input and unsent output
    peak_pending: int = 0
    peak_buffered: int = 0
    refused: int = 0  # wrong hello, proof or frame
    evicted: int = 0  # pushed out of the handshake by newer connections, or out of time
    keys: int = 0
    stored: int = 0
    held: int = 0  # bytes of frames on their way, counted against the total cap


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    phase: int = HELLO
    need: int = CLIENT_HELLO_LEN
    inbuf: bytearray = field(default_factory=bytearray)
    out: bytes = b""
    sent: int = 0
    hs: Handshake | None = None
    key: bytes = b""
    header: bytes = b""
    rseq: int = 0
    wseq: int = 0
    last: float = 0.0  # when a byte last arrived
    held: int = 0  # this frame's length, held back from the total until it is applied
    skim: Any = None  # the MAC of a frame read without being kept (it does not fit), else None
    got: int = 0  # bytes of that frame read so far
    tail: bytearray = field(default_factory=bytearray)  # its tag
    will: bytes = b""  # the key set when this connection ends

    @property
    def mid_frame(self) -> bool:
        return self.phase == BODY or bool(self.inbuf)


def _listen(host: str, port: int) -> socket.socket:
    """Bind as TCPStore did: both wildcards when the kernel has IPv6, SO_REUSEADDR (create_server sets it)."""
    if not host and socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
    return socket.create_server((host, port), backlog=128)


class Server:
    """Serves ``table`` on ``port`` to clients holding ``secret``; :meth:`start` it, :meth:`close` it."""

    def __init__(self, secret: str, port: int, table: Table, *, host: str = "", limits: Limits = LIMITS) -> None:
        self.secret, self.table, self.limits = secret, table, limits
        self.run_id = secrets.token_bytes(RUN_ID_LEN)  # fresh for every run: bound into every handshake
        self._listener = _listen(host, port)
        self.port = int(self._listener.getsockname()[1])
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pending: Pending[_Conn] = Pending(limits.max_pending, limits.handshake_s)
        self._sessions: set[_Conn] = set()
        self._stop = threading.Event()
        self._stats = Stats()
        self._refused = self._evicted = self._peak_pending = 0
        self._wrong: tuple[tuple[int, str], ...] = ()
        self._held = 0
        self._counted_at = 0.0
        self._thread = threading.Thread(target=self._serve, name="nodekit-store", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection and the port (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def stats(self) -> Stats:
        return self._stats

    # -- the serving thread --

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, mask in self._sel.select(timeout=SWEEP_S):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        self._io(key.data, mask)
                self._sweep(time.monotonic())
                self._count(time.monotonic())
        finally:
            for conn in [*self._pending, *self._sessions]:
                conn.sock.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()
            self._sel.close()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors: make room by dropping the oldest handshake
                if (oldest := self._pending.oldest()) is not None:
                    self._evict(oldest)
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            if (pushed := self._pending.add(conn, time.monotonic())) is not None:
                self._evict(pushed)
            self._peak_pending = max(self._peak_pending, len(self._pending))
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _sweep(self, now: float) -> None:
        for conn in self._pending.expired(now):
            self._evict(conn)
        for conn in [c for c in self._sessions if c.mid_frame and now - c.last >= self.limits.frame_idle_s]:
            self._evict(conn)

    def _count(self, now: float) -> None:
        if now - self._counted_at < 0.05 and not self._stop.is_set():
            return
        self._counted_at = now
        conns = [*self._pending, *self._sessions]
        buffered = sum(len(c.inbuf) + len(c.out) - c.sent for c in conns)
        old = self._stats
        self._stats = Stats(
            pending=len(self._pending),
            sessions=len(self._sessions),
            buffered=buffered,
            peak_pending=self._peak_pending,
            peak_buffered=max(old.peak_buffered, buffered),
            refused=self._refused,
            evicted=self._evicted,
            keys=len(self.table),
            stored=self.table.stored,
            held=self._held,
        )

    def _drop(self, conn: _Conn, how: bytes = CUT) -> None:
        self._pending.discard(conn)
        self._sessions.discard(conn)
        self._release(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        if conn.will and not self._stop.is_set():
            will, conn.will = conn.will, b""
            with contextlib.suppress(StoreError):  # a full store keeps its data; the heartbeat still tells
                self.table.set(will, how)

    def _release(self, conn: _Conn) -> None:
        self._held -= conn.held
        conn.held = 0

    def _evict(self, conn: _Conn) -> None:
        self._evicted += 1
        self._drop(conn)

    def _noticed(self, conn: _Conn, rank: int | None) -> None:
        if rank is None or len(self._wrong) >= MAX_NOTICES:
            return
        try:
            addr = str(conn.sock.getpeername()[0]).removeprefix("::ffff:")
        except OSError:
            return
        if (rank, addr) not in self._wrong:
            self._wrong = (*self._wrong, (rank, addr))  # replaced whole: read by other threads without a lock

    def wrong_secret(self) -> tuple[tuple[int, str], ...]:
        """``(rank, address)`` of each connection that told main it holds another job secret, first first.
        Unauthenticated claims (see :func:`nodekit.launcher.store.auth.wrong_secret_notice`): to be said, not
        acted on."""
        return self._wrong

    def _refuse(self, conn: _Conn) -> None:
        self._refused += 1
        self._drop(conn)

    def _io(self, conn: _Conn, mask: int) -> None:
        try:
            if conn.out:
                self._flush(conn)
                return
            have = conn.got if conn.skim is not None else len(conn.inbuf)
            chunk = conn.sock.recv(min(conn.need - have, READ_CHUNK))
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not chunk:
            self._drop(conn, CUT if conn.mid_frame else CLOSED)
            return
        conn.last = time.monotonic()
        if conn.skim is not None:
            self._skim(conn, chunk)
            return
        conn.inbuf += chunk
        if len(conn.inbuf) == conn.need:
            unit, conn.inbuf = bytes(conn.inbuf), bytearray()
            self._step(conn, unit)

    def _flush(self, conn: _Conn) -> None:
        with memoryview(conn.out) as view:
            conn.sent += conn.sock.send(view[conn.sent : conn.sent + READ_CHUNK])
        if conn.sent < len(conn.out):
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        conn.out, conn.sent = b"", 0
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _send(self, conn: _Conn, data: bytes) -> None:
        conn.out, conn.sent = data, 0
        try:
            self._flush(conn)
        except BlockingIOError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        except OSError:
            self._drop(conn)

    def _step(self, conn: _Conn, unit: bytes) -> None:
        """One complete unit of input: the hello, the proof, a frame header or a frame body."""
        if conn.phase == HELLO:
            try:
                nonce = read_client_hello(unit)
            except NotNodekit:
                self._refuse(conn)
                return
            conn.hs = Handshake(nonce, secrets.token_bytes(NONCE_LEN), self.run_id)
            conn.phase, conn.need = PROOF, PROOF_LEN
            self._send(conn, server_hello(self.secret, conn.hs))
        elif conn.phase == PROOF:
            assert conn.hs is not None
            if not proof_ok(self.secret, conn.hs, unit):
                self._noticed(conn, notice_rank(unit))
                self._refuse(conn)
                return
            self._pending.discard(conn)
            if len(self._sessions) >= self.limits.max_sessions:
                self._evict(conn)
                return
            self._sessions.add(conn)
            conn.key, conn.phase, conn.need = conn.hs.session_key(self.secret), HEADER, HEADER_LEN
            conn.last = time.monotonic()
            self._reply(conn, ADMIT)
        elif conn.phase == HEADER:
            n = frame_length(unit)
            if n == 0 or n > self.limits.max_frame:
                self._refuse(conn)
                return
            conn.header, conn.phase, conn.need = unit, BODY, n + TAG_LEN
            if n > SMALL_FRAME and self.table.stored + self._held + n > self.limits.max_total:
                conn.skim, conn.got = frame_mac(conn.key, TO_SERVER, conn.rseq, unit), 0
            else:
                conn.held = n
                self._held += n
        else:
            self._request(conn, unit)

    def _skim(self, conn: _Conn, chunk: bytes) -> None:
        """A piece of a frame that does not fit: fed to its MAC and dropped; at its end, "store is full"."""
        payload_left = max(0, conn.need - TAG_LEN - conn.got)
        conn.skim.update(chunk[:payload_left])
        conn.tail += chunk[payload_left:]
        conn.got += len(chunk)
        if conn.got < conn.need:
            return
        ok = tag_ok(conn.skim, bytes(conn.tail))
        n = conn.need - TAG_LEN
        conn.skim, conn.tail, conn.got = None, bytearray(), 0
        if not ok:
            self._refuse(conn)
            return
        conn.rseq += 1
        conn.phase, conn.need = HEADER, HEADER_LEN
        held = f"{self.table.stored} of {self.limits.max_total} bytes stored, {self._held} on their way"
        self._reply(conn, f"Estore is full: a request of {n} bytes does not fit ({held})".encode())

    def _request(self, conn: _Conn, body: bytes) -> None:
        self._release(conn)
        payload = unseal(conn.key, TO_SERVER, conn.rseq, conn.header, body)
        if payload is None:
            self._refuse(conn)
            return
        conn.rseq += 1
        if payload[:1] == b"W":  # this connection's will (see the module docstring)
            will = payload[1:]
            ok = 0 < len(will) <= self.limits.max_key
            response = b"O" if ok else f"Estore refused a will key of {len(will)} bytes".encode()
            conn.will = will if ok else conn.will
        else:
            try:
                response = self.table.apply(payload)
            except ValueError:
                self._refuse(conn)
                return
        conn.phase, conn.need = HEADER, HEADER_LEN
        self._reply(conn, response)

    def _reply(self, conn: _Conn, payload: bytes) -> None:
        frame = seal(conn.key, TO_CLIENT, conn.wseq, payload)
        conn.wseq += 1
        self._send(conn, frame)


def host(secret: str, port: int, *, timeout_s: float, host: str = "", limits: Limits = LIMITS) -> Hosted:
    """Bind ``port`` (OSError when taken) and serve a fresh, empty store for one run of the job; main's handle."""
    server = Server(secret, port, Table(limits), host=host, limits=limits)
    server.start()
    hosted = Hosted(
        server.table, timeout_s, port=server.port, run_id=server.run_id, close=server.close, stats=server.stats
    )
    hosted.wrong_secret = server.wrong_secret
    return hosted
