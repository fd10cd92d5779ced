"""benchmarks/stats.py: bootstrap intervals of medians and the met / missed / undecided verdict."""

from __future__ import annotations

import random

import pytest

from benchmarks import stats


def test_identical_constant_samples_give_ratio_one_and_a_point_interval() -> None:
    iv = stats.ratio_of_medians([2.0] * 8, [2.0] * 8, seed=1)
    assert (iv.estimate, iv.low, iv.high) == (1.0, 1.0, 1.0)
    assert stats.verdict(iv, 1.02).status == "met"


def test_identical_noisy_samples_give_ratio_one_and_a_tight_interval_around_it() -> None:
    rng = random.Random(7)
    xs = [10 + rng.gauss(0, 0.05) for _ in range(40)]
    iv = stats.ratio_of_medians(xs, list(xs), seed=3)
    assert iv.estimate == 1.0
    assert iv.low < 1.0 < iv.high
    assert iv.high - iv.low < 0.02
    assert stats.verdict(iv, 1.02).status == "met"


def test_a_clearly_slower_sample_is_missed() -> None:
    rng = random.Random(11)
    bare = [10 + rng.gauss(0, 0.1) for _ in range(12)]
    kit = [12 + rng.gauss(0, 0.1) for _ in range(12)]
    iv = stats.ratio_of_medians(bare, kit, seed=0)
    assert 1.15 < iv.low <= iv.estimate <= iv.high < 1.25
    v = stats.verdict(iv, 1.05)
    assert (v.status, v.text) == ("missed", "missed")


def test_overlapping_noisy_samples_are_undecided_with_their_interval() -> None:
    bare = [9.0, 11.0, 10.0, 12.0, 8.0, 10.5]
    kit = [10.0, 9.0, 12.0, 11.0, 10.2, 8.5]
    iv = stats.ratio_of_medians(bare, kit, seed=0)
    v = stats.verdict(iv, 1.02)
    assert iv.low < 1.02 < iv.high
    assert v.status == "undecided"
    assert v.text == f"undecided (95% interval [{iv.low:.3f}, {iv.high:.3f}])"


def test_difference_of_medians_and_its_verdict() -> None:
    bare = [3.0, 3.1, 2.9, 3.0, 3.05]
    kit = [4.0, 4.1, 3.9, 4.0, 4.05]
    iv = stats.difference_of_medians(bare, kit, seed=0)
    assert iv.estimate == pytest.approx(1.0)
    assert 0.8 <= iv.low <= iv.high <= 1.2
    assert stats.verdict(iv, 1.5).status == "met"
    assert stats.verdict(iv, 0.5).status == "missed"


def test_the_seed_makes_the_interval_reproducible_and_other_seeds_differ() -> None:
    rng = random.Random(2)
    a = [rng.uniform(1, 2) for _ in range(9)]
    b = [rng.uniform(1, 2) for _ in range(9)]
    assert stats.ratio_of_medians(a, b, seed=42) == stats.ratio_of_medians(a, b, seed=42)
    assert stats.ratio_of_medians(a, b, seed=42) != stats.ratio_of_medians(a, b, seed=43)


def test_median_interval_for_one_sided_targets() -> None:
    iv = stats.median_interval([0.21, 0.22, 0.2, 0.23, 0.22, 0.21], seed=0)
    assert iv.estimate == pytest.approx(0.215)
    assert 0.2 <= iv.low <= iv.estimate <= iv.high <= 0.23
    assert stats.verdict(iv, 0.5).status == "met"


def test_verdict_boundaries() -> None:
    assert stats.verdict(stats.Interval(1.0, 0.9, 1.02), 1.02).status == "met"  # at the target is within it
    assert stats.verdict(stats.Interval(1.1, 1.0201, 1.2), 1.02).status == "missed"
    assert stats.verdict(stats.Interval(1.0, 0.9, 1.03), 1.02).status == "undecided"


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        stats.ratio_of_medians([], [1.0])
    with pytest.raises(ValueError):
        stats.ratio_of_medians([0.0, 1.0], [1.0])
    with pytest.raises(ValueError):
        stats.median_interval([1.0], level=1.0)
