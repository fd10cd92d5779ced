"""The doctor-to-doctor TCP round trip: the protocol, the worker's client and main's listener.

Main's doctor speaks first: a line with its host name and clock. A worker only answers after it has read that
greeting, so probing a port that a running job's store holds never sends that store anything it cannot parse.
A line is ``NODEKIT-DOCTOR 1`` and ``key=value`` pairs, at most 512 bytes.

:func:`probe` is the worker's half (connect, read the greeting, answer, measure the round trip and main's clock);
:func:`listen` is main's (greet every worker that connects on the rendezvous ports, for a bounded time);
:func:`classify_connect_error` is the pure reading of a failed connect(). What this host itself is (addresses,
routes, interfaces, ports) lives in :mod:`nodekit.system.host.net`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

GREETING = "NODEKIT-DOCTOR 1"


class Reach(StrEnum):
    """What a TCP connection attempt to main found."""

    DOCTOR = "doctor answered"
    OPEN = "open, but not a nodekit doctor"
    REFUSED = "connection refused"
    UNREACHABLE = "host unreachable"
    NO_ROUTE = "no route"
    TIMEOUT = "timed out"
    ERROR = "error"


def classify_connect_error(exc: BaseException) -> Reach:
    """The kind of failure behind a failed connect()."""
    if isinstance(exc, TimeoutError):
        return Reach.TIMEOUT
    if isinstance(exc, ConnectionRefusedError):
        return Reach.REFUSED
    code = getattr(exc, "errno", None)
    if code == errno.ECONNREFUSED:
        return Reach.REFUSED
    if code in (errno.EHOSTUNREACH, errno.EHOSTDOWN):
        return Reach.UNREACHABLE
    if code in (errno.ENETUNREACH, errno.EADDRNOTAVAIL):
        return Reach.NO_ROUTE
    if code == errno.ETIMEDOUT:
        return Reach.TIMEOUT
    return Reach.ERROR


@dataclass(frozen=True)
class Probe:
    """One connection attempt to ``host:port``. With a doctor at the other end: round trip and main's clock."""

    host: str
    port: int
    reach: Reach
    detail: str = ""
    rtt_s: float | None = None
    # Seconds main's clock is ahead of ours, +- offset_error_s (half the round trip), when a doctor answered.
    clock_offset_s: float | None = None
    offset_error_s: float | None = None
    peer: dict[str, str] = field(default_factory=dict)
    """What main's doctor said about itself (host, time, mtu)."""


def probe(
    host: str, port: int, *, hello: str = "", connect_timeout: float = 3.0, greeting_timeout: float = 1.5
) -> Probe:
    """Connect to ``host:port``; if main's doctor greets, answer with ``hello`` and measure the round trip."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(connect_timeout)
        t0 = time.time()
        m0 = time.monotonic()
        try:
            s.connect((host, port))
        except OSError as e:
            return Probe(host, port, classify_connect_error(e), detail=os.strerror(e.errno) if e.errno else str(e))
        s.settimeout(greeting_timeout)
        try:
            line = _read_line(s)
        except OSError:
            line = ""
        m1 = time.monotonic()
        if not line.startswith(GREETING):
            return Probe(host, port, Reach.OPEN, detail="something else listens there", rtt_s=m1 - m0)
        fields = _fields(line)
        with contextlib.suppress(OSError):
            s.sendall(f"{GREETING} {hello}\n".encode())
        rtt = m1 - m0
        offset = err = None
        with contextlib.suppress(KeyError, ValueError):
            offset = float(fields["time"]) - (t0 + rtt / 2)
            err = rtt / 2
        return Probe(host, port, Reach.DOCTOR, rtt_s=rtt, clock_offset_s=offset, offset_error_s=err, peer=fields)


def hello_line(fields: dict[str, str]) -> str:
    """``key=value`` pairs for the handshake; values lose their spaces (host names and interfaces have none)."""
    return " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in fields.items())


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split()[2:] if "=" in part)


def _read_line(s: socket.socket, limit: int = 512) -> str:
    buf = b""
    while b"\n" not in buf and len(buf) < limit:
        chunk = s.recv(limit)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class Arrival:
    """A worker's doctor that reached main's listening doctor."""

    port: int
    peer: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        try:
            return int(self.fields["rank"])
        except (KeyError, ValueError):
            return None


def listen(
    ports: Sequence[int],
    *,
    seconds: float,
    host: str = "0.0.0.0",
    about: dict[str, str] | None = None,
    until: Callable[[list[Arrival]], bool] | None = None,
    on_arrival: Callable[[Arrival], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> list[Arrival]:
    """Answer workers' probes on ``ports`` for at most ``seconds`` (or until ``until(arrivals)`` is true).

    Each worker is greeted with this host's name and clock, plus ``about`` (e.g. the MTU toward the workers).

    Raises OSError (EADDRINUSE) when a port cannot be bound: something else holds it.
    """
    sel = selectors.DefaultSelector()
    socks = []
    try:
        for port in ports:
            srv = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            socks.append(srv)
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind((host, port))
            srv.listen(64)
            srv.setblocking(False)
            sel.register(srv, selectors.EVENT_READ, port)
        if on_ready is not None:
            on_ready()
        arrivals: list[Arrival] = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not (until is not None and until(arrivals)):
            for key, _ in sel.select(timeout=min(left, 0.2)):
                arrival = _serve_one(key.fileobj, int(key.data), about or {})  # type: ignore[arg-type]
                if arrival is not None:
                    arrivals.append(arrival)
                    if on_arrival is not None:
                        on_arrival(arrival)
        return arrivals
    finally:
        sel.close()
        for srv in socks:
            srv.close()


def _serve_one(srv: socket.socket, port: int, about: dict[str, str]) -> Arrival | None:
    try:
        conn, addr = srv.accept()
    except OSError:
        return None
    with conn:
        conn.setblocking(True)
        conn.settimeout(2.0)
        try:
            fields = {"host": socket.gethostname(), **about, "time": f"{time.time():.6f}"}
            conn.sendall(f"{GREETING} {hello_line(fields)}\n".encode())
            line = _read_line(conn)
        except OSError:
            return None
    if not line.startswith(GREETING):
        return None
    return Arrival(port=port, peer=str(addr[0]), fields=_fields(line))
