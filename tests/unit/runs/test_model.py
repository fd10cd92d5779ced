"""A run record as data: which phase a line marks, signals from exit codes, JSON round trips, states."""

from __future__ import annotations

import pytest

from nodekit.launcher.contract import PREFLIGHT_OK, RENDEZVOUS_DONE
from nodekit.runs.model import Lines, NodeRecord, RunRecord, ordered, phase_of_line, signal_of


@pytest.mark.parametrize(
    ("line", "phase"),
    [
        (f"{PREFLIGHT_OK}, 3/3 nodes, identical stacks (image abc, torch 2.13.0+cpu, cpu, python 3.11.2)", "preflight"),
        (f"{RENDEZVOUS_DONE}", "rendezvous"),
        (f"{RENDEZVOUS_DONE} (restart 1)", "rendezvous"),
        ("nodekit ddp-demo: node 0/3 | 1 proc/node | world 3", None),
        ("nodekit: world 4 (2 + 2 processes)", None),
        ("ddp-demo: first step done (epoch 0)", "output"),
        ("Traceback (most recent call last):", "output"),
    ],
)
def test_the_phase_a_line_marks(line: str, phase: str | None) -> None:
    assert phase_of_line(line) == phase


def test_a_signal_is_named_from_the_shells_exit_code() -> None:
    assert [signal_of(c) for c in (137, 143, 130, 129, 0, 1, 19, None, 300)] == [
        "SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "", "", "", "", ""
    ]  # fmt: skip


def record(**kw: object) -> RunRecord:
    base: dict[str, object] = dict(
        id="20261124-153012-3f2a", command="run", project="/p", started=100.0, pid=1, settings={}, settings_digest="d",
        nodes=[NodeRecord(0, "a", {"started": 101.0, "image": 100.5}), NodeRecord(1, "b")],
    )  # fmt: skip
    return RunRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_a_record_survives_json_and_ignores_what_a_newer_nodekit_added() -> None:
    r = record(exit_code=137, failed_rank=1, signal="SIGKILL", ended=160.0, log_tail=["x"])
    data = r.to_dict()
    data["from_the_future"] = 1
    data["nodes"][0]["also_new"] = True
    again = RunRecord.from_dict(data)
    assert again == r
    assert again.failed_host == "b" and again.duration(0) == 60.0


def test_states() -> None:
    assert record().state(lambda pid: True) == "running"
    assert record().state(lambda pid: False) == "vanished"
    assert record(detached=True).state(lambda pid: False) == "detached"
    assert record(ended=1.0, exit_code=0).state(lambda pid: False) == "ok"
    assert record(ended=1.0, exit_code=137, failed_rank=1).state(lambda pid: False) == "failed"
    assert record(ended=1.0, exit_code=130, signal="SIGINT").state(lambda pid: False) == "interrupted"


def test_phases_come_in_their_order_and_only_those_reached() -> None:
    assert ordered({"output": 3.0, "image": 1.0, "started": 2.0}) == [("image", 1.0), ("started", 2.0), ("output", 3.0)]


def _facts(rank: int, gpus: int) -> object:
    from nodekit.launcher.preflight.stack import StackReport

    return StackReport(rank=rank, hostname=f"h{rank}", address=f"10.0.0.{rank}", fingerprint="f" * 64, image_id="i",
                     python="3.11", torch="2.13.0", cuda="", cudnn="", nccl="", driver="", gpu_model="", gpu_count=gpus,
                     nodekit="1", nnodes=3, nproc_per_node=1, world_size="3", master_port=29500, mode="torchrun",
                     name="demo")  # fmt: skip


def test_the_launchers_multi_line_reports_are_not_the_jobs_first_output() -> None:
    """What the launcher prints, rendered by its own code: a preflight report with notes (a table and note lines,
    then its timing line) and a data check report; the job's first line comes after them."""
    from nodekit.launcher.datacheck.compare import Published, compare_nodes
    from nodekit.launcher.preflight.verdict import decide, render

    verdict = decide([_facts(r, r) for r in range(3)], nnodes=3, timeout_s=60, main="10.0.0.0:29501",
                     allow_heterogeneous_gpus=True)  # fmt: skip
    report = render(verdict)
    assert verdict.status == "ok" and verdict.notes and report.count("\n") >= 4
    same = Published(text="a 1\n", files=1, digest="d" * 64, error="")
    _, data = compare_nodes([("/data", "sizes")], {r: {"/data": same} for r in range(3)})
    printed = [
        "nodekit demo: node 1/3 | 1 proc/node",
        *f"{report}\n(preflight 1.1 s, 20 ms once every node was there)".splitlines(),
        *data.splitlines(),
        RENDEZVOUS_DONE,
        "  epoch 0: indented output of the job's own",
        "Traceback (most recent call last):",
    ]
    lines = Lines()
    phases = [lines.phase(1, text) for text in printed]
    assert [p for p in phases if p] == ["preflight", "rendezvous", "output", "output"]
    assert phases.index("output") == len(printed) - 2
    assert lines.phase(2, "  a node's own first line, indented") == "output", "each node is read on its own"
