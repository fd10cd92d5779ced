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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import wheelcache
from tests.cluster.harness import SSHD, Cluster, problem
from tests.cluster.helpers import EXAMPLE, Demo, Fleet, SshKeys, fleet_on, nodekit_argv, push_image
from tests.conftest import cluster_name, unavailable


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
def cluster(cluster_ready: None, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Three fresh hosts (NAME-h0..2, 172.31.250.10-12, each with a decoy default route; NAME is the test's group's,
    tests.conftest.cluster_name), torn down after the test."""
    if "demo_on_main" in request.fixturenames:
        request.getfixturevalue("demo_on_main")  # it brings up a cluster of this name briefly: before this one
    yield from _fresh(3, cluster_name(request.node.nodeid))


def _run(argv: list[str], timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory, cluster_ready: None) -> Demo:
    """The demo project's image, built (a no-op when it exists) on this machine's default engine."""
    from nodekit.config import settings
    from nodekit.image import builder as build

    dest = tmp_path_factory.mktemp("cluster-demo") / "ddp"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__"))
    if (EXAMPLE / ".nodekit" / "wheelhouse").is_dir():
        shutil.copytree(EXAMPLE / ".nodekit" / "wheelhouse", dest / ".nodekit" / "wheelhouse")
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    # Wheels only: this build goes through BuildKit, whose cache the code-push test's rebuild then reuses.
    wheelcache.prefill(dest)
    built = _run(nodekit_argv("build", "--create-base", "--config", str(dest / "nodekit.toml")), env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    wheelcache.keep(dest)
    ref = build.current_image(settings.load(dest / "nodekit.toml"))
    image_id = _run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], env=env).stdout.strip()
    assert image_id.startswith("sha256:"), f"cannot inspect {ref}"
    return Demo(project=dest, ref=ref, image_id=image_id)


@pytest.fixture(scope="session")
def demo_loaded() -> set[str]:
    """The cluster names whose host 0 got the demo image in this session."""
    return set()


@pytest.fixture
def demo_on_main(demo: Demo, demo_loaded: set[str], request: pytest.FixtureRequest) -> Demo:
    """The demo image in host 0's engine of the test's cluster name (as if built there), loaded once per session and
    name (a skip when the data root kept it from an earlier run); later tests find it."""
    name = cluster_name(request.node.nodeid)
    if name not in demo_loaded:
        with Cluster(3, name=name, owner=os.getpid()) as c:
            push_image(demo.ref, None, [c.main])
        demo_loaded.add(name)
    return demo


@pytest.fixture
def demo_everywhere(demo_on_main: Demo, cluster: Cluster) -> Demo:
    """The demo image on every host of this test's cluster (pushed from host 0 where missing)."""
    push_image(demo_on_main.ref, cluster.main.docker_host, cluster.hosts[1:])
    return demo_on_main


# --- real SSH: an OpenSSH server in every host, keys made here ----------------------------------------------------


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory, cluster_ready: None) -> SshKeys:
    """A host key for every host's sshd, the client key the test's user logs in with, and a key nobody accepts."""
    if not SSHD.is_file() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        why = "no OpenSSH server/client (bash scripts/sshd.sh installs Debian's openssh-server)"
        unavailable("fleet tests", why)
    d = tmp_path_factory.mktemp("ssh")
    return SshKeys(
        dir=d,
        host_key=_keygen(d / "host_ed25519"),
        client_key=_keygen(d / "id_ed25519"),
        wrong_key=_keygen(d / "wrong"),
    )


@pytest.fixture
def fleet(cluster: Cluster, ssh_keys: SshKeys, tmp_path: Path) -> Iterator[Fleet]:
    """``cluster`` with Debian's sshd on port 22 of every host (its own config, the session's host key, our client
    key authorised), stopped by PID after the test."""
    yield from fleet_on(cluster, ssh_keys, tmp_path)
