"""The listener one node runs during the link check: admits the partner that holds the job secret and serves its
requests (the protocol is in ``probe.py``). Standard library only.

Anyone who can reach the port can connect: another local user sees the listener (containers use the host network),
a LAN host may find it. And in the default ``links = "warn"`` a pair that cannot connect refuses the job (exit 20),
so a stranger who could keep the partner out could stop the job. The listener therefore treats strangers as main's
preflight store does (``store/server.py``), with the same bookkeeping (``store/pending.py``): one thread reads every
handshake (non-blocking, ``selectors``; no thread per stranger), a handshake has ``HANDSHAKE_S`` in all from its
accept, however its bytes trickle, and at most ``MAX_PENDING`` are held: a newcomer pushes out the oldest, so
strangers only push each other out. Only an admitted connection, which proved the secret, gets a thread of its own
(at most ``MAX_HANDLERS``: one partner at a time in a real check). The connecting side tries once more when its
connection fails in passing (``probe.measure``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from nodekit.launcher.linkcheck.probe import (
    CONNECT_S,
    DRAIN_S,
    Channel,
    LinkError,
    answer_pings,
    send_for,
    sink,
    stamp_arrivals,
)
from nodekit.launcher.store.auth import (
    CLIENT_HELLO_LEN,
    NONCE_LEN,
    PROOF_LEN,
    TO_CLIENT,
    TO_SERVER,
    Handshake,
    NotNodekit,
    proof_ok,
    read_client_hello,
    server_hello,
)
from nodekit.launcher.store.pending import Pending

MAX_HANDLERS = 16  # admitted connections served at once (one partner at a time in a real check)
# Connections in their handshake; a newcomer beyond it pushes out the oldest. As main's store (kv.Limits): the more
# are held, the faster a flood must come to push out a partner within its handshake's round trip.
MAX_PENDING = 64
HANDSHAKE_S = CONNECT_S  # a connection's whole handshake, from its accept (the partner's connect waits as long)
ACCEPT_POLL_S = 0.25  # how often expired handshakes are dropped when nothing else happens
ACCEPT_BATCH = 16  # connections taken per wake-up, so that a flood cannot starve the handshakes already in
_OUT_OF_ROOM = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(eq=False)
class _Greeting:
    """A connection in its handshake: what it has sent of the current step."""

    sock: socket.socket
    need: int = CLIENT_HELLO_LEN
    got: bytearray = field(default_factory=bytearray)
    hs: Handshake | None = None


class LinkServer:
    """The listener one node runs during the check: admits holders of ``secret`` for store run ``run_id``."""

    def __init__(self, secret: str, run_id: bytes, addr: str, *, v6: bool = False) -> None:
        """Listen on ``addr`` ("": every address of the family, IPv6 when ``v6``), on a port the kernel picks."""
        self.secret, self.run_id = secret, run_id
        family = socket.AF_INET6 if ":" in addr or (not addr and v6) else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stamp_arrivals(self._sock)  # every accepted connection inherits it: the pings' times of receipt (probe.py)
        self._sock.bind((addr, 0))
        self._sock.listen(32)
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self._pending: Pending[_Greeting] = Pending(MAX_PENDING, HANDSHAKE_S)
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self._thread = threading.Thread(target=self._loop, name="nodekit-linkcheck", daemon=True)

    def start(self) -> LinkServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        # Wakes the loop at once (Linux: a listener shut down is readable and its accept fails); it would otherwise
        # sleep out its poll, a quarter of a second added to every check's end.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(timeout=2 * ACCEPT_POLL_S + 1)
        else:  # never started: the loop's own cleanup did not run
            self._close_all()
        with contextlib.suppress(OSError):
            self._sock.close()

    # -- the handshake thread --

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=ACCEPT_POLL_S):
                    if key.data is None:
                        if not self._accept():
                            return
                    else:
                        self._read(key.data)
                for greeting in self._pending.expired(time.monotonic()):
                    self._drop(greeting)
        finally:
            self._close_all()

    def _close_all(self) -> None:
        for greeting in self._pending:
            self._drop(greeting)
        self._sel.close()

    def _accept(self) -> bool:
        """Take what waits; False once the listener is closed."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if self._stop.is_set():
                    return False
                if e.errno == errno.ECONNABORTED:  # it went away before it was taken
                    continue
                if e.errno not in _OUT_OF_ROOM:
                    return False
                if (oldest := self._pending.oldest()) is not None:  # out of descriptors: make room
                    self._drop(oldest)
                return True
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            greeting = _Greeting(sock)
            if (pushed := self._pending.add(greeting, time.monotonic())) is not None:
                self._drop(pushed)
            self._sel.register(sock, selectors.EVENT_READ, greeting)
        return True

    def _drop(self, greeting: _Greeting) -> None:
        self._pending.discard(greeting)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(greeting.sock)
        greeting.sock.close()

    def _read(self, g: _Greeting) -> None:
        """The next bytes of a handshake; each step (the hello, the proof) is read exactly, nothing beyond it."""
        try:
            chunk = g.sock.recv(g.need - len(g.got))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(g)
            return
        g.got += chunk
        if len(g.got) < g.need:
            return
        unit, g.got = bytes(g.got), bytearray()
        if g.hs is None:
            try:
                g.hs = Handshake(read_client_hello(unit), secrets.token_bytes(NONCE_LEN), self.run_id)
            except NotNodekit:
                self._drop(g)
                return
            hello = server_hello(self.secret, g.hs)
            try:
                sent = g.sock.send(hello)
            except OSError:
                sent = 0
            if sent != len(hello):  # 84 bytes into a fresh connection's empty buffer: only a broken one takes less
                self._drop(g)
                return
            g.need = PROOF_LEN
        elif proof_ok(self.secret, g.hs, unit):
            self._admit(g, g.hs)
        else:
            self._drop(g)

    def _admit(self, g: _Greeting, hs: Handshake) -> None:
        self._pending.discard(g)
        self._sel.unregister(g.sock)
        if not self._slots.acquire(blocking=False):  # only holders of the secret get here
            g.sock.close()
            return
        channel = Channel(g.sock, hs.session_key(self.secret), TO_CLIENT, TO_SERVER)
        threading.Thread(target=self._serve, args=(g.sock, channel), name="nodekit-linkcheck-pair", daemon=True).start()

    # -- an admitted connection, in its own thread --

    def _serve(self, conn: socket.socket, channel: Channel) -> None:
        try:
            with conn:
                conn.settimeout(CONNECT_S)
                self._request(conn, channel)
        except (OSError, EOFError, LinkError, ValueError):
            pass  # a partner that went away: its side reports what it saw
        finally:
            self._slots.release()

    def _request(self, conn: socket.socket, channel: Channel) -> None:
        request = json.loads(channel.recv())
        seconds = min(max(float(request.get("seconds", 0.0)), 0.0), 10.0)
        if request.get("op") == "up":
            answer_pings(channel)
            got = sink(conn, time.monotonic() + seconds + DRAIN_S, steady=True)
            conn.settimeout(CONNECT_S)
            channel.send(json.dumps({"bytes": got.bytes, "seconds": got.seconds, "error": got.error}).encode())
            conn.shutdown(socket.SHUT_WR)
            sink(conn, time.monotonic() + DRAIN_S)  # until the client closes: its unsent bytes are not ours
        elif request.get("op") == "down":
            send_for(conn, seconds)
            sink(conn, time.monotonic() + seconds + 2 * DRAIN_S)
