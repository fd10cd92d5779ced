"""`nodekit up` removes what it started when it is stopped: Ctrl-C, SIGTERM or SIGHUP, during `compose up` or
while following the logs. The real signal is delivered to this process under nodekit.system.proc.stopping (what the CLI
installs around every command); `compose up` is a real process group standing in for docker compose."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodekit.backends.compose import node
from nodekit.config.settings import Settings
from nodekit.system import docker, proc
from nodekit.system.docker import compose
from nodekit.system.progress import RecordingReporter
from tests.factories import CPU_NODE, gone, plan_here

CODES = [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    image = docker.ImageInfo(id="sha256:" + "0" * 64, tags=(), labels={}, size=0)
    monkeypatch.setattr(docker, "require_image", lambda *a, **k: image)
    monkeypatch.setattr(docker, "running", lambda project: [])
    monkeypatch.setattr(node, "check_master_port", lambda plan: None)
    monkeypatch.setattr(docker, "compose_down", lambda path, project, timeout: seen.append("down"))
    monkeypatch.setattr(docker, "compose_stop", lambda path, project, timeout: seen.append("stop"))
    monkeypatch.setattr(docker, "compose_wait", lambda path, project, service=None: 0)
    return seen


def plan(tmp_path: Path) -> node.NodePlan:
    (tmp_path / "train.py").write_text("print(1)\n")
    s = Settings(project_dir=tmp_path, name="sig", script="train.py", nnodes=2)
    return plan_here(s, 1, "10.0.0.5", image="nodekit/sig:0123456789ab", facts=CPU_NODE)


def signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize(("signum", "code"), CODES)
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
    with pytest.raises(proc.Interrupted) as e, proc.stopping():
        node.up(plan(tmp_path), RecordingReporter(), detach=False, on_line=shown.append)
    assert e.value.exit_code == code and e.value.signum == signum
    assert calls == ["up", "down"] and shown == ["step 1"]
    assert signal.getsignal(signum) == before, "the previous handler must be put back"


@pytest.mark.parametrize(("signum", "code"), CODES)
def test_a_signal_during_compose_up_ends_its_process_group_before_down(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    """SIGTERM ends `docker compose up` itself, not only the `timeout` wrapper python-on-whales runs compose under:
    an orphaned `docker compose up` would create the container after `down` had run."""
    pidfile = tmp_path / "grandchild.pid"
    real_argv = compose.compose_argv

    def argv(host: str | None, file: Path | None, project: str, *args: str) -> list[str]:
        if args[:1] == ("up",):  # compose up and a child of its own (the docker CLI's plugin, its ssh)
            return ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]
        return real_argv(host, file, project, *args)

    monkeypatch.setattr(compose, "compose_argv", argv)
    at_down: list[bool] = []
    monkeypatch.setattr(docker, "compose_down", lambda path, project, timeout: at_down.append(gone(grandchild())))

    def grandchild() -> int:
        return int(pidfile.read_text())

    sender = threading.Thread(target=lambda: (wait_for(pidfile), signal_self(signum)), daemon=True)
    with pytest.raises(proc.Interrupted) as e, proc.stopping(grace=2):
        sender.start()  # the signal comes once compose up (and its child) runs, inside the handler's reach
        node.up(plan(tmp_path), RecordingReporter(), detach=True, on_line=print)
    sender.join(10)
    assert e.value.exit_code == code
    assert at_down == [True], "compose up's process group must be gone before down runs"
    assert proc.live() == []


def wait_for(path: Path, within: float = 10) -> None:
    end = time.monotonic() + within
    while not (path.is_file() and path.read_text().strip()) and time.monotonic() < end:
        time.sleep(0.02)


def test_a_second_signal_does_not_interrupt_the_cleanup(
    tmp_path: Path, calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user pressing Ctrl-C twice, or SIGHUP then SIGTERM, must not leave the container half-removed."""
    monkeypatch.setattr(docker, "compose_up", lambda path, project: signal_self(signal.SIGTERM))

    def down(path: Path, project: str, timeout: int) -> None:
        signal_self(signal.SIGINT)
        time.sleep(0.2)  # a signal handler raising here would cut the removal short
        calls.append("down")

    monkeypatch.setattr(docker, "compose_down", down)
    with pytest.raises(proc.Interrupted) as e, proc.stopping() as received:
        node.up(plan(tmp_path), RecordingReporter(), detach=True, on_line=print)
    assert e.value.exit_code == 143 and calls == ["down"]
    assert received == [signal.SIGTERM, signal.SIGINT]
