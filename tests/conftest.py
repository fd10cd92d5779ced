"""Shared fixtures. Real-Docker tests (marker ``docker``) skip on a laptop without an engine, but fail in CI.

CI sets NODEKIT_REQUIRE_DOCKER=1 (through ``make test``); CI=true has the same effect, so a forgotten
variable cannot turn the real tests into silent skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client"
    proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "docker info failed"
        return f"no Docker engine ({last})"
    for plugin in ("compose", "buildx"):
        if subprocess.run(["docker", plugin, "version"], capture_output=True).returncode != 0:
            return f"docker {plugin} plugin missing"
    return None


def docker_required() -> bool:
    return os.environ.get("NODEKIT_REQUIRE_DOCKER") == "1" or os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Use in every real-Docker test: skips without an engine locally, fails without one in CI."""
    problem = _engine_problem()
    if problem is None:
        return
    if docker_required():
        pytest.fail(f"real-Docker tests must run here but {problem}: run `make engine`", pytrace=False)
    pytest.skip(f"{problem} (run `make engine`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("docker") and "docker_engine" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("docker_engine")  # type: ignore[attr-defined]
