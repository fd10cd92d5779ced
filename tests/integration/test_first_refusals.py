"""What the first hour met, refused in one line before anything starts (issue 46 item 5), through the real CLI on this
machine's engine: `nodekit run` with a main that is none of host 0's addresses, and a mount whose host path is
missing, through `nodekit up` and `nodekit run` (said once, with its fix)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from nodekit.backends.compose.node import project_for
from nodekit.config.settings import load
from tests.integration.helpers import CLASSIC_HOST, here_as_hosts, nodekit

pytestmark = pytest.mark.docker

FLAGS = ("--nnodes", "1", "--script", "ids.py", "--master-port", "29840")


def started(config: Path) -> list[str]:
    """Every container of the project's node 0 on this engine, running or not."""
    project = project_for(load(config), 0)
    out = subprocess.run(["docker", "ps", "-a", "--quiet", "--filter", f"label=com.docker.compose.project={project}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout  # fmt: skip
    return out.split()


def test_run_refuses_a_main_that_is_none_of_host_0_s_addresses_before_any_node_starts(
    probe_project: Callable[[str], Path],
) -> None:
    config = probe_project(CLASSIC_HOST) / "nodekit.toml"
    ran = nodekit("run", *FLAGS, config=config, env=here_as_hosts(CLASSIC_HOST) | {"NODEKIT_MAIN": "192.0.2.77"})
    assert ran.returncode == 2, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "main = '192.0.2.77' (192.0.2.77) is none of node 0 (this machine)'s addresses" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and started(config) == []


@pytest.mark.parametrize("command", ["up", "run"])
def test_a_missing_mount_is_said_once_with_its_fix(
    probe_project: Callable[[str], Path], tmp_path: Path, command: str
) -> None:
    config = probe_project(CLASSIC_HOST) / "nodekit.toml"
    absent = tmp_path / "absent-dataset"
    mounts = json.dumps([{"host": str(absent), "container": "/data"}])
    extra = ("--node-rank", "0", "--main", "127.0.0.1") if command == "up" else ()
    env = {"NODEKIT_MOUNTS": mounts} | (here_as_hosts(CLASSIC_HOST) if command == "run" else {})
    ran = nodekit(command, *extra, *FLAGS, config=config, env=env, timeout=300)
    said = ran.stdout + ran.stderr
    assert ran.returncode == 2, said[-3000:]
    assert said.count(str(absent)) == 1 and "does not exist" in said, said  # once, with its fix
    assert "Traceback" not in said and started(config) == [], said
