"""launcher = "mpirun" on a real engine: examples/mpirun/main.py, which reads only Open MPI's variables, runs
unchanged as 2 nodes x 2 processes (main 127.0.0.1), and every rank of the one world of 4 reports in."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from nodekit.backends.compose.node import compose_path, project_for
from nodekit.config.settings import load
from nodekit.system import docker
from tests import wheelcache
from tests.integration.helpers import ROOT, nodekit

pytestmark = pytest.mark.docker
PORT = 29790


@pytest.fixture(scope="module")
def mpirun_project(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Path:
    """examples/mpirun in a temporary directory with its image built (its lock is the legacy example's: the wheels
    and layers are shared, only the code layer is new)."""
    dest = tmp_path_factory.mktemp("mpirun") / "mpirun"
    shutil.copytree(ROOT / "examples" / "mpirun", dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit"))
    wheelcache.warm(dest)
    built = nodekit("build", "--create-base", config=dest / "nodekit.toml", timeout=1500)
    assert built.returncode == 0, built.stdout + built.stderr
    wheelcache.kept(dest)
    return dest


def test_an_open_mpi_script_runs_unchanged_on_two_nodes_of_two(mpirun_project: Path) -> None:
    config = mpirun_project / "nodekit.toml"
    flags = ["--main", "127.0.0.1", "--master-port", str(PORT)]
    settings = load(config)
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config)
        assert bg.returncode == 0, bg.stdout + bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, timeout=300)
        worker = docker.compose_wait(compose_path(settings, 1), project_for(settings, 1))
        logs = nodekit("logs", "--node-rank", "1", config=config)
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    out = fg.stdout + fg.stderr
    assert (fg.returncode, worker) == (0, 0), out + logs.stdout + logs.stderr
    assert "| 2 proc/node | world 4 |" in out and "| mpirun" in out
    assert "mpirun: 4 ranks, send/recv and all_reduce ok" in out
    # Node 0's log has ranks 0 and 1 (-map-by slot: node 0's slots first); node 1's has 2 and 3.
    seen = re.findall(r"mpirun: rank (\d) local (\d) of 4: sum of ranks 6", out)
    assert sorted(seen) == [("0", "0"), ("1", "1")], out
    theirs = re.findall(r"mpirun: rank (\d) local (\d) of 4: sum of ranks 6", logs.stdout + logs.stderr)
    assert sorted(theirs) == [("2", "0"), ("3", "1")], logs.stdout + logs.stderr
