"""Addresses, routes and ports as this host sees them."""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
from dataclasses import dataclass

from nodekit.errors import UsageError


@dataclass(frozen=True)
class Route:
    """How this host reaches a destination: out of ``iface`` from ``src``."""

    dest: str
    iface: str
    src: str


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
    return ipaddress.ip_address(ip).is_loopback


def route_to(ip: str) -> Route | None:
    """The kernel's route toward ``ip``: interface and source address. None when there is no route."""
    if shutil.which("ip"):
        proc = subprocess.run(["ip", "-j", "route", "get", ip], capture_output=True, text=True, timeout=5)
        if proc.returncode == 0:
            parsed = parse_ip_route_get(proc.stdout)
            if parsed is not None:
                return parsed
        elif "unreachable" in proc.stderr.lower() or "network is unreachable" in proc.stderr.lower():
            return None
    return _route_by_socket(ip)


def parse_ip_route_get(text: str) -> Route | None:
    """Parse ``ip -j route get`` output (JSON)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not data:
        return None
    first = data[0]
    if "dev" not in first:
        return None
    return Route(dest=str(first.get("dst", "")), iface=str(first["dev"]), src=str(first.get("prefsrc", "")))


def _route_by_socket(ip: str) -> Route | None:
    # connect() on a UDP socket sends nothing; the kernel only picks the source address it would use.
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, 9))
        except OSError:
            return None
        src = str(s.getsockname()[0])
    iface = iface_of(src)
    return Route(dest=ip, iface=iface, src=src) if iface else None


def iface_of(addr: str) -> str | None:
    """The interface that carries ``addr`` locally."""
    if ipaddress.ip_address(addr).is_loopback:
        return "lo"
    if not shutil.which("ip"):
        return None
    proc = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=5)
    for link in json.loads(proc.stdout or "[]"):
        for info in link.get("addr_info", []):
            if info.get("local") == addr:
                return str(link["ifname"])
    return None


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    """True when something already listens on ``port`` (we try to bind it, as torchrun's store will)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Same option as torch's TCPStore server: a port in TIME_WAIT is free to it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> str | None:
    """Which process listens on ``port`` ("python3 (pid 1234)"), when ``ss`` can tell."""
    if not shutil.which("ss"):
        return None
    proc = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5)
    line = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    if 'users:(("' not in line:
        return None
    users = line.split('users:(("', 1)[1]
    name, _, rest = users.partition('"')
    pid = rest.split("pid=", 1)[1].split(",", 1)[0] if "pid=" in rest else "?"
    return f"{name} (pid {pid})"
