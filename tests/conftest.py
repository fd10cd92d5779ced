"""Shared fixtures. Real-Docker tests (marker ``docker``) skip on a laptop without an engine, but fail in CI.

CI sets NODEKIT_REQUIRE_DOCKER=1 (through ``make test``); CI=true has the same effect, so a forgotten
variable cannot turn the real tests into silent skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HOST_ENV = dict(os.environ)  # before any test replaces the pip configuration


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


def unavailable(what: str, why: str) -> None:
    """The one fail-or-skip rule for a real-engine test that cannot run: fail where it must run (CI, or
    NODEKIT_REQUIRE_DOCKER=1), skip elsewhere. Never returns."""
    if docker_required():
        pytest.fail(f"{what} must run here but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Use in every real-Docker test: skips without an engine locally, fails without one in CI."""
    problem = _engine_problem()
    if problem is None:
        return
    unavailable("real-Docker tests", f"{problem} (run `make engine`)")


CONTAINERD_HOST = os.environ.get("NODEKIT_CONTAINERD_HOST", "unix:///run/nodekit-engine-sid/containerd/docker.sock")
"""The engine with Docker's containerd image store that `make test` starts beside the default one
(`make engine-containerd`: Debian sid's Engine 28.5): the real-engine tests that run on both stores use it as their
second engine."""


