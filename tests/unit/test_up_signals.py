"""`nodekit up` removes what it started when it is stopped: Ctrl-C, SIGTERM or SIGHUP, during `compose up` or
while following the logs. The engine is a recorder here; the real signal is delivered to this process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit import docker, node
from nodekit.progress import RecordingReporter
from nodekit.settings import Settings
from tests.unit.test_compose_render import CPU_NODE


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(docker, "check_engine", lambda **kw: None)
    monkeypatch.setattr(docker, "require_image", lambda *a, **k: None)
    monkeypatch.setattr(node, "check_master_port", lambda plan: None)
    monkeypatch.setattr(docker, "compose_down", lambda path, project, timeout: seen.append("down"))
    monkeypatch.setattr(docker, "compose_stop", lambda path, project, timeout: seen.append("stop"))
    monkeypatch.setattr(docker, "compose_wait", lambda path, project: 0)
    return seen


def plan(tmp_path: Path) -> node.NodePlan:
    (tmp_path / "train.py").write_text("print(1)\n")
    s = Settings(project_dir=tmp_path, name="sig", script="train.py", nnodes=2)
    return node.plan_node(s, 1, "10.0.0.5", image="nodekit/sig:0123456789ab", facts=CPU_NODE)


def signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_following_removes_the_container(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    monkeypatch.setattr(docker, "compose_up", lambda path, project: calls.append("up"))

    def follow(path: Path, project: str) -> Iterator[str]:
        yield "step 1"
        signal_self(signum)
        yield "never shown"

    monkeypatch.setattr(node, "follow", follow)
    shown: list[str] = []
    before = signal.getsignal(signum)
    assert node.up(plan(tmp_path), RecordingReporter(), detach=False, on_line=shown.append) == code
    assert calls == ["up", "down"] and shown == ["step 1"]
    assert signal.getsignal(signum) == before, "up must put the previous handler back"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_compose_up_removes_what_it_started(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    def compose_up(path: Path, project: str) -> None:
        calls.append("up")
        signal_self(signum)  # SIGINT: Python's default handler raises KeyboardInterrupt

    monkeypatch.setattr(docker, "compose_up", compose_up)
    code = node.up(plan(tmp_path), RecordingReporter(), detach=True, on_line=print)
    assert code == (130 if signum == signal.SIGINT else 143)
    assert calls == ["up", "down"]
