"""The whole slice on a real engine: two nodes of the example DDP job on this machine (main 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import GOLDEN
from tests.integration.helpers import down, nodekit, wait_node

pytestmark = pytest.mark.docker


@pytest.mark.smoke
def test_two_nodes_train_to_identical_parameters(ddp_project: Path) -> None:
    config = ddp_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29620"]
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
        assert bg.returncode == 0, bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config)
        assert fg.returncode == 0, fg.stdout + fg.stderr
        assert wait_node(config, 1) == 0
    finally:
        down(config)
    assert "[node 0] " in fg.stdout  # the job's lines are prefixed with the node
    result = json.loads((ddp_project / "outputs" / "result.json").read_text())
    assert result["nnodes"] == 2 and result["world_size"] == 2
    assert len(result["checksums"]) == 2 and len(set(result["checksums"])) == 1
    assert result["checksums_equal"] is True
    assert result["steps"] > 0


def test_a_failing_rank_fails_both_nodes(ddp_project: Path) -> None:
    config = ddp_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29630"]
    fail = {"NODEKIT_ARGS": '["--fail-rank", "1"]'}
    try:
        bg = nodekit("up", "--node-rank", "0", *flags, "--detach", config=config, env=fail)
        assert bg.returncode == 0, bg.stderr
        fg = nodekit("up", "--node-rank", "1", *flags, config=config, env=fail, timeout=300)
        main_code = wait_node(config, 0)
    finally:
        down(config)
    # Rank 1 exits 3; torchrun reports a failed worker as 1, and `nodekit up` exits with the job's code.
    assert fg.returncode == 1, fg.stdout + fg.stderr
    assert "[node 1]" in fg.stderr and "exited with code 1" in fg.stderr
    # Main stops on its watchdog's word (19, "node 1 failed"), unless gloo ended its own rank first (torchrun's 1).
    assert main_code in (1, 19), f"main must not report success when a worker node failed (exit {main_code})"


@pytest.mark.parametrize("golden", ["node-0-cpu.yaml", "node-1-gpu.yaml"])
def test_golden_files_are_valid_compose(golden: str) -> None:
    proc = subprocess.run(["docker", "compose", "-f", str(GOLDEN / golden), "config", "--quiet"], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()


def test_starter_config_renders_a_valid_remote_node_file(tmp_path: Path, docker_engine: None) -> None:
    """The issue's acceptance check: init, then compose for node 1 of a main at 10.0.0.5."""
    cli = [sys.executable, "-m", "nodekit"]
    assert subprocess.run([*cli, "init", "--name", "starter"], cwd=tmp_path, capture_output=True).returncode == 0
    (tmp_path / "train.py").write_text("print('train')\n")
    made = subprocess.run(
        [*cli, "compose", "--node-rank", "1", "--main", "10.0.0.5", "--image", "nodekit/starter:000000000000"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    path = tmp_path / "compose" / "node-1.yaml"
    assert made.stdout.strip().endswith("compose/node-1.yaml")
    config = subprocess.run(
        ["docker", "compose", "-f", str(path), "config", "--format", "json"], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stderr
    svc = json.loads(config.stdout)["services"]["train"]
    assert svc["network_mode"] == "host"
    assert svc["environment"]["NODE_RANK"] == "1" and svc["environment"]["MASTER_ADDR"] == "10.0.0.5"
