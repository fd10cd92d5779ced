"""Heterogeneous nodes as configured: per-node process and GPU counts declared in nodekit.toml are the job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from nodekit.config.settings import NodeOverride, load
from nodekit.errors import ConfigError
from nodekit.launcher.config import EnvError, parse_env
from nodekit.launcher.plan import start_line
from nodekit.launcher.preflight.verdict import Declared, decide, render
from tests.factories import CPU_NODE, GPU_NODE, LAUNCH_ENV, NODE0, NODE1, VERDICT_KW, rendered, settings


def _env(kw: dict[str, object], rank: int, facts: object = CPU_NODE) -> dict[str, str]:
    doc = yaml.safe_load(rendered(settings(**kw), rank, facts))  # type: ignore[arg-type]
    return dict(doc["services"]["train"]["environment"])


def test_world_size_is_the_sum_and_each_node_gets_its_own_count() -> None:
    kw: dict[str, object] = {"nproc_per_node": 1, "nodes": {1: NodeOverride(nproc_per_node=2)}}
    node0, node1 = _env(kw, 0), _env(kw, 1)
    assert (node0["NPROC_PER_NODE"], node1["NPROC_PER_NODE"]) == ("1", "2")
    assert node0["WORLD_SIZE"] == node1["WORLD_SIZE"] == "3"
    assert node0["NODEKIT_NPROC_DECLARED"] == node1["NODEKIT_NPROC_DECLARED"] == "0:1,1:2"
    cfg = parse_env({**LAUNCH_ENV, "NPROC_PER_NODE": "2", "WORLD_SIZE": "3"})
    assert "| 2 proc/node | world 3 |" in start_line(cfg)


def test_auto_nodes_leave_the_world_to_the_preflight_and_declare_auto() -> None:
    kw: dict[str, object] = {"nodes": {0: NodeOverride(gpus=4)}}
    env = _env(kw, 1, GPU_NODE)
    assert "WORLD_SIZE" not in env
    assert env["NODEKIT_NPROC_DECLARED"] == "0:auto,1:auto" and env["NODEKIT_GPUS_DECLARED"] == "0:4"
    doc = yaml.safe_load(rendered(settings(**kw), 0, GPU_NODE))
    devices = doc["services"]["train"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["count"] == 4  # the node's declared GPUs, not all of the host's
    line = start_line(parse_env({k: v for k, v in {**LAUNCH_ENV, "NPROC_PER_NODE": "2"}.items() if k != "WORLD_SIZE"}))
    assert "| 2 proc/node | world counted in preflight |" in line and "?" not in line


def _one_plus_two() -> tuple[object, object]:
    cpu0 = replace(NODE0, gpu_count=0, gpu_model="", nproc_per_node=1, world_size="3")
    return cpu0, replace(cpu0, rank=1, hostname="gpu-b", address="10.0.0.6", nproc_per_node=2)


def test_declared_differences_pass_as_notes() -> None:
    a, b = _one_plus_two()
    declared = Declared(nproc=((0, "1"), (1, "2")))
    verdict = decide([a, b], declared=declared, **VERDICT_KW)  # type: ignore[list-item]
    assert verdict.status == "ok"
    assert [(d.field, d.severity) for d in verdict.differences] == [("nproc_per_node", "note")]


def test_undeclared_differences_are_refused_naming_the_node() -> None:
    a, b = _one_plus_two()
    verdict = decide([a, b], declared=Declared(nproc=((0, "1"), (1, "1"))), **VERDICT_KW)  # type: ignore[list-item]
    assert verdict.status == "mismatch"
    report = render(verdict)
    assert "nproc_per_node: 1 on node 0; 2 on node 1" in report
    assert "not declared for node(s) 1" in report and "[nodes.<rank>] nproc_per_node" in report
    assert "NODEKIT_ALLOW_HETEROGENEOUS_GPUS" not in report


def test_auto_on_nodes_with_different_gpus_is_the_job_once_each_reported() -> None:
    a = replace(NODE0, gpu_count=4, nproc_per_node=4, world_size="")
    b = replace(NODE1, gpu_count=2, nproc_per_node=2, world_size="")
    assert decide([a, b], declared=Declared(nproc=((0, "auto"), (1, "auto"))), **VERDICT_KW).status == "ok"
    declared_gpus = Declared(nproc=((0, "4"), (1, "2")), gpus=((0, 4), (1, 2)))
    assert decide([a, b], declared=declared_gpus, **VERDICT_KW).status == "ok"
    wrong = Declared(nproc=((0, "4"), (1, "2")), gpus=((0, 4), (1, 4)))
    verdict = decide([a, b], declared=wrong, **VERDICT_KW)
    assert verdict.status == "mismatch" and "not declared for node(s) 1" in render(verdict)


def test_declarations_parse_and_bad_ones_name_the_variable() -> None:
    cfg = parse_env({**LAUNCH_ENV, "NODEKIT_NPROC_DECLARED": "0:4,1:auto", "NODEKIT_GPUS_DECLARED": "0:4"})
    assert cfg.nproc_declared == ((0, "4"), (1, "auto")) and cfg.gpus_declared == ((0, 4),)
    for bad in ("0:x", "0-4", "5:1"):
        with pytest.raises(EnvError, match="NODEKIT_NPROC_DECLARED"):
            parse_env({**LAUNCH_ENV, "NODEKIT_NPROC_DECLARED": bad})


def test_a_node_override_outside_the_ranks_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "nodekit.toml").write_text('script = "t.py"\nnnodes = 2\n[nodes.2]\nnproc_per_node = 1\n')
    with pytest.raises(ConfigError, match=r"\[nodes.2\] is outside node ranks 0..1") as e:
        load(tmp_path / "nodekit.toml")
    assert "\n" not in str(e.value)
