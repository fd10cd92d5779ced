"""Fixtures for real-Docker tests: the example project, copied to a temporary directory and built once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import wheelcache
from tests.integration.helpers import EXAMPLE, nodekit


@pytest.fixture(scope="session")
def ddp_project(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> Path:
    """examples/ddp in a temporary directory, with its image built (shared by every test in the session)."""
    dest = tmp_path_factory.mktemp("ddp") / "ddp"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    # The lock and the wheelhouse are inputs, not outputs: reuse the example's cache so the test resolves nothing.
    if (EXAMPLE / ".nodekit" / "wheelhouse").is_dir():
        shutil.copytree(EXAMPLE / ".nodekit" / "wheelhouse", dest / ".nodekit" / "wheelhouse")
    wheelcache.warm(dest)
    built = nodekit("build", "--create-base", config=dest / "nodekit.toml", timeout=1500)
    assert built.returncode == 0, built.stdout + built.stderr
    wheelcache.kept(dest)
    return dest
