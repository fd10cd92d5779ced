"""Pure: which pairs of nodes measure their link in which round, and what the whole check costs.

Every round is a set of disjoint pairs, so each node takes part in at most one transfer at a time and a measured
figure is that pair's alone (the round-robin "circle" schedule: ``n - 1`` rounds for an even ``n``, ``n`` for an
odd one, every pair exactly once). In a pair the lower rank connects to the higher one's listener.
"""

from __future__ import annotations

import math

from nodekit.launcher.contract import LINK_SECONDS_DEFAULT as DEFAULT_SECONDS

# Per pair and direction: the handshake, PINGS round trips, then DEFAULT_SECONDS of bulk transfer.
# What a round costs beyond its two transfers: two connections with their handshakes and pings, the barrier (a
# store poll) and the result's publication: 0.05 to 0.1 s measured (benchmarks/link_bench.py), the upper end.
ROUND_OVERHEAD_S = 0.1


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """The rounds for ``n`` nodes: each a list of ``(a, b)`` pairs with ``a < b``, disjoint within the round.

    >>> rounds(4)
    [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    """
    if n < 2:
        return []
    slots = list(range(n)) + ([-1] if n % 2 else [])  # -1: the bye of an odd count
    m = len(slots)
    out = []
    for _ in range(m - 1):
        pairs = [(slots[i], slots[m - 1 - i]) for i in range(m // 2)]
        out.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a >= 0 and b >= 0))
        slots = [slots[0], slots[-1], *slots[1:-1]]  # rotate all but the first
    return out


def partner(schedule: list[list[tuple[int, int]]], round_no: int, rank: int) -> int | None:
    """``rank``'s partner in round ``round_no`` (None: a bye)."""
    for a, b in schedule[round_no]:
        if rank in (a, b):
            return b if rank == a else a
    return None


def estimate_s(n: int, seconds: float = DEFAULT_SECONDS) -> float:
    """The check's expected duration for ``n`` nodes: rounds x (both directions + the round's overhead)."""
    return len(rounds(n)) * (2 * seconds + ROUND_OVERHEAD_S)


def round_deadline_s(seconds: float, connect_s: float, drain_s: float) -> float:
    """The longest one round may take before a node stops waiting for the others: two connections (``connect_s``
    each, with their second try), two transfers with their drain, and slack for a loaded machine."""
    return math.ceil(2 * (connect_s + seconds + drain_s) + 5.0)
