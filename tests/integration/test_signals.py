"""`nodekit up` stopped by a real signal, against the real engine: nothing it started is left.

The dangerous moment is `docker compose up` itself: a signal that ended only the `timeout` wrapper python-on-whales
runs compose under would let `down` run at once (nothing to remove yet) and the orphaned `compose up` create the
container a moment later, to run with nobody following it. A `docker` first on PATH makes that moment last 3 s (it
sleeps, then runs the real client), so the signal lands in it every time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import containers, nodekit

pytestmark = pytest.mark.docker
CODES = [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]


def slow_compose_up(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``docker`` sleeps 3 s before a ``compose ... up`` (after touching ``marker``)."""
    real = shutil.which("docker")
    assert real is not None
    bin_dir, marker = tmp_path / "bin", tmp_path / "compose-up-started"
    bin_dir.mkdir()
    wrapper = bin_dir / "docker"
    wrapper.write_text(
        '#!/bin/sh\ncase " $* " in *" compose "*" up "*) : > ' + str(marker) + f'; sleep 3;; esac\nexec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    return env, marker


def compose_processes(path: Path) -> list[str]:
    """Processes whose command line names the node's compose file (docker compose, the plugin, a wrapper)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(path) in line:
                found.append(f"{entry.name} {line[:200]}")
    return found


@pytest.mark.parametrize(("signum", "code"), CODES)
def test_a_signal_during_compose_up_leaves_no_container_and_no_process(
    ddp_project: Path, tmp_path: Path, signum: int, code: int
) -> None:
    config = ddp_project / "nodekit.toml"
    env, marker = slow_compose_up(tmp_path)
    argv = [sys.executable, "-m", "nodekit", "up", "--node-rank", "1", "--main", "127.0.0.1", "--nnodes", "2",
            "--master-port", "29660", "--detach", "--config", str(config)]  # fmt: skip
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        print(f"{signal.Signals(signum).name} during compose up: nodekit up ended {time.monotonic() - t0:.1f} s later")
        assert proc.returncode == code, out + err
        assert f"{signal.Signals(signum).name} received" in err and "Traceback" not in err, err
        time.sleep(5)  # the old code's orphaned compose up woke after 3 s and created the container
        assert containers(config, 1) == [], "a container was created after nodekit up stopped"
        assert compose_processes(ddp_project / "compose" / "node-1.yaml") == []
    finally:
        nodekit("down", "--node-rank", "1", config=config)


def test_sighup_while_following_the_job_removes_its_container(ddp_project: Path, tmp_path: Path) -> None:
    """A closed terminal (or SSH session) while `up` follows the job: the container is removed, exit 129."""
    config = ddp_project / "nodekit.toml"
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
    env["NODEKIT_ARGS"] = '["--epochs", "100000", "--epoch-delay", "0.2"]'
    log = tmp_path / "up.log"
    argv = [sys.executable, "-m", "nodekit", "up", "--node-rank", "0", "--main", "127.0.0.1", "--nnodes", "1",
            "--master-port", "29662", "--config", str(config)]  # fmt: skip
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        while "ddp-demo: epoch 1 done" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert containers(config, 0), "the job runs in no container"
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=90) == 129, log.read_text()[-3000:]
        assert "SIGHUP received: stopping and removing node 0" in log.read_text()
        assert containers(config, 0) == []
        assert compose_processes(ddp_project / "compose" / "node-0.yaml") == []
    finally:
        nodekit("down", "--node-rank", "0", config=config)
