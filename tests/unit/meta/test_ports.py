"""tests/ports.py: a test's listener ports come from below the kernel's ephemeral range, free on every address."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from tests import ports


def test_the_ports_are_different_free_and_below_the_ephemeral_range() -> None:
    got = ports.quiet_ports(3)
    assert len(set(got)) == 3 and all(ports.LOW <= p < ports._ephemeral_low() for p in got)
    for p in got:  # each can be listened on at once, as the launcher binds it
        with socket.socket(socket.AF_INET6) as s:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", p))
            s.listen()


def test_a_port_another_process_holds_on_any_address_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # any port: quiet_ports is handed it first
    taken = held.getsockname()[1]
    free = ports.quiet_ports(1)[0]
    picks: Iterator[int] = iter([taken, taken, free])
    monkeypatch.setattr(random, "randint", lambda low, high: next(picks))
    try:
        assert ports.quiet_ports(1) == [free]
    finally:
        held.close()
