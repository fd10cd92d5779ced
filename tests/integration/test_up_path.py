"""The way from `nodekit up` to the container's start: what it asks the engine, and what it says when the engine or
the Compose plugin is missing. It asks no versions first (a version check costs 0.7 s on every `up`, twice); a
failed call diagnoses instead, so a missing engine or plugin still gets its one line and its fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import logging_docker
from tests.integration.helpers import containers, nodekit

pytestmark = pytest.mark.docker
FLAGS = ["--main", "127.0.0.1", "--master-port", "29650", "--detach"]


def test_up_asks_the_engine_five_times_and_never_for_versions(ddp_project: Path, tmp_path: Path) -> None:
    config = ddp_project / "nodekit.toml"
    env, log = logging_docker(tmp_path)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nodekit", "up", "--node-rank", "1", *FLAGS, "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert containers(config, 1), "up --detach returned 0 but started no container"
    finally:
        nodekit("down", "--node-rank", "1", config=config)
    calls = log.read_text().splitlines()
    assert not [c for c in calls if "version" in c.split()], calls
    # The base (for the project's fingerprint), the project's images (a list, then one inspect of them all, which
    # also gives the chosen image's id), whether the node already runs here (one node per rank and host, issue 28),
    # and compose up: each once.
    assert len([c for c in calls if c.startswith("image inspect")]) == 2, calls
    assert len([c for c in calls if c.startswith("image ls")]) == 1, calls
    assert len([c for c in calls if c.startswith("ps --filter label=com.docker.compose.project=")]) == 1, calls
    assert len([c for c in calls if c.startswith("compose ") and " up " in f" {c} "]) == 1, calls
    assert len(calls) == 5, calls


def test_up_without_an_engine_is_one_line_and_exit_2(ddp_project: Path) -> None:
    proc = nodekit(
        "up", "--node-rank", "1", *FLAGS, config=ddp_project / "nodekit.toml",
        env={"DOCKER_HOST": f"unix://{ddp_project}/no-engine.sock"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nodekit: error: no Docker engine answers"), lines
    assert "Fix: make engine" in lines[0]


def compose_plugin() -> Path:
    out = subprocess.run(
        ["docker", "info", "--format", '{{range .ClientInfo.Plugins}}{{if eq .Name "compose"}}{{.Path}}{{end}}{{end}}'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out, "the docker client lists no compose plugin"
    return Path(out)


def test_up_without_the_compose_plugin_says_so_and_leaves_no_container(ddp_project: Path) -> None:
    """The real docker client with its plugin directory hidden (an empty tmpfs over it, in a mount namespace of
    its own): `docker compose up` then fails as it does on a host without the plugin."""
    assert shutil.which("unshare"), "util-linux unshare is needed (Debian: util-linux)"
    config = ddp_project / "nodekit.toml"
    plugins = compose_plugin().parent
    argv = [sys.executable, "-m", "nodekit", "up", "--node-rank", "1", *FLAGS, "--config", str(config)]
    script = f'mount -t tmpfs nodekit-test "{plugins}" && exec "$@"'
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            timeout=300,
        )
        left = containers(config, 1)
    finally:
        nodekit("down", "--node-rank", "1", config=config)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "nodekit: error: Docker Compose v2 (the `docker compose` plugin) is missing" in proc.stderr, proc.stderr
    assert left == [], "a failed up must leave no container"
