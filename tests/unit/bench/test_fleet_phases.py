"""benchmarks/fleet_phases.py on sample text of what the real producers write: `nodekit run`'s progress lines and
merged log (nodekit/cli/ui.py), a run record (nodekit/runs/) and examples/ddp/train.py --step-times."""

from __future__ import annotations

import pytest

from benchmarks import fleet_phases

HEAD = [
    (0.9, "> checking 2 host(s): SSH, Docker engine and Compose, GPUs, ports on main"),
    (1.2, "  node 0 (10.0.0.1): ok"),
    (1.6, "ok 2 host(s) ready (0.8 s)"),
    (2.1, "ok nk-demo:abc is already on every host"),
    (2.2, "> starting 2 node(s): compose/node-0.yaml, compose/node-1.yaml"),
    (3.4, "ok 2 node(s) started (2.6 s since the command)"),
    (4.0, "[node 1] nodekit-launcher: node 1 of 2"),
    (4.1, "[node 0] nodekit-launcher: node 0 of 2"),
    (9.0, "[node 0] ddp-demo: first step done (epoch 0)"),
    (9.1, "[node 1] more output"),
    (12.0, "ok 2 node(s) started (a later line: only the first counts)"),
]

RECORD = {
    "id": "r1",
    "nodes": [
        {"rank": 0, "phases": {"image": 1002.1, "started": 1003.3, "preflight": 1005.0, "rendezvous": 1006.5}},
        {"rank": 1, "phases": {"started": 1003.1, "preflight": 1005.5, "output": 1008.0, "end": 1020.0}},
        {"rank": 2},
    ],
}

STEP_TIMES = """\
# time.monotonic() seconds, rank 0
start 507.500000
init 508.250000
step 509.000000
start 600.000000
end 510.000000
"""


def test_head_phases_take_the_first_line_of_each_step() -> None:
    assert fleet_phases.head_phases(HEAD) == {
        "first line": 0.9,
        "hosts ready": 1.6,
        "image there": 2.1,
        "all started": 3.4,
    }
    shipped = [(5.0, "ok nk-demo:abc is on every host (image id verified)")]
    assert fleet_phases.head_phases(shipped) == {"image there": 5.0}
    assert fleet_phases.head_phases([(1.0, "[node 0] ok 2 host(s) ready")]) == {}  # a job's line is not the head's


def test_first_lines_per_node() -> None:
    assert fleet_phases.first_lines(HEAD) == {1: 4.0, 0: 4.1}


def test_node_phases_from_a_run_record_in_seconds_since_the_command() -> None:
    got = fleet_phases.node_phases(RECORD, 1000.0)
    assert got[0] == pytest.approx({"started": 3.3, "preflight": 5.0, "rendezvous": 6.5})  # "image" is the head's
    assert got[1] == pytest.approx({"started": 3.1, "preflight": 5.5, "output": 8.0})  # "end" is after the step
    assert got[2] == {}
    assert fleet_phases.node_phases({}, 1000.0) == {}


def test_train_marks_in_seconds_since_the_command_first_of_each() -> None:
    assert fleet_phases.train_marks(STEP_TIMES, 500.0) == pytest.approx({"main()": 7.5, "init": 8.25})
    assert fleet_phases.train_marks("# nothing yet\n", 500.0) == {}


def test_medians_and_spans() -> None:
    assert fleet_phases.medians([{"a": 1.0, "b": 5.0}, {"a": 3.0}, {"a": 2.0}]) == {"a": 2.0, "b": 5.0}
    per = fleet_phases.node_medians([{0: {"x": 1.0}, 1: {"x": 4.0}}, {"0": {"x": 3.0}, "1": {"x": 2.0}}])
    assert list(per) == ["0", "1"]  # JSON's string keys and ints are the same node
    assert per == {"0": {"x": 2.0}, "1": {"x": 3.0}}
    assert fleet_phases.span([]) == "-"
    assert fleet_phases.span([2.0]) == "2.0"
    assert fleet_phases.span([3.04, 3.0]) == "3.0"  # within 0.05 s: one value
    assert fleet_phases.span([4.5, 3.0, 3.9]) == "3.0 to 4.5"


def test_breakdown_row_has_a_cell_per_header_column() -> None:
    kit = {
        "first": 9.0,
        "head": fleet_phases.head_phases(HEAD),
        "lines": fleet_phases.first_lines(HEAD),
        "nodes": fleet_phases.node_phases(RECORD, 1000.0),
        "train": fleet_phases.train_marks(STEP_TIMES, 500.0),
    }
    slower = {**kit, "first": 11.0, "head": {}, "lines": {}, "nodes": {}, "train": {}}
    bare = {"first": 8.0, "train": {"main()": 6.0, "init": 7.0}}
    row = fleet_phases.breakdown_row(2, [kit, slower, kit], [bare])
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = fleet_phases.BREAKDOWN_HEADER.splitlines()[0].strip("|").split("|")
    assert len(cells) == len(header) == 16
    assert cells[:5] == ["2", "0.9", "1.6", "2.1", "3.4"]
    assert cells[5] == "4.0 to 4.1"  # the nodes' first lines, earliest to latest
    assert cells[6:10] == ["3.1 to 3.3", "5.0 to 5.5", "6.5", "8.0"]  # started, preflight, rendezvous, output
    assert cells[10:] == ["7.5", "8.2", "9.0", "6.0", "7.0", "8.0"]  # rank 0's marks, first step; bare's


def test_the_link_checks_named_pairs_are_counted_by_kind_once_each_from_every_nodes_lines() -> None:
    from itertools import combinations

    from nodekit.launcher.linkcheck.verdict import Endpoint, Pair, Transfer, decide, render

    def gbit(g: float) -> Transfer:
        return Transfer(bytes=int(g * 1e9 / 8 * 0.2), seconds=0.2)

    ends = [Endpoint(r, f"h{r}", f"10.0.0.{r + 1}", "eth0", 40000 + r) for r in range(5)]
    pairs = [
        Pair(a, b, gbit(0.5 if b == 4 else 9.4), gbit(9.4), rtt_ms=9.0 if (a, b) == (0, 1) else 0.1)
        for a, b in combinations(range(5), 2)
    ]
    report = render(decide(ends, pairs), matrix=True, started=True)
    merged = [f"[node {r}] {line}" for r in range(5) for line in report.splitlines()]
    assert fleet_phases.finding_kinds(merged) == {"slow": 4, "late": 1}
    assert fleet_phases.finding_kinds(["[node 0] nodekit link check: ok, 5 nodes"]) == {}
