"""A worker's side of the preflight store: connect, prove the job secret, check main's proof, then MAC'd calls.

See ``auth.py`` for the handshake, ``kv.py`` for the calls and caps and ``server.py`` for main's side. Standard
library only.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time

from nodekit.launcher.store.auth import (
    HEADER_LEN,
    NONCE_LEN,
    SERVER_HELLO_LEN,
    TAG_LEN,
    TO_CLIENT,
    TO_SERVER,
    WrongSecret,
    client_hello,
    frame_length,
    read_server_hello,
    seal,
    unseal,
    wrong_secret_notice,
)
from nodekit.launcher.store.kv import ADMIT, I64, LIMITS, U16, Limits, NoHandshake, StoreError, as_bytes, pack_keys

GET_POLL_S = 0.02  # a get() of a key not yet there asks again this often (a LAN round trip each)
RETRY_S = 0.05  # between connection attempts while main's port is not answering the handshake


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Exactly ``n`` bytes from ``sock``; EOFError when the peer closes first. Without ``deadline`` the socket's
    timeout applies to each read; with one (``time.monotonic()``), to all of them together: a peer that sends a
    byte now and then cannot stretch the wait (TimeoutError once it passes)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(buf)} of {n} bytes came before the deadline")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


class Client:
    """A worker's authenticated connection to main's store. Never reconnects (as TCPStore's client): a lost
    connection is final, every later call raises :class:`StoreError`."""

    def __init__(self, sock: socket.socket, key: bytes, run_id: bytes, timeout_s: float, limits: Limits) -> None:
        self._sock, self._key, self.run_id = sock, key, run_id
        self.timeout_s, self.limits = timeout_s, limits
        self._wseq = self._rseq = 0
        self._lock = threading.Lock()
        self._broken: str | None = None

    @classmethod
    def connect(
        cls,
        addr: str,
        port: int,
        secret: str,
        *,
        timeout_s: float,
        connect_s: float,
        limits: Limits = LIMITS,
        rank: int | None = None,
    ) -> Client:
        """Connect and run the handshake, retrying a refused, reset or unfinished one until ``connect_s`` passes.
        Each attempt, its handshake included, ends by then: a port that answers a byte at a time holds it no longer.

        Raises ``auth.WrongSecret`` when main's proof does not verify (no retry: main holds another secret; with
        ``rank``, main is told which node that is, :func:`nodekit.launcher.store.auth.wrong_secret_notice`),
        ``auth.NotNodekit`` when the port speaks something else, :class:`NoHandshake` when main's port took
        connections but none finished the handshake in time, StoreError when no connection was taken at all.
        """
        deadline = time.monotonic() + connect_s
        connected = False
        while True:
            step = max(0.05, min(limits.handshake_s, deadline - time.monotonic()))
            ends = time.monotonic() + step
            try:
                sock = socket.create_connection((addr, port), timeout=step)
            except OSError as e:
                reason = e.strerror or str(e) or type(e).__name__
            else:
                connected = True
                try:
                    return cls._handshake(sock, secret, timeout_s, limits, ends, rank)
                except (OSError, EOFError) as e:
                    reason = str(e) or type(e).__name__
            if time.monotonic() >= deadline:
                error = NoHandshake if connected else StoreError
                raise error(f"no store handshake with main within {connect_s:g} s: {reason}")
            time.sleep(RETRY_S)

    @classmethod
    def _handshake(
        cls, sock: socket.socket, secret: str, timeout_s: float, limits: Limits, ends: float, rank: int | None
    ) -> Client:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = secrets.token_bytes(NONCE_LEN)
            sock.sendall(client_hello(nonce))
            try:
                hs = read_server_hello(recv_exact(sock, SERVER_HELLO_LEN, ends), secret, nonce)
            except WrongSecret:
                if rank is not None:
                    with contextlib.suppress(OSError):
                        sock.sendall(wrong_secret_notice(rank))
                raise
            sock.settimeout(max(0.001, ends - time.monotonic()))
            sock.sendall(hs.client_tag(secret))
            client = cls(sock, hs.session_key(secret), hs.run_id, timeout_s, limits)
            if client._recv(ends) != ADMIT:
                raise EOFError("main did not admit this connection")
            sock.settimeout(timeout_s)
            return client
        except BaseException:
            sock.close()
            raise

    def _recv(self, deadline: float | None = None) -> bytes:
        header = recv_exact(self._sock, HEADER_LEN, deadline)
        n = frame_length(header)
        if n > self.limits.max_frame:
            raise StoreError(f"main sent a frame of {n} bytes (cap {self.limits.max_frame})")
        payload = unseal(self._key, TO_CLIENT, self._rseq, header, recv_exact(self._sock, n + TAG_LEN, deadline))
        if payload is None:
            raise StoreError("a frame from main failed its check (changed on the way?)")
        self._rseq += 1
        return payload

    def _call(self, request: bytes) -> bytes:
        with self._lock:
            if self._broken is not None:
                raise StoreError(self._broken)
            try:
                self._sock.sendall(seal(self._key, TO_SERVER, self._wseq, request))
                self._wseq += 1
                response = self._recv()
            except (OSError, EOFError, StoreError) as e:
                self._broken = f"lost main's store: {str(e) or type(e).__name__}"
                self._sock.close()
                raise StoreError(self._broken) from e
            except BaseException:  # a signal's exception mid-call: the stream is out of step for good
                self._broken = "a store call was interrupted"
                self._sock.close()
                raise
        if response[:1] == b"E":
            raise StoreError(response[1:].decode(errors="replace"))
        return response

    def set(self, key: str, value: str | bytes) -> None:
        k = key.encode()
        if len(k) > self.limits.max_key:
            raise StoreError(f"store key of {len(k)} bytes (cap {self.limits.max_key})")
        self._call(b"S" + U16.pack(len(k)) + k + as_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it up to the client's timeout (as TCPStore's get)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            response = self._call(b"G" + key.encode())
            if response[:1] == b"V":
                return response[1:]
            if time.monotonic() >= deadline:
                raise StoreError(f"no key {key!r} in main's store within {self.timeout_s:g} s")
            time.sleep(GET_POLL_S)

    def add(self, key: str, amount: int) -> int:
        response = self._call(b"A" + I64.pack(amount) + key.encode())
        return int(I64.unpack_from(response, 1)[0])

    def check(self, keys: list[str]) -> bool:
        return self._call(b"C" + pack_keys([k.encode() for k in keys])) == b"B\x01"

    def will(self, key: str) -> None:
        """Ask main to set ``key`` when this connection ends: ``closed`` when this process closed it between calls
        (it ended), ``cut`` otherwise (``server.py``). The peer watchdog names a node whose key is set."""
        self._call(b"W" + key.encode())

    def close(self) -> None:
        with self._lock:
            self._broken = self._broken or "closed"
            self._sock.close()
