"""The link check's plan at any n (pure): every pair up to ALL_PAIRS_MAX nodes, above it a survey of a few rounds
in which every node meets a few others and a narrowing that re-tests the nodes of named pairs against known-good
ones. Probe results are simulated as data (a link model per pair); the planning and the verdict are the real ones."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from itertools import combinations

import pytest

from nodekit.launcher.linkcheck.rounds import (
    ALL_PAIRS_MAX,
    BARRIER_POLL_S,
    NARROW_ROUNDS,
    SURVEY_ROUNDS,
    Round,
    circle_round,
    estimate_s,
    narrowing,
    plan_rounds,
    poll_s,
    rounds,
    survey,
)
from nodekit.launcher.linkcheck.verdict import Endpoint, LinkVerdict, Pair, Transfer, decide, narrow, render
from nodekit.launcher.preflight.exchange import POLL_S

SEED = b"run-id-of-this-run"
Link = Callable[[int, int], Pair]


def _t(g: float) -> Transfer:
    return Transfer(bytes=int(g * 1e9 / 8 * 0.2), seconds=0.2)


def ends(n: int) -> list[Endpoint]:
    return [Endpoint(r, f"h{r}", f"10.0.{r // 250}.{r % 250 + 1}", "eth0", 40000 + r) for r in range(n)]


def network(
    slow_nodes: frozenset[int] = frozenset(), slow_pairs: frozenset[tuple[int, int]] = frozenset(), lost: int = -1
) -> Link:
    """A link model: 9.4 Gbit/s (with a little spread) between good nodes, 0.1 on a slow node's or a slow pair's
    link, no connection at all to a lost node."""

    def link(a: int, b: int) -> Pair:
        if lost in (a, b):
            return Pair(a, b, Transfer(), Transfer(), error="cannot connect: timed out")
        g = 0.1 if slow_nodes & {a, b} or (a, b) in slow_pairs else 9.4 - (a + b) % 7 * 0.1
        return Pair(a, b, _t(g), _t(g * 1.01), rtt_ms=0.08)

    return link


def check(n: int, link: Link, seed: bytes = SEED) -> tuple[LinkVerdict, list[Round], list[Round]]:
    """What run.py does, with the probes replaced by ``link``: the survey, main's narrowing, the verdict."""
    first = survey(n, seed)
    measured = [link(a, b) for r in first for a, b in r]
    second = narrow(ends(n), measured) if n > ALL_PAIRS_MAX else []
    measured += [link(a, b) for r in second for a, b in r]
    return decide(ends(n), measured, seconds=0.2), first, second


def partners(schedule: list[Round]) -> dict[int, set[int]]:
    met: dict[int, set[int]] = {}
    for a, b in (p for r in schedule for p in r):
        met.setdefault(a, set()).add(b)
        met.setdefault(b, set()).add(a)
    return met


@pytest.mark.parametrize("n", [2, 3, 9, 16])
def test_up_to_the_threshold_every_pair_is_measured_as_before(n: int) -> None:
    assert survey(n, SEED) == rounds(n)
    assert plan_rounds(n) == len(rounds(n))


@pytest.mark.parametrize("n", range(2, 41))
def test_a_circle_round_computed_alone_belongs_to_a_schedule_of_every_pair_once(n: int) -> None:
    m = n + n % 2
    met = [p for r in range(m - 1) for p in circle_round(n, r)]
    assert sorted(met) == list(combinations(range(n), 2))


@pytest.mark.parametrize("n", [17, 18, 24, 33, 64, 101, 512, 4096])
def test_above_the_threshold_every_node_meets_a_few_others_in_a_bounded_number_of_rounds(n: int) -> None:
    first = survey(n, SEED)
    assert len(first) == SURVEY_ROUNDS
    for r in first:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes)) and all(a < b for a, b in r)
        assert len(r) == n // 2  # every node in every round, but an odd count's bye
    every = [p for r in first for p in r]
    assert len(every) == len(set(every))  # no pair twice: each round adds a new partner
    met = partners(first)
    assert set(met) == set(range(n))
    assert min(len(m) for m in met.values()) >= (SURVEY_ROUNDS if n % 2 == 0 else SURVEY_ROUNDS - 1)
    assert plan_rounds(n) == SURVEY_ROUNDS + NARROW_ROUNDS
    # 6 rounds x (2 x 0.2 s + 0.1 s) up to 64 nodes; beyond, the barrier's slower poll (at most one a round)
    assert estimate_s(n) == pytest.approx(6 * (0.5 + poll_s(n) - 0.02))
    assert estimate_s(n) <= 3.0 or n > 64
    assert estimate_s(n) < 4.0 or n > 512


