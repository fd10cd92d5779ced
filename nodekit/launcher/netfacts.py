"""Facts about this node's network, resolved at container start on the node itself (standard library only).

The container runs on the host's network, so it sees the host's interfaces: the interface and own address toward
main are decided here, where they are true, not on the machine that rendered the compose file (a file rendered on
the head would otherwise carry the head's interface name to every node). A pinned value wins: when the compose
file sets GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME (``[nodes.R] iface``), nothing is resolved.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
IFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def source_addr(master_addr: str, port: int = 9) -> str | None:
    """The address this host uses toward ``master_addr``: what the kernel's route picks for a UDP connect (which
    sends nothing). None when there is no route."""
    family = socket.AF_INET6 if ipaddress.ip_address(master_addr).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, port))
            return str(s.getsockname()[0])
    except OSError:
        return None


def iface_addr(name: str) -> str | None:
    """The IPv4 address of interface ``name`` (SIOCGIFADDR), or None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def iface_holding(addr: str) -> str | None:
    """The interface that holds ``addr``; None when none does (IPv6, or the address left meanwhile)."""
    for _index, name in socket.if_nameindex():
        if iface_addr(name) == addr:
            return name
    return None


def resolve(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env``: GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME toward MASTER_ADDR, unless the
    environment already pins either (then both take the pinned value) or MASTER_ADDR is not an IP address (the
    launcher's own parsing reports that). Empty when nothing can be resolved: the libraries then choose."""
    pinned = next((env[k].strip() for k in IFACE_VARS if env.get(k, "").strip()), None)
    if pinned is not None:
        return {k: pinned for k in IFACE_VARS if not env.get(k, "").strip()}
    master = env.get("MASTER_ADDR", "").strip()
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(master)
        src = source_addr(master)
        name = iface_holding(src) if src else None
        if name:
            return dict.fromkeys(IFACE_VARS, name)
    return {}
