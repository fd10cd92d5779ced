"""Addresses, routes, interfaces and ports as this host sees them, and the TCP round trip doctor makes to main.

Parsers (``parse_*``) and deciders (``interface_toward``, ``classify_connect_error``) are pure and take the text
or facts as arguments; the functions that run ``ip``/``ss`` or open sockets only gather and hand over.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import selectors
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from nodekit import proc
from nodekit.errors import DeadlineError, UsageError

TOOL_S = 5.0
"""ip and ss answer at once; a wedged netlink can hang them: then the kernel is asked another way."""
# Route types `ip route get` reports for destinations the kernel will not send to.
_NO_ROUTE_TYPES = frozenset({"unreachable", "blackhole", "prohibit", "throw"})


@dataclass(frozen=True)
class Route:
    """How this host reaches a destination: out of ``iface`` from ``src``. ``local``: the destination is here."""

    dest: str
    iface: str
    src: str
    local: bool = False


@dataclass(frozen=True)
class Link:
    """A network interface: name, MTU, whether it is up, and its addresses."""

    name: str
    mtu: int | None = None
    up: bool = True
    addrs: tuple[str, ...] = ()


def resolve(addr: str) -> str:
    """``addr`` as an IP address: an IP is returned as is, a host name is resolved (IPv4 first)."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UsageError(
            f"main address {addr!r} is neither an IP address nor a resolvable host name",
            fix="pass --main with main's IP address as the other nodes reach it (e.g. --main 10.0.0.5)",
        ) from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address (127.0.0.0/8, ::1); False for anything that is not an IP."""
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


# --- routes and interfaces: pure parsers and the decision ---------------------------------------------------


def parse_ip_route_get(text: str) -> Route | None:
    """Parse ``ip -j route get`` output (JSON). None for no answer or a route that drops the traffic."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    first = data[0]
    kind = str(first.get("type", "unicast"))
    if kind in _NO_ROUTE_TYPES or "dev" not in first:
        return None
    return Route(
        dest=str(first.get("dst", "")),
        iface=str(first["dev"]),
        src=str(first.get("prefsrc", "")),
        local=kind == "local",
    )


def parse_ip_addr(text: str) -> list[Link]:
    """Parse ``ip -j addr show`` output (JSON) into links."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    links = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or "ifname" not in item:
            continue
        addrs = tuple(str(a["local"]) for a in item.get("addr_info", []) if isinstance(a, dict) and "local" in a)
        mtu = item.get("mtu")
        up = "UP" in item.get("flags", []) or item.get("operstate") == "UP"
        links.append(Link(name=str(item["ifname"]), mtu=int(mtu) if mtu is not None else None, up=up, addrs=addrs))
    return links


def interface_toward(main_ip: str, route: Route | None, links: Sequence[Link]) -> Route | None:
    """The interface and source address this node uses toward main, decided from the kernel's route and links.

    A route of type local means main is this very machine, and the kernel answers ``lo``. For a loopback main
    (an all-local run) that is right. For main's own non-loopback address it is not: gloo and NCCL would bind
    ``lo`` and advertise 127.0.0.1 to workers on other machines. The interface carrying that address is the
    answer then, with that address as the source.
    """
    if route is None:
        return None
    if route.local and not is_loopback(main_ip):
        for link in links:
            if _same_ip(main_ip, link.addrs):
                return Route(dest=main_ip, iface=link.name, src=main_ip, local=True)
        return Route(dest=main_ip, iface=route.iface, src=main_ip, local=True)
    if not route.src:
        for link in links:
            if link.name == route.iface and link.addrs:
                return Route(dest=route.dest, iface=route.iface, src=link.addrs[0], local=route.local)
    return route


def link_named(name: str, links: Iterable[Link]) -> Link | None:
    return next((link for link in links if link.name == name), None)


def _same_ip(ip: str, addrs: Iterable[str]) -> bool:
    want = ipaddress.ip_address(ip)
    for a in addrs:
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(a.split("%", 1)[0]) == want:
                return True
    return False


# --- routes and interfaces: gathering -----------------------------------------------------------------------


def route_to(ip: str, links: Sequence[Link] | None = None) -> Route | None:
    """This host's route toward ``ip`` (interface and source address); None when the kernel has none.

    ``ip route get`` sends nothing; without iproute2 the kernel is asked through an unconnected UDP socket.
    ``links`` saves a second look at the interfaces when the caller has them already.
    """
    links = links_here() if links is None else links
    if shutil.which("ip"):
        try:
            done = proc.run(["ip", "-j", "route", "get", ip], deadline=TOOL_S, what="ip route get", fix="")
        except DeadlineError:  # a hung `ip` (seen with a wedged netlink): ask the kernel by socket
            return interface_toward(ip, _route_by_socket(ip, links), links)
        if done.returncode == 0:
            return interface_toward(ip, parse_ip_route_get(done.stdout), links)
        lowered = done.stderr.lower()
        if "unreachable" in lowered or "no route" in lowered or "prohibited" in lowered:
            return None
    return interface_toward(ip, _route_by_socket(ip, links), links)


def _route_by_socket(ip: str, links: Sequence[Link]) -> Route | None:
    # connect() on a UDP socket sends nothing; the kernel only picks the source address it would use.
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError:
            return None
        src = str(s.getsockname()[0])
    if is_loopback(src):
        return Route(dest=ip, iface="lo", src=src, local=True)
    iface = next((link.name for link in links if _same_ip(src, link.addrs)), None)
    return Route(dest=ip, iface=iface, src=src, local=_same_ip(ip, [src])) if iface else None


def links_here() -> list[Link]:
    """This host's interfaces: from ``ip -j addr show``, else from /sys/class/net and ioctl (IPv4 only)."""
    if shutil.which("ip"):
        try:
            done = proc.run(["ip", "-j", "addr", "show"], deadline=TOOL_S, what="ip addr show", fix="")
        except DeadlineError:
            done = proc.Result((), 1, "", "")
        if done.returncode == 0:
            return parse_ip_addr(done.stdout)
    links = []
    for _, name in socket.if_nameindex():
        addr = _ipv4_by_ioctl(name)
        links.append(Link(name=name, mtu=mtu(name), addrs=(addr,) if addr else ()))
    return links


