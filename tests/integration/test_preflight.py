"""The launch-time guarantees on a real engine: a node that never comes is named, a different stack is refused.

Both nodes run on this machine (main 127.0.0.1) with their own compose projects, as in the demo.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import copy_checkout
from tests.integration.helpers import nodekit

pytestmark = pytest.mark.docker


def down(config: Path) -> None:
    for rank in (0, 1):
        nodekit("down", "--node-rank", str(rank), config=config)


def test_a_node_that_never_comes_is_named_promptly(ddp_project: Path) -> None:
    config = ddp_project / "nodekit.toml"
    started = time.monotonic()
    try:
        alone = nodekit(
            "up", "--node-rank", "0", "--main", "127.0.0.1", "--master-port", "29640",
            config=config, env={"NODEKIT_RDZV_TIMEOUT": "8"}, timeout=120,
        )  # fmt: skip
    finally:
        down(config)
    elapsed = time.monotonic() - started
    assert alone.returncode == 18, alone.stdout + alone.stderr
    out = alone.stdout + alone.stderr
    assert re.search(r"node\(s\) 1 never arrived", out), out
    assert elapsed < 60, f"the missing node must be named well under a minute, took {elapsed:.0f} s"


def test_a_main_this_node_cannot_reach_is_named_within_seconds(ddp_project: Path, tmp_path: Path) -> None:
    """A wrong main address (issue 32): the kernel says "network unreachable" at once, and the node says so within
    seconds instead of waiting out rdzv_timeout. The node runs in a container with no network (only loopback), so
    nothing leaves this machine; main's address is one no route leads to there."""
    config = ddp_project / "nodekit.toml"
    out = tmp_path / "compose"
    made = nodekit("compose", "-r", "1", "-m", "10.77.0.9", "--master-port", "29650", "--out-dir", str(out),
                   config=config)  # fmt: skip
    assert made.returncode == 0, made.stderr
    (out / "offline.yaml").write_text("services:\n  train:\n    network_mode: none\n")
    files = ["-f", str(out / "node-1.yaml"), "-f", str(out / "offline.yaml")]
    project = "nodekit-door-unreachable"
    started = time.monotonic()
    try:
        up = ["up", "--abort-on-container-exit", "--exit-code-from", "train"]
        ran = subprocess.run(["docker", "compose", *files, "-p", project, *up], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    finally:
        subprocess.run(["docker", "compose", *files, "-p", project, "down", "--timeout", "5"], capture_output=True)
    elapsed = time.monotonic() - started
    said = ran.stdout + ran.stderr
    assert ran.returncode == 18, said
    found = re.search(r"main 10\.77\.0\.9:29651 is unreachable from this node \(network unreachable, (\d+) s", said)
    assert found, said
    assert int(found[1]) < 10, f"named {found[1]} s after the first try"
    assert "--main" in said and "NODEKIT_RDZV_TIMEOUT" not in said, said
    assert elapsed < 60, f"the container took {elapsed:.0f} s in all"


@pytest.fixture(scope="module")
def other_image(ddp_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same project with one extra file: another fingerprint, as a node with a stale checkout would have."""
    variant = tmp_path_factory.mktemp("variant") / "ddp"
    copy_checkout(ddp_project, variant, builds=True)
    (variant / "extra.py").write_text("# a file main does not have\n")
    built = nodekit("build", config=variant / "nodekit.toml", timeout=900)
    assert built.returncode == 0, built.stderr
    found = re.search(r"nodekit/ddp-demo:[0-9a-f]{12}", built.stdout)
    assert found, built.stdout
    yield found.group(0)
    shutil.rmtree(variant, ignore_errors=True)  # its build state (gigabytes) until the session ends otherwise


def test_a_node_with_a_different_image_is_refused_on_both_nodes(ddp_project: Path, other_image: str) -> None:
    config = ddp_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", "29650"]
    try:
        worker = nodekit("up", "--node-rank", "1", *flags, "--image", other_image, "--detach", config=config)
        assert worker.returncode == 0, worker.stderr
        main = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=180)
        worker_logs = nodekit("logs", "--node-rank", "1", config=config)
    finally:
        down(config)
    assert main.returncode == 17, main.stdout + main.stderr
    main_out = main.stdout + main.stderr
    fp_other = other_image.rsplit(":", 1)[1]
    for text in (main_out, worker_logs.stdout):
        assert "fingerprint" in text, text
        assert fp_other in text, text  # the table names the differing value on every node
        assert "node 1" in text
    assert "final loss" not in main_out, "no training may start on a mismatched stack"


def test_up_without_a_built_image_is_refused(tmp_path: Path, docker_engine: None) -> None:
    (tmp_path / "nodekit.toml").write_text('name = "never-built-xyz"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("print('x')\n")
    result = nodekit("up", "--node-rank", "1", "--main", "127.0.0.1", config=tmp_path / "nodekit.toml")
    assert result.returncode == 2, result.stderr
    assert "no image built yet" in result.stderr and "nodekit build" in result.stderr
    assert not (tmp_path / "compose").exists()
