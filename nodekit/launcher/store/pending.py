"""Connections still in their handshake, as a listener of the launcher keeps them: bounded in number and in time.

Anyone who can reach a port can open connections to it and never finish a handshake (send nothing, or one byte now
and then). A listener that waited for them per read, or refused newcomers while full, would let such strangers keep
the real peer out. So every listener that admits by the handshake of ``auth.py`` (main's preflight store,
``server.py``, and each node's link check listener, ``linkcheck/listener.py``) keeps its unauthenticated
connections here: in arrival order, at most ``cap`` of them (a newcomer pushes out the oldest, so strangers can
only push each other out, and a real peer, whose handshake takes a round trip, is in and out long before ``cap``
newer strangers could push it), and each for ``within_s`` in all, from its accept to its last handshake byte, however
its bytes trickle. Pure bookkeeping: the listener closes what this hands back. Standard library only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


class Pending(Generic[C]):
    """Unauthenticated connections, oldest first; times are handed in (``time.monotonic()`` in the listeners)."""

    def __init__(self, cap: int, within_s: float) -> None:
        if cap < 1:
            raise ValueError(f"a listener holds at least one handshake (cap {cap})")
        self.cap, self.within_s = cap, within_s
        self._born: dict[C, float] = {}  # in arrival order: the first is the oldest

    def add(self, conn: C, now: float) -> C | None:
        """Keep ``conn``, accepted at ``now``. When that makes one too many: the oldest, no longer kept, which the
        caller closes."""
        pushed = self.oldest() if len(self._born) >= self.cap else None
        if pushed is not None:
            del self._born[pushed]
        self._born[conn] = now
        return pushed

    def discard(self, conn: C) -> None:
        """``conn`` left the handshake (admitted, refused or closed); nothing when it was not kept."""
        self._born.pop(conn, None)

    def oldest(self) -> C | None:
        return next(iter(self._born), None)

    def expired(self, now: float) -> list[C]:
        """Those whose handshake has run for ``within_s`` by ``now``, no longer kept: the caller closes them."""
        out = []
        for conn, born in self._born.items():
            if now - born < self.within_s:
                break  # kept in arrival order: every later one is younger
            out.append(conn)
        for conn in out:
            del self._born[conn]
        return out

    def __len__(self) -> int:
        return len(self._born)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._born))
