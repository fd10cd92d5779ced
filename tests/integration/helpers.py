"""Plain helpers of the real-engine tests (no fixtures: those are in conftest.py): the CLI as a user runs it, and
what a 2-node job on this machine's engine left behind.

Shared by several test modules, so that no test module imports another (tests/unit/meta/test_test_imports.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nodekit.backends.compose.node import compose_path, project_for
from nodekit.config.settings import load
from nodekit.system import docker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp"


def nodekit(
    *args: str, config: Path, env: dict[str, str] | None = None, timeout: int = 600, script_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would; ``script_args`` go last, after ``--``."""
    after = ["--", *script_args] if script_args else []
    return subprocess.run(
        [sys.executable, "-m", "nodekit", *args, "--config", str(config), *after],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | (env or {}),
    )


def wait_node(config: Path, rank: int) -> int:
    settings = load(config)
    return docker.compose_wait(compose_path(settings, rank), project_for(settings, rank))


def down(config: Path) -> None:
    for rank in (0, 1):
        nodekit("down", "--node-rank", str(rank), config=config)


def containers(config: Path, rank: int) -> list[str]:
    """The ids of node ``rank``'s containers, running or not, as the docker client lists them."""
    project = project_for(load(config), rank)
    out = subprocess.run(
        ["docker", "ps", "-a", "--quiet", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()
