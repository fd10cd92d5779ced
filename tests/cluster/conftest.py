"""Fixtures for multi-host tests: fresh hosts per test, images loaded into the hosts' engines once per session.

Every test here needs root, network namespaces and a dockerd: without them the tests skip on a laptop and fail in
CI (CI=true or NODEKIT_REQUIRE_DOCKER=1), like the real-Docker tests.

The hosts' data roots (/var/lib/nodekit-cluster/<name>/hI) outlive a test and the session, so an image loaded
into a host once stays there; namespaces, daemons, containers and mounts are new for every test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodekit import secret
from tests.cluster.harness import Cluster, Host, problem
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ddp"
NODEKIT = [sys.executable, "-m", "nodekit"]


def nodekit_argv(*args: str) -> list[str]:
    """The real CLI, as a user runs it."""
    return [*NODEKIT, *args]


@pytest.fixture(scope="session")
def cluster_ready(docker_engine: None) -> None:
    why = problem()
    if why is None:
        return
    unavailable("multi-host tests", f"no virtual cluster here: {why}")


def _fresh(n: int, name: str) -> Iterator[Cluster]:
    c = Cluster(n, name=name, owner=os.getpid())
    c.up()
    try:
        yield c
    finally:
        c.down()


@pytest.fixture
def cluster(cluster_ready: None) -> Iterator[Cluster]:
    """Three fresh hosts (nkt-h0..2, 172.31.250.10-12, each with a decoy default route), torn down after the test."""
    yield from _fresh(3, "nkt")


@dataclass(frozen=True)
class Demo:
    """examples/ddp, copied and built on the default engine; ``ref`` is its image."""

    project: Path
    ref: str
    image_id: str


def _run(argv: list[str], timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory, cluster_ready: None) -> Demo:
    """The demo project's image, built (a no-op when it exists) on this machine's default engine."""
    from nodekit import build, settings

    dest = tmp_path_factory.mktemp("cluster-demo") / "ddp"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    if (EXAMPLE / ".nodekit" / "wheelhouse").is_dir():
        shutil.copytree(EXAMPLE / ".nodekit" / "wheelhouse", dest / ".nodekit" / "wheelhouse")
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    built = _run(nodekit_argv("build", "--create-base", "--config", str(dest / "nodekit.toml")), env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    ref = build.current_image(settings.load(dest / "nodekit.toml"))
    image_id = _run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], env=env).stdout.strip()
    assert image_id.startswith("sha256:"), f"cannot inspect {ref}"
    return Demo(project=dest, ref=ref, image_id=image_id)


@pytest.fixture(scope="session")
def demo_on_main(demo: Demo, cluster_ready: None) -> Demo:
    """The demo image in host 0's engine (as if built there), loaded once per session; later tests find it."""
    with Cluster(3, name="nkt", owner=os.getpid()) as c:
        push_image(demo.ref, None, [c.main])
    return demo


def push_image(ref: str, source: str | None, hosts: list[Host]) -> None:
    """nodekit push through its Python API (the CLI is tested on its own): skips hosts that have the image."""
    from nodekit import ship
    from nodekit.progress import NullReporter

    src = ship.source_of(ref, source)
    targets = [ship.Target(name=h.name, endpoint=h.docker_host) for h in hosts]
    ship.push(ship.plan_push(src, ship.survey(src, targets)), NullReporter())


@pytest.fixture
def demo_everywhere(demo_on_main: Demo, cluster: Cluster) -> Demo:
    """The demo image on every host of this test's cluster (pushed from host 0 where missing)."""
    push_image(demo_on_main.ref, cluster.main.docker_host, cluster.hosts[1:])
    return demo_on_main


def host_project(demo: Demo, host: Host, base: Path) -> Path:
    """The demo project as this host's own checkout (each machine has its own files, outputs and compose dir)."""
    dest = base / host.name / "ddp"
    # The job secret travels with the project (.nodekit/job-secret), as a user's copy to each machine carries it.
    secret.load_or_create(demo.project)
    shutil.copytree(demo.project, dest, ignore=shutil.ignore_patterns("outputs", "compose", "__pycache__"))
    return dest
