"""One pair's link measured over TCP: round trips, then a timed bulk transfer each way. Standard library only.

Every node listens during the check on its own training address (an ephemeral port, published through the
preflight store; the listener is ``listener.py``). A connection is admitted only after the preflight store's
handshake (``store/auth.py``) with the job secret and the store's run id, both ways: a process without the secret
learns nothing and moves no data, and the connecting node checks that the listener holds it too. Then, sealed with
the session key: the request (``up``: the client sends, the listener counts; ``down``: the other way) and the
pings. The bulk bytes themselves
are not sealed (a MAC per megabyte would measure the CPU, not the link); a forged byte can only spoil a figure,
which the receiver reports through the authenticated store (the client) or a sealed frame (the listener).

A connection that fails in passing is tried once more before the pair is called unreachable (which refuses the
job even with ``links = "warn"``): a reset, a close or a timeout, as when the listener pushed it out of its
handshake to admit a newer stranger (``listener.py``). A listener that answers with another secret, another run or
another protocol has answered: that is not tried again.

A ping's round trip is the path's, not the two processes': each end reads the time its kernel received the
other's frame (``SO_TIMESTAMPNS``), and the listener's answer carries how long it held the ping, from its kernel's
receipt to its answer. The connecting node subtracts that hold from the time between its send and its kernel's
receipt of the answer, as NTP subtracts a server's processing time. A listener whose process waited for a core (a
host busy with the job's start, a container's cpu cgroup waiting for its turn) held the ping longer; the path did
not get slower. Where the kernel gives no time (another OS, the first frames after the option is set), the time
the process read the frame stands in, and that end's wait counts as it did before.

The receiver times the transfer from its first to its last byte, so the sender's socket buffer does not count; it
stops waiting ``DRAIN_S`` after the sender's time is up, which bounds a pair on a crawling link.

A transfer's time is a bound, not a duration: the receiver ends it as soon as its rate has settled (:class:`Steady`:
its last windows agree with each other and with the whole transfer) and says so to the sender, which stops at once.
On a LAN the rate settles within a few windows, so the check takes a fraction of its bound and its bulk bytes leave
the links and the cores to the job's start sooner; a rate that keeps changing (slow start on a long path, a link
shared with other traffic) is measured for the whole bound, as before.
"""

from __future__ import annotations

import contextlib
import json
import platform
import secrets
import select
import socket
import struct
import sys
import time
from collections.abc import Callable

from nodekit.launcher.linkcheck.verdict import Pair, Transfer
from nodekit.launcher.store.auth import (
    HEADER_LEN,
    NONCE_LEN,
    SERVER_HELLO_LEN,
    TAG_LEN,
    TO_CLIENT,
    TO_SERVER,
    NotNodekit,
    WrongSecret,
    client_hello,
    frame_length,
    read_server_hello,
    seal,
    unseal,
)

CONNECT_S = 3.0  # a connection and its handshake
TRIES = 2  # a connection that fails in passing is tried once more (see the module docstring)
DRAIN_S = 2.0  # after the sender's time: how long the receiver still waits for the rest
PINGS = 5
CHUNK = 1 << 20
MAX_FRAME = 512  # requests, pings and results are small; anything bigger is not ours
# A transfer's figure (its bytes over its time, first byte to last) has settled (Steady) once at least
# STEADY_MIN_S have passed since its first byte and the figure, taken every WINDOW_S, has stayed within
# STEADY_SPREAD over its last STEADY_WINDOWS readings. The verdict calls a pair slow under a quarter of the others
# (verdict.SLOW_RATIO): a figure settled to within 10 % is plenty, and a figure that still climbs (slow start on a
# long path) or falls (a stall) is not settled.
WINDOW_S = 0.02
STEADY_WINDOWS = 3
STEADY_SPREAD = 1.1
STEADY_MIN_S = 0.06
STOP = b"enough"  # the receiver to the sender: the rate has settled, stop sending
PING_LEN = 8  # a ping: its index; the answer: the index, then how long the listener held it (ns), 8 bytes each
# The kernel's time of a frame's receipt, as a control message on each read (socket(7)). Python's socket module does
# not name it; 35 is its value on Linux's every architecture but sparc's and parisc's, which go without.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")  # struct timespec: seconds and nanoseconds, the C long of this machine
STAMPS = sys.platform == "linux" and not platform.machine().startswith(("sparc", "parisc"))


class LinkError(Exception):
    """The pair could not be measured: no connection, a failed handshake, a lost connection. One line."""


