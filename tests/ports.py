"""Ports for a test's own listeners that no other process of the machine is handed meanwhile.

A port the kernel picked for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range, 32768 to 60999 by default), and so does the source port of every outgoing
connection any other test makes: between the pick and the listener's bind another connection can take it, and the
listener fails with "address already in use" (tests/unit/launcher/test_new_style.py did, once in a CI run). Below
that range the kernel hands out nothing by itself, so a port found free there stays free unless another test picks
the same one, which each pick also checks.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32767  # below the default ephemeral range, above the ports services are configured on


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return HIGH + 1


def _free_everywhere(port: int) -> bool:
    """Whether ``port`` can be bound on every address, IPv4 and IPv6 alike, as a launcher's listener binds it."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s6:
            s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s6.bind(("::", port))
    except OSError as e:
        if e.errno not in (97, 99):  # no IPv6 on this machine: judge by IPv4 alone
            return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s4:
            s4.bind(("0.0.0.0", port))
    except OSError:
        return False
    return True


def quiet_ports(n: int, tries: int = 200) -> list[int]:
    """``n`` different TCP ports, each free on every address, below the kernel's ephemeral range (see the module's
    text)."""
    high = min(HIGH, _ephemeral_low() - 1)
    found: list[int] = []
    for _ in range(tries):
        port = random.randint(LOW, high)
        if port not in found and _free_everywhere(port):
            found.append(port)
            if len(found) == n:
                return found
    raise RuntimeError(f"not {n} free ports in {LOW}..{high} after {tries} tries")
