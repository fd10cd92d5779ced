"""Plain helpers of the real-engine tests (no fixtures: those are in conftest.py): the CLI as a user runs it, and
what a 2-node job on this machine's engine left behind.

Shared by several test modules, so that no test module imports another (tests/unit/meta/test_test_imports.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from nodekit.backends.compose.node import compose_path, project_for
from nodekit.config.settings import load
from nodekit.system import docker
from tests import wheelcache

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp"
CLASSIC_HOST = "unix:///var/run/docker.sock"
"""The default engine (the classic image store); the containerd store's is tests.conftest's ``containerd_engine``."""
BASE = "nodekit/base:bookworm"


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


def example_copy(dest: Path) -> Path:
    """examples/ddp with its locked wheels but no blob store: its build goes through that engine's BuildKit."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    wheelcache.prefill(dest)
    return dest


def base_on(engine: str) -> None:
    """nodekit's base image on ``engine``: made on the default engine when missing there, and carried over from it
    by nodekit itself (an image it did not build crosses the stores by its identity)."""
    if docker.image_info(BASE, engine) is not None:
        return
    cli = [sys.executable, "-m", "nodekit"]
    config = ["--config", str(EXAMPLE / "nodekit.toml")]
    made = subprocess.run([*cli, "base", "--if-missing", *config], capture_output=True, text=True, timeout=900,
                          env=os.environ | {"DOCKER_HOST": CLASSIC_HOST})  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    if engine != CLASSIC_HOST:
        pushed = subprocess.run([*cli, "push", BASE, "--from", CLASSIC_HOST, "--to", f"there={engine}"],
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr


def here_as_hosts(engine: str) -> dict[str, str]:
    """The environment that makes `nodekit run` use one engine of this machine as its one host (no SSH)."""
    return {"DOCKER_HOST": engine, "NODEKIT_HOSTS": json.dumps([engine])}
