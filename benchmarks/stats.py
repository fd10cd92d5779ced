"""Statistics that hold on a noisy machine: medians, bootstrap 95% intervals, and a verdict that can say "undecided".

Pure and standard library only (benchmarks/decide.py uses it; tests/unit/bench/test_stats.py pins it).

The unit of repetition is one run of a job: each side (bare torchrun "a", nodekit "b") gives one number per run.
An interval comes from the percentile bootstrap: both samples are resampled with replacement, independently,
``resamples`` times; the statistic (ratio or difference of the medians, or one median) is computed for each; the
interval is the middle ``level`` of those values. With a ``seed`` the interval is reproducible.

A verdict against a target "statistic <= target" is "met" only when the whole interval is at or below the target,
"missed" only when the whole interval is above it, and otherwise "undecided": the data cannot tell, and more
repetitions (or a quieter machine) are needed. A point estimate alone never decides.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_RESAMPLES = 4000
DEFAULT_LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval ``[low, high]`` at ``level``."""

    estimate: float
    low: float
    high: float
    level: float = DEFAULT_LEVEL

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Verdict:
    """``status`` is "met", "missed" or "undecided"; ``text`` is what a table shows."""

    status: str
    interval: Interval
    target: float

    @property
    def text(self) -> str:
        if self.status == "undecided":
            return f"undecided ({self.interval.level:.0%} interval [{self.interval.low:.3f}, {self.interval.high:.3f}])"
        return self.status


def median(xs: Sequence[float]) -> float:
    """The median; ValueError on an empty sample."""
    if not xs:
        raise ValueError("median of an empty sample")
    return float(statistics.median(xs))


def _percentile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), ``q`` in [0, 1]."""
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def _bootstrap(
    samples: Sequence[Sequence[float]],
    stat: Callable[..., float],
    *,
    resamples: int,
    level: float,
    seed: int | None,
) -> Interval:
    for s in samples:
        if not s:
            raise ValueError("bootstrap of an empty sample")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = random.Random(seed)
    values = sorted(stat(*(rng.choices(s, k=len(s)) for s in samples)) for _ in range(resamples))
    tail = (1 - level) / 2
    return Interval(
        estimate=stat(*samples), low=_percentile(values, tail), high=_percentile(values, 1 - tail), level=level
    )


def _ratio(a: Sequence[float], b: Sequence[float]) -> float:
    return median(b) / median(a)


def _difference(a: Sequence[float], b: Sequence[float]) -> float:
    return median(b) - median(a)


def ratio_of_medians(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int | None = None,
) -> Interval:
    """median(b) / median(a) with its bootstrap interval (b: nodekit, a: bare torchrun). Values must be > 0."""
    if any(x <= 0 for x in a):
        raise ValueError("ratio of medians needs a positive baseline sample")
    return _bootstrap([a, b], _ratio, resamples=resamples, level=level, seed=seed)


def difference_of_medians(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int | None = None,
) -> Interval:
    """median(b) - median(a) with its bootstrap interval."""
    return _bootstrap([a, b], _difference, resamples=resamples, level=level, seed=seed)


def median_interval(
    xs: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int | None = None,
) -> Interval:
    """median(xs) with its bootstrap interval (for one-sided targets such as `nodekit --help` < 0.5 s)."""
    return _bootstrap([xs], median, resamples=resamples, level=level, seed=seed)


def verdict(interval: Interval, target: float) -> Verdict:
    """Against "statistic <= target": met when ``high <= target``, missed when ``low > target``, else undecided."""
    if interval.high <= target:
        status = "met"
    elif interval.low > target:
        status = "missed"
    else:
        status = "undecided"
    return Verdict(status=status, interval=interval, target=target)
