"""Calls that can hang have deadlines and end in one line naming what hung."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from nodekit.errors import DeadlineError
from nodekit.image.lock import pip as lock_pip
from nodekit.image.lock import resolution as lock_resolution
from nodekit.system import docker, proc


def test_a_hung_pip_is_stopped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """`nodekit lock`/`build` do not wait forever on a stalled pip (an index that stopped answering)."""
    monkeypatch.setattr(lock_pip, "resolve_argv", lambda *a, **k: ["sleep", "30"])
    monkeypatch.setattr(lock_pip, "PIP_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(DeadlineError) as e:
        lock_resolution.run_report(["torch==2.13.0"], [], python_version="3.11", platform="manylinux_2_36_x86_64")
    assert time.monotonic() - started < 5
    assert e.value.one_line().startswith("pip resolving the lock did not finish within 0.5 s and was stopped")
    assert "\n" not in e.value.one_line()


def test_a_streamed_process_that_hangs_is_killed_and_named() -> None:
    """mmdebstrap's output is streamed line by line; a stalled mirror does not keep `nodekit base` waiting."""
    started = time.monotonic()
    child = proc.start(["sh", "-c", "echo fetching; exec sleep 30"], deadline=0.5, what="mmdebstrap",
                       fix="check the mirror", stdout="pipe")  # fmt: skip
    lines = list(child.lines())
    child.wait()
    with pytest.raises(DeadlineError, match=r"^mmdebstrap did not finish within 0.5 s"):
        child.check()
    assert lines == ["fetching\n"] and time.monotonic() - started < 5


@pytest.fixture
def hung_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `docker` first on PATH that never answers, as the CLI does against a wedged engine or a dead SSH link
    (the real case, a stopped dockerd: tests/cluster/test_ship.py, test_a_hung_engine_is_named_within_its_deadline)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(docker.calls, "ENGINE_CALL_S", 0.5)
    return fake


def test_a_hung_engine_query_is_stopped_and_named(hung_docker: object) -> None:
    started = time.monotonic()
    with pytest.raises(DeadlineError) as e:
        docker.check_engine("ssh://me@10.0.0.6")
    assert time.monotonic() - started < 10
    line = e.value.one_line()
    assert line.startswith("docker version on ssh://me@10.0.0.6 did not finish within 0.5 s and was stopped")
    assert "docker -H ssh://me@10.0.0.6 info" in line


def test_every_query_has_the_deadline_but_the_job_long_calls_have_none(hung_docker: object) -> None:
    with pytest.raises(DeadlineError, match=r"^inspecting image nodekit/x:1 on the local Docker engine"):
        docker.image_info("nodekit/x:1")
    with pytest.raises(DeadlineError, match=r"^docker compose ps of p"):
        docker.compose_ps(None, "p")
    # The batched queries run docker themselves (python-on-whales builds the command line): the same deadline.
    with pytest.raises(DeadlineError, match=r"^docker image ls on the local Docker engine did not finish within 0.5 s"):
        docker.images_labelled("io.nodekit.name", "demo")
    with pytest.raises(DeadlineError, match=r"^docker image ls on ssh://me@n1 did not finish"):
        docker.layer_lists("ssh://me@n1")
    with pytest.raises(DeadlineError, match=r"^docker image history on the local Docker engine did not finish"):
        docker.history_sizes("nodekit/x:1")
    # Following the job's log and waiting for its end last as long as the job: no deadline there.
    argv = docker.client(deadline=None).client_config.docker_cmd
    assert str(argv[0]).endswith("docker")
    assert [str(a) for a in docker.client().client_config.docker_cmd][:2] == [
        str(shutil.which("timeout")),
        "--foreground",
    ]