def test_every_node_of_a_run_draws_the_same_sample_and_another_run_another() -> None:
    assert survey(64, SEED) == survey(64, bytes(SEED))
    assert survey(64, SEED) != survey(64, b"another-run")


def test_the_barrier_poll_keeps_mains_load_bounded() -> None:
    assert BARRIER_POLL_S == POLL_S  # the preflight's poll, the same below POLL_NODES nodes
    assert poll_s(16) == poll_s(64) == POLL_S
    assert 512 / poll_s(512) == 64 / POLL_S == 3200  # polls a second on main's store


@pytest.mark.parametrize("n", [24, 64, 512])
def test_a_slow_node_is_re_tested_against_a_good_node_and_named_alone(n: int) -> None:
    slow = n // 3
    v, first, second = check(n, network(slow_nodes=frozenset({slow})))
    assert v.suspects == (slow,)
    assert {(f.a, f.b) for f in v.findings} == {p for r in first + second for p in r if slow in p}
    # the narrowing re-tested the slow node and each of its partners, each against a node it had not met
    met = partners(first)
    retested = partners(second)
    assert met[slow] | {slow} <= set(retested)
    assert all(g not in met[s] for s in met[slow] | {slow} for g in retested[s])
    assert len(second) <= NARROW_ROUNDS
    assert "likely cause: node" in render(v, matrix=True)


@pytest.mark.parametrize("n", [24, 64, 512])
def test_a_slow_pair_is_named_as_a_pair_when_both_ends_are_fine_with_good_nodes(n: int) -> None:
    a, b = survey(n, SEED)[1][2]
    v, _first, second = check(n, network(slow_pairs=frozenset({(a, b)})))
    assert [(f.a, f.b, f.kind) for f in v.findings] == [(a, b, "slow")]
    assert v.suspects == ()  # neither end is the cause: both were fine against a known-good node
    assert {a, b} <= set(partners(second))
    assert "switch path between them" in render(v, matrix=True)


@pytest.mark.parametrize("n", [24, 64, 512])
def test_an_unreachable_node_is_named_and_refuses(n: int) -> None:
    lost = n - 1
    v, first, _second = check(n, network(lost=lost))
    assert v.suspects == (lost,)
    assert {f.kind for f in v.findings} == {"unreachable"} and v.refused
    assert len([f for f in v.findings if lost in (f.a, f.b)]) == len(partners(first)[lost]) + 1


def test_a_healthy_cluster_measures_no_narrowing_round() -> None:
    v, _first, second = check(64, network())
    assert second == [] and not v.findings


def test_the_narrowing_is_bounded_when_half_the_cluster_is_named() -> None:
    n = 64
    first = survey(n, SEED)
    flagged = list(first[0])  # every pair of one round: every node a suspect, no known-good node left
    assert narrowing(n, [p for r in first for p in r], flagged) == []
    half = first[0][: n // 4]  # a quarter of the pairs: half the nodes suspects, half good
    more = narrowing(n, [p for r in first for p in r], half)
    assert 1 <= len(more) <= NARROW_ROUNDS
    counts = Counter(x for r in more for p in r for x in p)
    suspects = {x for p in half for x in p}
    assert all(counts[s] == 1 for s in suspects)  # each suspect re-tested once
    for r in more:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))


def test_a_sampled_report_summarises_instead_of_a_matrix_of_every_pair() -> None:
    v, _first, _second = check(512, network(slow_nodes=frozenset({5})))
    text = render(v, matrix=True)
    assert "from 511" not in text and "a sample of" in text
    assert len(text.splitlines()) < 20


def test_the_nodes_in_most_named_pairs_are_re_tested_first_when_good_nodes_are_few() -> None:
    n = 24
    first = survey(n, SEED)
    measured = [p for r in first for p in r]
    slow = 20
    flagged = [p for p in measured if slow in p]  # the slow node's four pairs
    flagged += [p for p in first[0] if slow not in p][:8]  # and noise: eight more pairs, sixteen more nodes
    more = narrowing(n, measured, flagged)
    good = {r for r in range(n)} - {x for p in flagged for x in p}
    assert len(good) < len({x for p in flagged for x in p})  # not every suspect can be re-tested
    assert slow in {x for p in more[0] for x in p}  # the likely cause is, in the first round
