"""Addresses, routes, interfaces and ports as this host sees them.

Parsers (``parse_*``) and deciders (``interface_toward``, ``ports_in_spec``) are pure and take the text or facts as
arguments; the functions that run ``ip``/``ss``, read /proc and /sys or bind sockets only gather and hand over.
The doctor's TCP round trip to main (its protocol, client and listener) is :mod:`nodekit.doctor.handshake`.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import shutil
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodekit.errors import DeadlineError, UsageError
from nodekit.launcher.preflight.network import iface_addr
from nodekit.system import proc

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
            fix="give main's IP address as the other nodes reach it (nodekit up: --main 10.0.0.5; nodekit run: "
            'main = "10.0.0.5" in nodekit.toml)',
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


def default_address(route_text: str, links: Sequence[Link]) -> str | None:
    """This host's address on its default route, from ``ip -j route show default`` and its links: the address the
    other machines most likely reach it at (its first IPv4 address there, else its first global IPv6 one); None
    without a default route."""
    try:
        data = json.loads(route_text or "[]")
    except json.JSONDecodeError:
        return None
    devs = [str(r["dev"]) for r in data if isinstance(r, dict) and "dev" in r] if isinstance(data, list) else []
    for dev in devs:
        link = link_named(dev, links)
        addrs = [ipaddress.ip_address(a.split("%", 1)[0]) for a in (link.addrs if link else ())]
        usable = [a for a in addrs if not (a.is_loopback or a.is_link_local)]
        usable.sort(key=lambda a: a.version)
        if usable:
            return str(usable[0])
    return None


def default_address_here() -> str | None:
    """:func:`default_address` of this host (``ip route show default`` sends nothing); None without ``ip``."""
    if not shutil.which("ip"):
        return None
    try:
        done = proc.run(["ip", "-j", "route", "show", "default"], deadline=TOOL_S, what="ip route show", fix="")
    except DeadlineError:
        return None
    return default_address(done.stdout, links_here()) if done.returncode == 0 else None


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
        addr = iface_addr(name)
        links.append(Link(name=name, mtu=mtu(name), addrs=(addr,) if addr else ()))
    return links


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
