"""benchmarks/stamp_cost.py: its section from given runs (pure), and one tiny real run of each side, whose round
trips show the times of receipt at work: the path's, without the two processes' handling, is the shorter."""

from __future__ import annotations

import pytest

from benchmarks import stamp_cost
from nodekit.launcher.linkcheck.probe import STAMPS


def runs(off: list[float], on: list[float]) -> dict[bool, list[dict[str, float]]]:
    def side(gbits: list[float], wall: float, rtt: float) -> list[dict[str, float]]:
        return [{"wall_us": wall, "cpu_us": wall / 2, "rtt_ms": rtt, "gbit": g} for g in gbits]

    return {False: side(off, 100.0, 0.075), True: side(on, 104.0, 0.017)}


def test_the_section_gives_both_sides_and_their_difference() -> None:
    text = stamp_cost.section(runs([35.0, 36.0, 34.0], [34.0, 35.5, 36.5]), 3, 4000, 1.0)
    assert text.startswith(stamp_cost.TITLE)
    assert "| not asked for (before) | 100.0 (100.0, 100.0, 100.0) |" in text
    assert "| asked for (now) | 104.0 (104.0, 104.0, 104.0) |" in text
    assert "+4.0 µs a ping in wall time, +2.0 µs of CPU, +1.4% in bulk rate" in text
    assert "(the two sides' runs overlap: within their spread)" in text
    assert "each frame included (58 µs here" in text
    assert "20 µs of wall time a pair at most" in text


def test_runs_apart_are_said_to_be_apart() -> None:
    text = stamp_cost.section(runs([35.0, 36.0], [20.0, 21.0]), 2, 4000, 1.0)
    assert "(the two sides' runs do not overlap)" in text


@pytest.mark.skipif(not STAMPS, reason="the kernel gives times of receipt on Linux only")
def test_with_the_times_the_round_trip_is_the_paths_without_the_processes_handling() -> None:
    on, off = stamp_cost.pings(200, True), stamp_cost.pings(200, False)
    assert 0 < on["rtt_ms"] < 0.8 * off["rtt_ms"], (on, off)  # 17 against 74 µs, idle
    assert stamp_cost.bulk(0.1, True) > 0
