"""The whole slice on a real engine: two nodes of the example DDP job on this machine (main 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodekit.system.host import net
from tests.golden import GOLDEN
from tests.integration.helpers import down, nodekit, wait_node
from tests.joblog import bars

pytestmark = pytest.mark.docker


@pytest.mark.smoke
def test_two_nodes_train_to_identical_parameters(ddp_project: Path) -> None:
    """The tour as written (issue 32), folded into the one 2-node job: node 0 without --main (its default route's
    address), the script's arguments after `--` (nodekit.toml says 5 epochs), a tqdm-like bar as one line per node
    per second at most, no exit-barrier stack trace on success, and logs and down without a rank."""
    config = ddp_project / "nodekit.toml"
    main = net.default_address_here()
    assert main is not None, "this test needs a default route (node 0 takes main's address from it)"
    script = ("--epochs", "2", "--progress")
    try:
        bg = nodekit("up", "--node-rank", "1", "--main", main, "--master-port", "29620", "--detach", config=config,
                     script_args=script)  # fmt: skip
        assert bg.returncode == 0, bg.stderr
        started = time.monotonic()
        fg = nodekit("up", "--node-rank", "0", "--master-port", "29620", config=config, script_args=script)
        seconds = time.monotonic() - started
        assert fg.returncode == 0, fg.stdout + fg.stderr
        assert wait_node(config, 1) == 0
        logs = nodekit("logs", config=config)
    finally:
        gone = nodekit("down", config=config)
    assert gone.returncode == 0 and "node 0 (" in gone.stdout and "node 1 (" in gone.stdout, gone.stdout + gone.stderr
    assert f"main is {main}, this host's address on its default route" in fg.stderr, fg.stderr
    assert "[node 0] " in fg.stdout  # the job's lines are prefixed with the node
    result = json.loads((ddp_project / "outputs" / "result.json").read_text())
    assert result["epochs"] == 2, "the arguments after -- must reach the script"
    assert result["nnodes"] == 2 and result["world_size"] == 2
    assert len(result["checksums"]) == 2 and len(set(result["checksums"])) == 1
    assert result["checksums_equal"] is True
    assert result["steps"] > 0
    # 2 epochs x 32 redraws: every redraw was a line (64); now at most one a second, and each epoch's last state.
    redraws, ends = bars(fg.stdout, 0)
    assert ends == ["32/32", "32/32"], fg.stdout
    assert len(redraws) <= seconds + 1, f"{len(redraws)} redraws shown in {seconds:.0f} s: {redraws}"
    # logs without a rank: both nodes, merged, each bar as short (the whole log arrives at once: one redraw a bar)
    assert logs.returncode == 0, logs.stderr
    for rank in (0, 1):
        assert f"[node {rank}] nodekit ddp-demo: node {rank}/2" in logs.stdout, logs.stdout
        redraws, ends = bars(logs.stdout, rank)
        assert ends == ["32/32", "32/32"] and len(redraws) <= 2, logs.stdout
    # a run that succeeded prints no traceback: torchrun's exit barrier keeps its own in the run log
    for text in (fg.stdout + fg.stderr, logs.stdout):
        assert "Traceback" not in text and "frame #" not in text and "exit barrier" not in text, text


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
    # The job's last lines say what failed; torchrun's own traceback and report are in the run log (issue 32).
    assert "failing on purpose (--fail-rank 1)" in fg.stdout, fg.stdout
    assert "a worker failed: its own output above says why (torchrun's report: /outputs/nodekit/node-1.log)" in (
        fg.stdout
    ), fg.stdout
    assert "ChildFailedError" not in fg.stdout and "torch/distributed/run.py" not in fg.stdout, fg.stdout
    kept = (ddp_project / "outputs" / "nodekit" / "node-1.log").read_text()
    assert "ChildFailedError" in kept and "Root Cause" in kept
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
