"""Facts about this node's network, resolved at container start on the node itself (standard library only).

The container runs on the host's network, so it sees the host's interfaces: the interface and own address toward
main are decided here, where they are true, not on the machine that rendered the compose file (a file rendered on
the head would otherwise carry the head's interface name to every node). A pinned value wins: when the compose
file sets GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME (``[nodes.R] iface``), nothing is resolved.

Main's address is an IP address, resolved once on the host (``nodekit up``), except in a Kubernetes pod
(``nodekit k8s``): there MASTER_ADDR is pod 0's DNS name, which the cluster publishes only once that pod exists, and
``NODEKIT_RESOLVE_MAIN=1`` asks for it to be resolved here, retried until NODEKIT_RDZV_TIMEOUT. The IP replaces the
name for the launcher and torchrun alike, so every later step sees an address, as with compose.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from nodekit.launcher.contract import Env

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
IFACE_VARS = (Env.GLOO_SOCKET_IFNAME, Env.NCCL_SOCKET_IFNAME)
RESOLVE_VAR = Env.RESOLVE_MAIN
RESOLVE_POLL_S = 1.0
RESOLVE_REPORT_S = 15.0
DEFAULT_RDZV_TIMEOUT_S = 180.0


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


def lookup(name: str) -> list[str]:
    """The addresses ``name`` resolves to (IPv4 first, in the resolver's order); OSError when it does not."""
    infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
    return sorted(addrs, key=lambda a: ipaddress.ip_address(a).version)


def is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def resolve_main(
    name: str,
    timeout_s: float,
    *,
    find: Callable[[str], list[str]] = lookup,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> str | None:
    """Main's IP address from its DNS name, asked every RESOLVE_POLL_S until ``timeout_s``; None if it never came.

    A loopback answer is not main: it is the /etc/hosts entry of a machine for its own name (127.0.1.1 on Debian),
    which every other node would see differently; it counts as no answer."""
    say = log or _say
    start = now()
    reported = start
    last = "no answer yet"
    while True:
        try:
            found = [a for a in find(name) if not ipaddress.ip_address(a).is_loopback]
            last = "only a loopback address" if not found else last
        except (OSError, UnicodeError) as e:
            found, last = [], str(e) or type(e).__name__
        if found:
            say(f"nodekit: main {name} is {found[0]} (resolved in {now() - start:.0f} s)")
            return found[0]
        t = now()
        if t - start >= timeout_s:
            say(f"nodekit: main's name {name} did not resolve in {timeout_s:g} s ({last})")
            return None
        if t - reported >= RESOLVE_REPORT_S:
            reported = t
            say(f"nodekit: waiting for main's name {name} to resolve ({last}; {t - start:.0f} s of {timeout_s:g})")
        sleep(min(RESOLVE_POLL_S, max(0.0, timeout_s - (t - start))))


def _say(line: str) -> None:
    print(line, flush=True)  # a pod's log must show it before the launcher's own start line


def _timeout(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get(Env.RDZV_TIMEOUT, "").strip() or DEFAULT_RDZV_TIMEOUT_S)
    except ValueError:
        return DEFAULT_RDZV_TIMEOUT_S  # parse_env reports the bad value
    return value if value > 0 else DEFAULT_RDZV_TIMEOUT_S


def resolve(env: Mapping[str, str], *, find: Callable[[str], list[str]] | None = None, **clock: Any) -> dict[str, str]:
    """The variables to add to ``env``: MASTER_ADDR's IP address when it is a name and NODEKIT_RESOLVE_MAIN=1 (a
    name that never resolves is left for the launcher's own parsing to report); then GLOO_SOCKET_IFNAME and
    NCCL_SOCKET_IFNAME toward MASTER_ADDR, unless the environment already pins either (then both take the pinned
    value) or MASTER_ADDR is not an IP address. Empty when nothing can be resolved: the libraries then choose.
    ``find`` and ``clock`` (``now``, ``sleep``, ``log`` of :func:`resolve_main`) are for tests."""
    out: dict[str, str] = {}
    master = env.get(Env.MASTER_ADDR, "").strip()
    if master and not is_address(master) and env.get(RESOLVE_VAR, "").strip() == "1":
        found = resolve_main(master, _timeout(env), find=find or lookup, **clock)
        if found is None:
            return {}
        out[Env.MASTER_ADDR] = master = found
    pinned = next((env[k].strip() for k in IFACE_VARS if env.get(k, "").strip()), None)
    if pinned is not None:
        return out | {k: pinned for k in IFACE_VARS if not env.get(k, "").strip()}
    if is_address(master):
        src = source_addr(master)
        name = iface_holding(src) if src else None
        if name:
            out |= dict.fromkeys(IFACE_VARS, name)
    return out