class AnotherRun(LinkError):
    """The listener holds the job secret but answers for another run of the job: an answer, not a passing fault."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def stamp_arrivals(sock: socket.socket) -> None:
    """Ask the kernel for each received frame's time of receipt (:func:`Channel.recv_stamped`); a socket that
    cannot is read as before."""
    if STAMPS:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, ns = _TIMESPEC.unpack_from(data)
            return sec + ns / 1e9 if sec > 0 else None
    return None


def _recv_exact_stamped(sock: socket.socket, n: int) -> tuple[bytes, float]:
    """:func:`_recv_exact`, and when the first of its bytes reached this machine: the kernel's time of receipt
    (``time.time()``'s clock), or the time they were read where the kernel gives none."""
    data, ancillary, _flags, _addr = sock.recvmsg(n, socket.CMSG_SPACE(_TIMESPEC.size))
    read = time.time()
    if not data:
        raise EOFError(f"connection closed after 0 of {n} bytes")
    arrived = _stamp(ancillary)
    rest = _recv_exact(sock, n - len(data)) if len(data) < n else b""
    return data + rest, read if arrived is None else min(arrived, read)


class Channel:
    """The sealed frames of one admitted connection (seq counters per direction, as the store's)."""

    def __init__(self, sock: socket.socket, key: bytes, out: bytes, into: bytes) -> None:
        self.sock, self.key, self.out, self.into = sock, key, out, into
        self.wseq = self.rseq = 0

    def send(self, payload: bytes) -> None:
        self.sock.sendall(seal(self.key, self.out, self.wseq, payload))
        self.wseq += 1

    def recv(self) -> bytes:
        return self.recv_stamped()[0]

    def recv_stamped(self) -> tuple[bytes, float]:
        """The next frame's payload, and when it reached this machine (:func:`_recv_exact_stamped`)."""
        header, arrived = _recv_exact_stamped(self.sock, HEADER_LEN)
        n = frame_length(header)
        if n > MAX_FRAME:
            raise LinkError(f"a frame of {n} bytes (cap {MAX_FRAME})")
        payload = unseal(self.key, self.into, self.rseq, header, _recv_exact(self.sock, n + TAG_LEN))
        if payload is None:
            raise LinkError("a frame failed its check")
        self.rseq += 1
        return payload, arrived


class Steady:
    """Whether a transfer's figure has settled, from the bytes a receiver counts as they arrive (pure: times are
    handed in). See ``STEADY_*`` above for the rule."""

    def __init__(self, start: float) -> None:
        self.start = self._window = start
        self.total = 0
        self.figures: list[float] = []  # bytes per second since the first byte, at each window's end

    def add(self, n: int, t: float) -> bool:
        """``n`` more bytes counted at ``t``; True once the figure has settled."""
        self.total += n
        if t - self._window < WINDOW_S:
            return False
        self._window = t
        self.figures.append(self.total / (t - self.start))
        if t - self.start < STEADY_MIN_S or len(self.figures) < STEADY_WINDOWS:
            return False
        last = self.figures[-STEADY_WINDOWS:]
        return min(last) > 0 and max(last) <= STEADY_SPREAD * min(last)


def told_to_stop(sock: socket.socket) -> bool:
    """The receiver has written to us (its STOP, or its result): it has its figure."""
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def send_for(sock: socket.socket, seconds: float, now: Callable[[], float] = time.monotonic) -> None:
    """Send zeros for ``seconds`` at most (bounded even when the peer stops reading) or until the receiver writes
    back that its rate has settled, then close our direction."""
    block = memoryview(bytes(CHUNK))
    end = now() + seconds
    try:
        while (left := end - now()) > 0 and not told_to_stop(sock):
            sock.settimeout(left)
            sock.send(block)
    except OSError:  # TimeoutError (a full buffer at the end), or the peer closed: the receiver has its figure
        pass
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def sink(
    sock: socket.socket, deadline: float, now: Callable[[], float] = time.monotonic, *, steady: bool = False
) -> Transfer:
    """Count what arrives until the sender closes or ``deadline`` (with ``steady``: or until the rate has settled,
    :class:`Steady`); the rate runs from the first to the last byte (the first chunk's bytes are not counted: they
    arrived before the clock started)."""
    buf = bytearray(CHUNK)
    first = last = 0.0
    counted = 0
    started = False
    settled: Steady | None = None
    while (left := deadline - now()) > 0:
        sock.settimeout(left)
        try:
            n = sock.recv_into(buf)
        except TimeoutError:
            break
        except OSError as e:
            if not started:
                return Transfer(error=f"receiving: {e.strerror or e}")
            break
        if n == 0:
            break
        last = t = now()
        if not started:
            first, started = t, True
            settled = Steady(t) if steady else None
            continue
        counted += n
        if settled is not None and settled.add(n, t):
            break
    if not started:
        return Transfer(error="no data arrived")
    return Transfer(bytes=counted, seconds=round(last - first, 6))


def _connect(addr: str, port: int, secret: str, run_id: bytes, source: str | None) -> Channel:
    try:
        sock = socket.create_connection((addr, port), timeout=CONNECT_S, source_address=(source, 0) if source else None)
    except OSError as e:
        raise LinkError(f"cannot connect to {addr}:{port}: {e.strerror or e}") from e
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamp_arrivals(sock)  # before the handshake: the kernel turns its clock on for the frames after it
        nonce = secrets.token_bytes(NONCE_LEN)
        sock.sendall(client_hello(nonce))
        hs = read_server_hello(_recv_exact(sock, SERVER_HELLO_LEN), secret, nonce)
        if hs.run_id != run_id:
            raise AnotherRun(f"{addr}:{port} answers for another run of the job")
        sock.sendall(hs.client_tag(secret))
        return Channel(sock, hs.session_key(secret), TO_SERVER, TO_CLIENT)
    except BaseException:
        sock.close()
        raise


def _connect_tried(addr: str, port: int, secret: str, run_id: bytes, source: str | None) -> Channel:
    """:func:`_connect`, up to ``TRIES`` times while it fails in passing; an answer (another secret, run or
    protocol) is raised at once."""
    for left in reversed(range(TRIES)):
        try:
            return _connect(addr, port, secret, run_id, source)
        except AnotherRun:
            raise
        except (LinkError, OSError, EOFError):
            if not left:
                raise
    raise AssertionError("TRIES is at least 1")


def measure(
    a: int, b: int, addr: str, port: int, secret: str, run_id: bytes, seconds: float, *, source: str | None = None
) -> Pair:
    """Node ``a`` (this process) measures its link with node ``b`` listening at ``addr:port``: round trips and
    a's bytes to b (counted by b) on one connection, b's bytes to a (counted here) on a second, each connection
    tried once more when it fails in passing. Never raises: a failure is the pair's ``error``, or a direction's."""
    rtts: list[float] = []
    read: list[float] = []
    try:
        up = _connect_tried(addr, port, secret, run_id, source)
    except (LinkError, OSError, EOFError, NotNodekit, WrongSecret) as e:
        return Pair(a, b, Transfer(), Transfer(), error=_why(e))
    with up.sock:
        try:
            up.send(json.dumps({"op": "up", "seconds": seconds}).encode())
            for i in range(PINGS):
                path, whole = _ping(up, i)
                rtts.append(path)
                read.append(whole)
            send_for(up.sock, seconds)
            up.sock.settimeout(seconds + DRAIN_S + CONNECT_S)
            got = json.loads(up.recv())
            ab = Transfer(bytes=int(got["bytes"]), seconds=float(got["seconds"]), error=str(got.get("error", "")))
        except (LinkError, OSError, EOFError, ValueError, KeyError) as e:
            why, held_out, as_read = _why(e), path_rtt(rtts), path_rtt(read)
            return Pair(a, b, Transfer(error=why), Transfer(), held_out, f"during {a}->{b}: {why}", read_rtt_ms=as_read)
    try:
        down = _connect_tried(addr, port, secret, run_id, source)
    except (LinkError, OSError, EOFError, NotNodekit, WrongSecret) as e:
        return Pair(a, b, ab, Transfer(error=_why(e)), path_rtt(rtts), read_rtt_ms=path_rtt(read))
    with down.sock:
        try:
            down.send(json.dumps({"op": "down", "seconds": seconds}).encode())
            ba = sink(down.sock, time.monotonic() + seconds + DRAIN_S + CONNECT_S, steady=True)
            down.send(STOP)  # the listener stops sending; what it sent before is drained, then both sides close
            down.sock.shutdown(socket.SHUT_WR)
            sink(down.sock, time.monotonic() + DRAIN_S)
        except (LinkError, OSError) as e:
            ba = Transfer(error=_why(e))
    return Pair(a, b, ab, ba, path_rtt(rtts), read_rtt_ms=path_rtt(read))


def _ping(up: Channel, i: int) -> tuple[float, float]:
    """One ping on ``up``: the path's round trip (ms; the module docstring) and the whole one as read here."""
    sent = time.time()
    up.send(i.to_bytes(PING_LEN, "big"))
    answer, arrived = up.recv_stamped()
    read = time.time()
    if len(answer) != 2 * PING_LEN or answer[:PING_LEN] != i.to_bytes(PING_LEN, "big"):
        raise LinkError("a ping came back changed")
    whole = max(arrived - sent, 0.0)
    held = min(int.from_bytes(answer[PING_LEN:], "big") / 1e9, whole)
    return (whole - held) * 1000, max(read - sent, 0.0) * 1000


def answer_pings(channel: Channel) -> None:
    """The listener's side of :func:`_ping`: each ping back, with how long this end held it (ns)."""
    for _ in range(PINGS):
        ping, arrived = channel.recv_stamped()
        held = max(time.time() - arrived, 0.0)
        channel.send(ping + int(held * 1e9).to_bytes(PING_LEN, "big"))


def path_rtt(rtts_ms: list[float]) -> float | None:
    """The pair's round trip: the least of its pings. A busy core only adds to a round trip (the listener's thread
    woken late, the answer read late, and where the kernel gives no times of receipt those waits are in the
    figure), never takes from it, while a slow path (a longer route, a queue that stays full) is in every one. The
    median of five named pairs "late" on links that were all alike while the cores were busy with the job's start
    (benchmarks/link_bench.py, part 3)."""
    return round(min(rtts_ms), 4) if rtts_ms else None


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