@pytest.fixture(scope="session")
def containerd_engine(docker_engine: None) -> str:
    """The DOCKER_HOST of the containerd-store engine; skips locally without one, fails in CI."""
    proc = subprocess.run(
        ["docker", "-H", CONTAINERD_HOST, "info", "--format", "{{json .DriverStatus}}"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or "containerd.snapshotter" not in proc.stdout:
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "it is not the containerd store"
        unavailable("containerd-store tests", f"no containerd-store engine at {CONTAINERD_HOST}: {why} "
                    "(run make engine-containerd)")  # fmt: skip
    return CONTAINERD_HOST


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A group's tests run in collection order, on one worker: a test marked first_in_group goes before the rest (a
    # stable sort: the others keep their order), so that what it loads into its group's hosts, every later test of
    # the group finds there, on a new machine too.
    items.sort(key=lambda item: item.get_closest_marker("first_in_group") is None)
    for item in items:
        if item.get_closest_marker("docker") and "docker_engine" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("docker_engine")  # type: ignore[attr-defined]


# `make test` runs the heavy tiers as four groups on two workers (pytest-xdist, -n 2 --dist loadgroup): each group's
# tests stay in one worker, in file order, because they share state (the default engine's fixed ports and compose
# projects; a cluster's namespace names and data roots), while the groups share nothing but the default engine's
# build cache. A worker takes the next group when it is nearly done with its own (xdist's load-scope scheduler hands
# one over when 2 of its tests are left), and the groups are handed out longest first (GROUP_ORDER), so the two
# workers end close together: in the CI run of 2026-12-06 the cluster tier as one group (SSH tests included) took
# 28 of its 31 minutes on one worker while the other was done at 24.
TIERS = {"integration": "engine", "cluster": "cluster"}
# The cluster tests that go over real SSH (an sshd in every host, the head's ssh and relay trees) are one group. What
# they count is their own: the temporary directories of their own nodekit process (nkssh.PID.*, nkalive.PID.*), the
# relay directories in their cluster's session TMPDIR (Host.tmp), ssh processes per host namespace; so SSH tests may
# run in another group too, and SSH_ELSEWHERE's do, to even out the two workers (on a cleaned machine, 2026-12-07
# 01:55, the SSH group took 18.3 minutes then Slurm's 6.3 on one worker; the engine's tier 15.9 then the others 9.9,
# of which test_tree.py 0.6, now in the SSH group: about 25.2 each).
SSH_GROUP = frozenset(
    {"test_fleet.py", "test_faults.py", "test_relay.py", "test_ops.py", "test_data.py", "test_tree.py"}
)
SSH_ELSEWHERE = frozenset({"test_disk.py", "test_linkcheck.py"})
SLURM_GROUP = frozenset({"test_slurm.py"})
# Each cluster group has its own cluster name (namespaces nkX-hI, data roots /var/lib/nodekit-cluster/nkX, cgroups),
# so no group ever sees another's hosts; the data roots, and the demo image in them, persist between runs.
# A test that brings up a cluster of its own, beside its group's, names it with a name of its own (test_ship's nks,
# nkid and nkd, test_tree's nkt, test_harness's nkz; benchmarks' nkf and nktb): none of these. One that needs more hosts
# than the group's three but the demo image demo_on_main put in host 0's data root (test_linkcheck's four) uses its
# group's name.
CLUSTER_NAMES = {"cluster-ssh": "nkv", "cluster": "nku", "cluster-slurm": "nkw"}
# Longest first, from the busy minutes each took in that run (the SSH group 19, the real-engine tier 17, the rest of
# the cluster tier 9.5, Slurm 7): on two workers the SSH group then Slurm on one, the engine's then the cluster's on
# the other, about 26 minutes each. A group not named here goes last.
GROUP_ORDER = ("cluster-ssh", "engine", "cluster", "cluster-slurm")


def tier_of(nodeid: str) -> str | None:
    """The tier a test belongs to, from its path: tests/integration/... is "engine", tests/cluster/... "cluster"."""
    return next((TIERS[part] for part in nodeid.split("::", 1)[0].split("/") if part in TIERS), None)


def group_of(nodeid: str) -> str | None:
    """The group a test runs in under --dist loadgroup: its tier, except that the cluster tier's SSH_GROUP files are
    "cluster-ssh" and its SLURM_GROUP files "cluster-slurm"."""
    tier = tier_of(nodeid)
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    if tier == "cluster" and name in SSH_GROUP:
        return "cluster-ssh"
    if tier == "cluster" and name in SLURM_GROUP:
        return "cluster-slurm"
    return tier


def group_rank(group: str | None) -> int:
    """Where a group goes in GROUP_ORDER (a group not named there, and a scope that is none, last)."""
    return GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)


def cluster_name(nodeid: str) -> str:
    """The name of the virtual cluster a cluster test's fixtures bring up: its group's (CLUSTER_NAMES)."""
    return CLUSTER_NAMES[group_of(nodeid) or "cluster"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under --dist loadgroup, a test's group is ``group_of``'s, and the groups go out in GROUP_ORDER: the work
    queue hands out the first-ranked group left (the workers' collections, whose order the scheduler's test indexes
    refer to, stay as collected). (pytest-xdist 3.8 groups by an ``xdist_group`` mark by suffixing the test's node
    id, which pytest 9's node ids no longer let it do; the scope is chosen here instead.)"""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadGroupScheduling

    config.option.loadscopereorder = False

    class LongestFirst(OrderedDict[str, Any]):
        """The scheduler takes its next group with ``popitem(last=False)``: the best-ranked one left."""

        def popitem(self, last: bool = True) -> tuple[str, Any]:
            if last or not self:
                return super().popitem(last)
            scope = min(self, key=group_rank)
            return scope, self.pop(scope)

    class TierScheduling(LoadGroupScheduling):
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.workqueue = LongestFirst()

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or super()._split_scope(nodeid)

    return TierScheduling(config, log)


def logging_docker(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose PATH finds a ``docker`` that logs its arguments, then runs the real client."""
    real = shutil.which("docker")
    assert real is not None
    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir()
    wrapper = bin_dir / "docker"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return env, log


@pytest.fixture(scope="session")
def setuptools_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """setuptools' wheel from the host's pip sources, once per session, for pip's isolated build environments in
    the offline indexes of the sdist tests (unit: tests/unit/image/lock/test_sdist.py; engine: test_build_sdist.py)."""
    dest = tmp_path_factory.mktemp("backend")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
         "--dest", str(dest), "setuptools>=70.1"],
        env=HOST_ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (wheel,) = dest.glob("setuptools-*.whl")
    return wheel


@pytest.fixture(scope="module")
def bad_input_projects() -> Iterator[None]:
    """The projects the bad-input harness made (tests/bad_input.py, ``MADE``), removed when the module's tests are
    done."""
    from tests.bad_input import MADE

    yield
    while MADE:
        made = MADE.pop()
        if made.is_dir():
            shutil.rmtree(made, ignore_errors=True)
        else:
            made.unlink(missing_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With NODEKIT_TEST_TIMES=FILE, one JSON line per test phase as it ends (set-up, call, tear-down), so a run
    that is stopped part-way still says where its time went (--durations prints only at the end)."""
    path = os.environ.get("NODEKIT_TEST_TIMES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes each report once
        return
    import json
    import time

    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)  # xdist's gwN
    line = {"at": round(time.time(), 1), "test": report.nodeid, "when": report.when, "worker": worker,
            "seconds": round(report.duration, 2), "outcome": report.outcome}  # fmt: skip
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
