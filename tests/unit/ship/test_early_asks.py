"""`nodekit push` opens the nodes' SSH connections while it reads its own image (nodekit/ship/engines.py,
open_connections): the survey asks a node once its connection is open, and a command that fails on this machine does
not wait for a node that never answers, nor leaves anything running (a real CLI process, a real ssh client, a
listener on loopback that accepts and says nothing)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from nodekit import ship
from nodekit.ship import disk, engines
from nodekit.system import docker

GiB = 1 << 30
NEW = "sha256:" + "1" * 64


def _facts(engine: str) -> docker.EngineFacts:
    return docker.EngineFacts(engine, "28.5.2", "/var/lib/docker", free_bytes=50 * GiB)


def test_the_survey_asks_a_node_once_its_connection_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, float]] = []
    monkeypatch.setattr(docker, "engine_facts", lambda host: asked.append((host, time.monotonic())) or _facts("e1"))
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: None)
    monkeypatch.setattr(docker, "layer_lists", lambda host=None: [])
    monkeypatch.setattr(engines, "remote_facts", lambda *a: disk.RemoteFacts(None, False))
    connecting: Future[None] = Future()
    opened_at: list[float] = []

    def open_later() -> None:
        time.sleep(0.3)
        opened_at.append(time.monotonic())
        connecting.set_result(None)

    threading.Thread(target=open_later, daemon=True).start()
    src = ship.Source(ref="nodekit/ddp-demo:abc", image_id=NEW, size=GiB, engine_id="engine-src")
    [st] = ship.survey(src, [ship.Target("n1", "ssh://me@n1")], opened={"ssh://me@n1": connecting})
    assert st.engine_id == "e1" and st.error is None
    assert len(asked) == 1 and asked[0][1] >= opened_at[0], "the node was asked before its connection was open"


def test_only_ssh_nodes_get_an_early_connection() -> None:
    assert disk.ssh_argv("ssh://me@n1:2222", "true") == ["ssh", "-n", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                                         "-p", "2222", "--", "me@n1", "true"]  # fmt: skip
    assert ship.open_connections([ship.Target("local", "unix:///run/docker.sock"),
                                  ship.Target("tcp", "tcp://n1:2376")]) == {}  # fmt: skip


def test_a_push_that_fails_here_does_not_wait_for_a_node_that_never_answers(tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True)
    accepting.start()
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "HOME": str(tmp_path)}
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nodekit.cli.app", "push", "nodekit/ddp-demo:abc", "--to", f"ssh://root@127.0.0.1:{port}"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - t0
    try:
        assert done.returncode == 2, done.stderr
        assert "no Docker engine answers at the local Docker engine" in done.stderr
        assert "Traceback" not in done.stderr
        assert took < 10, f"the command waited {took:.1f} s for the silent node"
        accepting.join(5)
        assert held, "the node's connection was not opened while this machine read its image"
        left = subprocess.run(["pgrep", "-af", f"127.0.0.1.*{port}|-p {port}"], capture_output=True, text=True)
        assert left.stdout == "", f"left running: {left.stdout}"
    finally:
        for s in held:
            s.close()
        silent.close()


def test_survey_without_early_answers_asks_each_engine_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(docker, "engine_facts", lambda host: asked.append(host) or _facts("engine-n1"))
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: None)
    monkeypatch.setattr(docker, "layer_lists", lambda host=None: [])
    monkeypatch.setattr(engines, "remote_facts", lambda *a: pytest.fail("asked over ssh"))
    src = ship.Source(ref="nodekit/ddp-demo:abc", image_id=NEW, size=GiB, engine_id="engine-src")
    [st] = ship.survey(src, [ship.Target("n1", "unix:///run/n1.sock")])
    assert asked == ["unix:///run/n1.sock"] and st.engine_id == "engine-n1"
