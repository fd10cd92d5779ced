"""Who prints what of the link check's report (issue 46): main prints the matrix; every other node its headline,
the findings and the fix only (every node printing the matrix made 45 lines for 3 nodes in the merged log)."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest

from nodekit.launcher import checks
from nodekit.launcher.linkcheck.verdict import Endpoint, Pair, Transfer, decide
from tests.factories import cfg


def _verdict_with_a_slow_node() -> Any:
    ends = [Endpoint(r, f"h{r}", f"172.31.250.{10 + r}", "eth0", 40000 + r) for r in range(3)]
    pairs = []
    for a, b in combinations(range(3), 2):
        g = 0.05 if 2 in (a, b) else 9.4
        t = Transfer(bytes=int(g * 1e9 / 8 * 0.2), seconds=0.2)
        pairs.append(Pair(a, b, t, t, rtt_ms=0.1))
    return decide(ends, pairs, seconds=0.2, took_s=1.0)


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_only_main_prints_the_matrix_and_every_node_the_findings(
    rank: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    verdict = _verdict_with_a_slow_node()
    assert verdict.findings, "the slow node must be named for this test to mean anything"
    monkeypatch.setattr(checks.links, "run", lambda store, job, run_id: verdict)
    checks._check_links(cfg(rank, 3), object(), None, started=False)  # type: ignore[arg-type]
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "nodekit link check: WARNING" in text and "fix:" in text
    assert ("Gbit/s" in text and "from 2" in text) == (rank == 0), text