def _ipv4_by_ioctl(name: str) -> str | None:
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def mtu(iface: str, root: Path = Path("/")) -> int | None:
    try:
        return int((root / "sys" / "class" / "net" / iface / "mtu").read_text().strip())
    except (OSError, ValueError):
        return None


def local_port_range(root: Path = Path("/")) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (where NCCL's and gloo's data sockets land)."""
    try:
        lo, hi = (root / "proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return None


def reserved_ports(root: Path = Path("/")) -> str | None:
    try:
        return (root / "proc/sys/net/ipv4/ip_local_reserved_ports").read_text().strip()
    except OSError:
        return None


def ports_in_spec(spec: str) -> set[int]:
    """The ports of a sysctl port list such as ``29500-29501,8080`` (ip_local_reserved_ports)."""
    ports: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        with contextlib.suppress(ValueError):
            ports.update(range(int(lo), int(hi or lo) + 1))
    return ports


# --- ports on this host -------------------------------------------------------------------------------------


def port_in_use(port: int, host: str = "") -> bool:
    """True when ``port`` cannot be bound the way torch's TCPStore server binds it (the rendezvous would fail).

    With ``host`` empty, the IPv4 wildcard and, where the kernel has IPv6, the IPv6 wildcard are both tried:
    the store binds ``::`` when it can, so a listener on ``[::1]`` alone blocks it too. SO_REUSEADDR is set as
    the store sets it, so a port whose old connections sit in TIME_WAIT counts as free.
    """
    if host:
        targets = [(socket.AF_INET6 if ":" in host else socket.AF_INET, host)]
    else:
        targets = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")]
    for family, addr in targets:
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 in this kernel: nothing can hold an IPv6 port either
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # Only the IPv6 side here: the IPv4 side was tried on its own.
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((addr, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
                # EADDRNOTAVAIL (IPv6 disabled), EACCES (a port below 1024 without root): not "in use".
    return False


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket as ``ss -tlnp`` shows it."""

    local: str
    port: int
    process: str | None = None
    pid: int | None = None

    def describe(self) -> str:
        if self.process is None:
            return f"a process this user cannot see (on {self.local}; sudo ss -tlnp 'sport = :{self.port}')"
        pid = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return f"{self.process} ({pid})"


def parse_ss_listeners(text: str) -> list[Listener]:
    """Parse ``ss -Htlnp`` lines: ``LISTEN 0 128 0.0.0.0:29500 0.0.0.0:* users:(("python3",pid=12,fd=3))``."""
    found = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] != "LISTEN":
            continue
        local, _, port_text = cols[3].rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            continue
        process = pid = None
        if 'users:(("' in line:
            users = line.split('users:(("', 1)[1]
            process, _, rest = users.partition('"')
            if "pid=" in rest:
                with contextlib.suppress(ValueError):
                    pid = int(rest.split("pid=", 1)[1].split(",", 1)[0].rstrip(")"))
        found.append(Listener(local=local.strip("[]"), port=port, process=process, pid=pid))
    return found


def parse_proc_net_tcp(text: str) -> dict[int, list[int]]:
    """Listening sockets in /proc/net/tcp{,6} text: port -> socket inodes."""
    found: dict[int, list[int]] = {}
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != "0A":  # 0A = TCP_LISTEN
            continue
        with contextlib.suppress(ValueError):
            found.setdefault(int(cols[1].rsplit(":", 1)[1], 16), []).append(int(cols[9]))
    return found


def port_holder(port: int) -> str | None:
    """Which process listens on ``port`` ("python3 (pid 1234)"), from ``ss``, else from /proc; None if unknown."""
    if shutil.which("ss"):
        try:
            done = proc.run(["ss", "-Htlnp", f"sport = :{port}"], deadline=TOOL_S, what="ss", fix="")
        except DeadlineError:
            return _holder_from_proc(port)
        listeners = [x for x in parse_ss_listeners(done.stdout) if x.port == port]
        named = [x for x in listeners if x.process is not None]
        if named or listeners:
            return (named or listeners)[0].describe()
    return _holder_from_proc(port)


def _holder_from_proc(port: int, proc_root: Path = Path("/proc")) -> str | None:
    inodes: set[int] = set()
    for table in ("net/tcp", "net/tcp6"):
        with contextlib.suppress(OSError):
            inodes.update(parse_proc_net_tcp((proc_root / table).read_text()).get(port, []))
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid_dir in proc_root.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    name = (pid_dir / "comm").read_text().strip()
                    return f"{name} (pid {pid_dir.name})"
    return None


# --- the TCP round trip between doctors ---------------------------------------------------------------------
# Main's doctor speaks first: a line with its host name and clock. A worker only answers after it has read that
# greeting, so probing a port that a running job's store holds never sends that store anything it cannot parse.

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
