"""The bookkeeping every launcher listener keeps for connections in their handshake (pure: times handed in)."""

from __future__ import annotations

import pytest

from nodekit.launcher.store.pending import Pending


def test_a_newcomer_beyond_the_cap_pushes_out_the_oldest_and_only_the_oldest() -> None:
    p: Pending[str] = Pending(cap=3, within_s=5.0)
    assert [p.add(c, t) for t, c in enumerate("abc")] == [None, None, None]
    assert p.add("d", 3.0) == "a" and list(p) == ["b", "c", "d"]
    p.discard("c")  # admitted or closed: it leaves, and the next newcomer fits without pushing anyone
    assert p.add("e", 4.0) is None and list(p) == ["b", "d", "e"] and p.oldest() == "b"


def test_a_handshake_expires_its_whole_time_after_its_accept_however_late_its_last_byte() -> None:
    p: Pending[str] = Pending(cap=8, within_s=3.0)
    p.add("a", 0.0)
    p.add("b", 1.0)
    assert p.expired(2.99) == []
    assert p.expired(3.0) == ["a"] and list(p) == ["b"]
    assert p.expired(10.0) == ["b"] and len(p) == 0


def test_a_listener_holds_at_least_one_handshake() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Pending(cap=0, within_s=1.0)
