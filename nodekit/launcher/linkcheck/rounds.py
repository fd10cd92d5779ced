"""Pure: which pairs of nodes measure their link in which round, and what the whole check costs.

Every round is a set of disjoint pairs, so each node takes part in at most one transfer at a time and a measured
figure is that pair's alone. In a pair the lower rank connects to the higher one's listener.

Up to ``ALL_PAIRS_MAX`` nodes every pair is measured (the round-robin "circle" schedule: ``n - 1`` rounds for an
even ``n``, ``n`` for an odd one, every pair exactly once). Above it, all pairs would cost a round per node (half a
second each), so the check samples instead, in a number of rounds that does not depend on ``n``:

1. the *survey*: ``SURVEY_ROUNDS`` rounds of the circle schedule, chosen by the run's seed, so every node meets that
   many different partners (one fewer for an odd ``n``: its bye) and each run samples other pairs;
2. the *narrowing*: main decides on the survey, then every node of a flagged pair is measured again against a
   known-good node (every pair of its own fine) it has not met yet, in at most ``NARROW_ROUNDS`` rounds. A node
   that is slow again is the cause (it is then in every flagged pair of its own, ``verdict.suspects``); a pair whose
   two ends are fine with others is the path between them.

A pair-specific fault (one cable between two switches) is found where a measured pair crosses it: a path that many
pairs share is crossed by some of the ``n / 2`` pairs of every round, a single pair's path only when it is sampled.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Collection, Iterable

from nodekit.launcher.contract import LINK_SECONDS_DEFAULT as DEFAULT_SECONDS

Round = list[tuple[int, int]]

# Per pair and direction: the handshake, PINGS round trips, then DEFAULT_SECONDS of bulk transfer.
# What a round costs beyond its two transfers: two connections with their handshakes and pings, the barrier (a
# store poll) and the result's publication: 0.05 to 0.1 s measured (benchmarks/link_bench.py), the upper end.
ROUND_OVERHEAD_S = 0.1
# Every pair while that is cheap: 15 rounds at 16 nodes, 7.5 s at most with the default 0.2 s (5.7 s measured with
# 16 nodes on 2 cores, docs/benchmarks.md). Beyond it each node would add half a second.
ALL_PAIRS_MAX = 16
# The sample above ALL_PAIRS_MAX: four partners per node name a slow node four times over (and a late or lost one),
# and give the reference hundreds of pairs; two narrowing rounds re-test up to twice as many nodes as there are
# known-good ones. Six rounds: 3 s at most with the default 0.2 s, at any n.
SURVEY_ROUNDS = 4
NARROW_ROUNDS = 2
# The barrier between rounds is every node polling a counter on main's store, every BARRIER_POLL_S (the preflight's
# POLL_S) up to POLL_NODES nodes. Beyond it the poll slows in proportion, so that main's store answers at most 3,200
# polls a second whatever n is; a round then ends up to one poll later (0.16 s at 512 nodes), which estimate_s counts.
BARRIER_POLL_S = 0.02
POLL_NODES = 64


def rounds(n: int) -> list[Round]:
    """Every pair of ``n`` nodes, in rounds: each a list of ``(a, b)`` pairs with ``a < b``, disjoint within the
    round.

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


def circle_round(n: int, r: int) -> Round:
    """Round ``r`` (``0 <= r < m - 1``, ``m`` = ``n`` rounded up to even) of a circle schedule of ``n`` nodes,
    computed alone: node ``m - 1`` meets ``r``, and ``x`` meets ``y`` where ``x + y = 2r`` modulo ``m - 1`` (odd,
    so every pair falls in exactly one round). For an odd ``n``, node ``r`` has the bye."""
    m = n + n % 2
    k = m - 1
    pairs = [(r % k, k)] if k < n else []
    pairs += [((r + i) % k, (r - i) % k) for i in range(1, m // 2)]
    return sorted((min(a, b), max(a, b)) for a, b in pairs)


def survey(n: int, seed: bytes | int = 0) -> list[Round]:
    """The first phase: every pair (:func:`rounds`) up to ``ALL_PAIRS_MAX`` nodes, else ``SURVEY_ROUNDS`` rounds of
    the circle schedule chosen by ``seed`` (every node of the same run computes the same; another run, another
    sample)."""
    if n <= ALL_PAIRS_MAX:
        return rounds(n)
    chosen = random.Random(seed).sample(range(n + n % 2 - 1), SURVEY_ROUNDS)
    return [circle_round(n, r) for r in sorted(chosen)]


def sampled(n: int) -> bool:
    """Whether ``n`` nodes measure a sample of their pairs (survey and narrowing) instead of every pair."""
    return n > ALL_PAIRS_MAX


def narrowing(n: int, measured: Iterable[tuple[int, int]], flagged: Collection[tuple[int, int]]) -> list[Round]:
    """The second phase: every node of a ``flagged`` pair against a known-good node (one with a measured pair and
    every measured pair fine) that it has not met, each good node in one pair a round, at most ``NARROW_ROUNDS``
    rounds. The nodes in most flagged pairs go first (the likely causes, before their partners); nodes left over
    (more suspects than the rounds have good nodes for) keep the survey's evidence alone."""
    met: dict[int, set[int]] = {r: set() for r in range(n)}
    for a, b in measured:
        met[a].add(b)
        met[b].add(a)
    named = Counter(r for pair in flagged for r in pair)
    suspect = sorted(named, key=lambda r: (-named[r], r))
    good = [r for r in range(n) if met[r] and r not in named]
    out: list[Round] = []
    left = suspect
    for _ in range(NARROW_ROUNDS):
        free, this, rest = list(good), [], []
        for s in left:
            g = next((g for g in free if g not in met[s]), None)
            if g is None:
                rest.append(s)
                continue
            free.remove(g)
            this.append((min(s, g), max(s, g)))
        if not this:
            break
        out.append(sorted(this))
        left = rest
    return out


def plan_rounds(n: int) -> int:
    """How many rounds the check of ``n`` nodes takes at most (the survey, and the narrowing when it samples)."""
    if n < 2:
        return 0
    return SURVEY_ROUNDS + NARROW_ROUNDS if sampled(n) else len(rounds(n))


def partner(schedule: list[Round], round_no: int, rank: int) -> int | None:
    """``rank``'s partner in round ``round_no`` (None: a bye)."""
    for a, b in schedule[round_no]:
        if rank in (a, b):
            return b if rank == a else a
    return None


def estimate_s(n: int, seconds: float = DEFAULT_SECONDS) -> float:
    """The check's bound for ``n`` nodes: rounds x (both directions + the round's overhead, with the barrier's
    slower poll above ``POLL_NODES`` nodes)."""
    return plan_rounds(n) * (2 * seconds + ROUND_OVERHEAD_S + poll_s(n) - BARRIER_POLL_S)


def round_deadline_s(seconds: float, connect_s: float, drain_s: float) -> float:
    """The longest one round may take before a node stops waiting for the others: two connections (``connect_s``
    each, with their second try), two transfers with their drain, and slack for a loaded machine."""
    return math.ceil(2 * (connect_s + seconds + drain_s) + 5.0)


def poll_s(n: int) -> float:
    """How often each of ``n`` nodes polls the barrier (and the keys it waits for): ``BARRIER_POLL_S`` up to
    ``POLL_NODES`` nodes, then slower in proportion, so that main's store answers ``POLL_NODES / BARRIER_POLL_S``
    polls a second at most."""
    return BARRIER_POLL_S * max(1.0, n / POLL_NODES)
