"""Comparing the nodes' facts and the report every node prints: pure functions, facts passed in as data."""

from __future__ import annotations

from dataclasses import replace

from nodekit.launcher.preflight.stack import StackReport
from nodekit.launcher.preflight.verdict import Verdict, compare, decide, missing_message, render
from tests.factories import NODE0, NODE1, VERDICT_KW


def test_identical_stacks_are_ok() -> None:
    assert compare([NODE0, NODE1]) == []
    verdict = decide([NODE1, NODE0], **VERDICT_KW)
    assert verdict.status == "ok" and verdict.arrived == (0, 1) and verdict.missing == ()
    assert render(verdict) == (
        "nodekit preflight: ok, 2/2 nodes, identical stacks (image 3f2a9c1b0d4e, torch 2.13.0+cu128, cuda 12.8, "
        "python 3.11.2)"
    )


def test_a_different_torch_is_an_error_naming_node_and_field() -> None:
    other = replace(NODE1, torch="2.12.0+cu128", fingerprint="99aa00112233445566")
    verdict = decide([NODE0, other], **VERDICT_KW)
    assert verdict.status == "mismatch"
    assert [(d.field, d.severity) for d in verdict.differences] == [("fingerprint", "error"), ("torch", "error")]
    torch = verdict.differences[1]
    assert torch.values == ((0, "2.13.0+cu128"), (1, "2.12.0+cu128"))
    assert torch.describe() == "torch: 2.13.0+cu128 on node 0; 2.12.0+cu128 on node 1"


def test_gpu_count_is_a_note_when_heterogeneous_gpus_are_allowed_and_an_error_otherwise() -> None:
    # nproc_per_node = "auto": each node resolved it from its own GPUs, so WORLD_SIZE is unknown on both.
    big = replace(NODE0, world_size="")
    small = replace(NODE1, gpu_count=4, nproc_per_node=4, world_size="")
    allowed = decide([big, small], allow_heterogeneous_gpus=True, **VERDICT_KW)
    assert allowed.status == "ok"
    assert [(d.field, d.severity) for d in allowed.differences] == [("gpu_count", "note"), ("nproc_per_node", "note")]
    assert render(allowed).splitlines()[0] == "nodekit preflight: ok, 2/2 nodes, identical stacks, 2 note(s)"
    strict = decide([big, small], **VERDICT_KW)
    assert strict.status == "mismatch"
    assert {d.severity for d in strict.differences} == {"error"}


def test_image_id_is_compared_only_where_known() -> None:
    assert compare([NODE0, replace(NODE1, image_id="")]) == []
    assert [d.field for d in compare([NODE0, replace(NODE1, image_id="sha256:ffff")])] == ["image_id"]


def test_launch_settings_must_agree() -> None:
    fields = [d.field for d in compare([NODE0, replace(NODE1, nnodes=3, master_port=29600)])]
    assert fields == ["nnodes", "master_port"]


def test_the_mismatch_table() -> None:
    verdict = decide(
        [NODE0, replace(NODE1, torch="2.12.0+cu128", gpu_count=4)], allow_heterogeneous_gpus=True, **VERDICT_KW
    )
    assert render(verdict) == "\n".join(
        [
            "nodekit preflight: STACK MISMATCH, 1 error(s): no node starts training (exit 17)",
            "  node  host   address   fingerprint   torch         gpu_count",
            "  0     gpu-a  10.0.0.5  3f2a9c1b0d4e  2.13.0+cu128  8",
            "  1     gpu-b  10.0.0.6  3f2a9c1b0d4e  2.12.0+cu128  4",
            "  error  torch: 2.13.0+cu128 on node 0; 2.12.0+cu128 on node 1",
            "         fix: build once and ship that image to every node: `nodekit build`, then `nodekit push`",
            "  note   gpu_count: 8 on node 0; 4 on node 1",
        ]
    )


def test_missing_nodes_are_named() -> None:
    verdict = decide([NODE0], nnodes=3, timeout_s=30.0, main="10.0.0.5:29501")
    assert verdict.status == "missing" and verdict.missing == (1, 2)
    assert missing_message(verdict) == (
        "only 1 of 3 nodes arrived within 30 s: arrived 0; missing 1, 2. On each missing node: is its container "
        "running (`nodekit ps`), and can it reach main 10.0.0.5:29501 (`nodekit doctor --main 10.0.0.5 "
        "--node-rank <rank>`)?"
    )
    text = render(verdict)
    assert text.splitlines()[0] == "nodekit preflight: NODES MISSING, 1/3 arrived: no node starts training (exit 18)"
    assert "  1     (did not arrive)  -" in text and "  2     (did not arrive)  -" in text


def test_a_mismatch_wins_over_a_missing_node() -> None:
    verdict = decide([NODE0, replace(NODE1, python="3.12.1")], nnodes=3, timeout_s=30.0, main="m:1")
    assert verdict.status == "mismatch" and verdict.missing == (2,)
    assert "missing 2" in render(verdict)


def test_a_rank_claimed_twice() -> None:
    dup = replace(NODE1, hostname="gpu-c", address="10.0.0.7")
    verdict = decide([NODE0, NODE1], duplicates=[dup], **VERDICT_KW)
    assert verdict.status == "mismatch"
    text = render(verdict)
    assert "  1 (dup)  gpu-c" in text
    assert "node rank 1 claimed twice: gpu-b 10.0.0.6 and gpu-c 10.0.0.7" in text


def test_every_node_renders_the_same_text_from_the_published_json() -> None:
    verdict = decide([NODE0, replace(NODE1, cudnn="90100")], nnodes=3, timeout_s=5.0, main="10.0.0.5:29501")
    assert Verdict.from_json(verdict.to_json()) == verdict
    assert render(Verdict.from_json(verdict.to_json())) == render(verdict)


def test_facts_from_a_newer_or_older_launcher_still_parse() -> None:
    data = NODE0.to_json_dict() | {"future_field": "x"}
    del data["nccl"]
    parsed = StackReport.from_json_dict(data)
    assert parsed.nccl == "" and parsed.gpu_count == 8
    assert [d.field for d in compare([NODE1, parsed])] == ["nccl"]
