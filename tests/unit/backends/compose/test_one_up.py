"""One node per rank and project per host (issue 28): a second `nodekit up` of the same node is refused at once,
naming the first, and the first goes on; a crash of the first frees the node at once. The first is a real process
holding the node's host lock; the engine is a stand-in that records what `up` asked of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nodekit.backends.compose import node
from nodekit.config.settings import Settings
from nodekit.errors import UsageError
from nodekit.system import docker
from nodekit.system.host.facts import HostFacts
from nodekit.system.progress import RecordingReporter
from tests.factories import plan_here

ROOT = Path(__file__).resolve().parents[4]
FACTS = HostFacts(gpu_count=0, memlock_hard=None, stack_hard=None, iface="eth0", local_addr="10.0.0.5")

FIRST = """
import sys, time
from pathlib import Path
from nodekit.backends.compose import node
from nodekit.config.settings import Settings
from nodekit.system import docker
from nodekit.system.host.facts import HostFacts
from tests.factories import plan_here
docker.running = lambda project: []
facts = HostFacts(gpu_count=0, memlock_hard=None, stack_hard=None, iface="eth0", local_addr="10.0.0.5")
s = Settings(project_dir=Path(sys.argv[1]), name="once", script="train.py", nnodes=2)
plan = plan_here(s, 0, "10.0.0.5", image="nodekit/once:0123456789ab", facts=facts)
with node.one_up_here(plan):
    print("holding", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What `up` asked of the engine (nothing runs): its containers are those in ``running``."""
    asked: list[str] = []
    image = docker.ImageInfo(id="sha256:" + "0" * 64, tags=(), labels={}, size=0, identity="sha256:" + "0" * 64)
    monkeypatch.setattr(docker, "require_image", lambda *a, **k: image)
    monkeypatch.setattr(node, "check_master_port", lambda plan: None)
    monkeypatch.setattr(docker, "running", lambda project: asked.append("ps") or list(RUNNING))
    monkeypatch.setattr(docker, "compose_up", lambda path, project: asked.append("up"))
    return asked


RUNNING: list[str] = []


def plan(project: Path) -> node.NodePlan:
    (project / "train.py").write_text("print(1)\n")
    s = Settings(project_dir=project, name="once", script="train.py", nnodes=2)
    return plan_here(s, 0, "10.0.0.5", image="nodekit/once:0123456789ab", facts=FACTS)


def test_a_second_up_of_the_same_node_is_refused_naming_the_first_which_goes_on(
    tmp_path: Path, engine: list[str]
) -> None:
    p = plan(tmp_path)
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline() == "holding\n"
        with pytest.raises(UsageError) as refused:
            node.up(p, RecordingReporter(), detach=True, on_line=print)
        assert f"pid {first.pid} (nodekit up -r 0 in " in str(refused.value), refused.value
        assert "Fix: wait for it, or stop it (nodekit down --node-rank 0)" in refused.value.one_line()
        assert engine == [] and not p.compose_path.exists(), "the refused up touched the engine or the file"
        assert first.poll() is None, "the first up was disturbed"
        os.kill(first.pid, signal.SIGKILL)  # the first crashes: the kernel releases its lock
        first.wait()
        assert node.up(p, RecordingReporter(), detach=True, on_line=print) == 0
        assert engine == ["ps", "up"]
    finally:
        first.kill()
        first.wait()


def test_an_up_while_the_node_s_container_runs_is_refused_naming_it(tmp_path: Path, engine: list[str]) -> None:
    """A detached `up` holds no lock once it returned: its running container is what a second `up` finds (which
    would otherwise force-recreate it under the first's job)."""
    RUNNING[:] = ["nodekit-once-node0-train-1 (Up 3 minutes)"]
    try:
        with pytest.raises(UsageError, match=r"already runs on this host: container nodekit-once-node0-train-1"):
            node.up(plan(tmp_path), RecordingReporter(), detach=True, on_line=print)
    finally:
        RUNNING.clear()
    assert engine == ["ps"]


def test_other_ranks_projects_and_engines_do_not_exclude_each_other() -> None:
    names = {
        node.up_lock_name("nodekit-once-node0", None),
        node.up_lock_name("nodekit-once-node1", None),
        node.up_lock_name("nodekit-other-node0", None),
        node.up_lock_name("nodekit-once-node0", "unix:///run/nodekit-cluster/nkt/h1/docker.sock"),
    }
    assert len(names) == 4
    assert node.up_lock_name("nodekit-once-node0", None) == node.up_lock_name(
        "nodekit-once-node0", "unix:///var/run/docker.sock"
    )


@pytest.mark.parametrize(("code", "quoted"), [(1, True), (19, False)])
def test_a_failed_node_s_last_line_quotes_its_exception_unless_another_node_failed_first(
    tmp_path: Path, engine: list[str], monkeypatch: pytest.MonkeyPatch, code: int, quoted: bool
) -> None:
    """`nodekit up` follows its node's log; when the job fails, the last line quotes the first traceback's
    exception. Exit 19 (another node failed) is a consequence: this node's own gloo error is not the cause."""
    from nodekit.errors import JobFailed

    error = "RuntimeError: Connection closed by peer" if code == 19 else "ZeroDivisionError: oops"
    out = ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "t.py", line 3', f"[rank0]: {error}"]
    monkeypatch.setattr(node, "follow", lambda path, project: iter(out))
    monkeypatch.setattr(docker, "compose_wait", lambda path, project, service=None: code)
    with pytest.raises(JobFailed) as failed:
        node.up(plan(tmp_path), RecordingReporter(), detach=False, on_line=lambda line: None)
    expected = f"the job exited with code {code}" + (": rank 0 raised ZeroDivisionError: oops" if quoted else "")
    assert failed.value.message == expected


def test_a_node_stopped_from_another_shell_is_said_to_be_stopped_not_to_have_failed(
    tmp_path: Path, engine: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodekit down` in another shell ends the node's container with SIGTERM (143): `nodekit up` says it was
    stopped from outside and by what, not that the job failed (issue 46)."""
    from nodekit.errors import JobFailed

    monkeypatch.setattr(node, "follow", lambda path, project: iter(["[rank0]: Traceback (most recent call last):"]))
    monkeypatch.setattr(docker, "compose_wait", lambda path, project, service=None: 143)
    with pytest.raises(JobFailed) as failed:
        node.up(plan(tmp_path), RecordingReporter(), detach=False, on_line=lambda line: None)
    assert failed.value.message.startswith("the job was stopped from outside by SIGTERM (exit 143: nodekit down,")
    assert failed.value.exit_code == 143


def test_on_exit_19_the_last_line_quotes_the_other_node_s_failure_its_watchdog_named(
    tmp_path: Path, engine: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 raised on node 1; this node (0) saw only its own gloo error and exits 19. Its watchdog's line, printed
    by the launcher's own code, names node 1 with the exception node 1's done mark carried: the host's last line
    quotes the node named first (the nodes that failed after it are in that line above), not this node's
    consequence, and not just an exit code."""
    from nodekit.errors import JobFailed
    from nodekit.launcher.watchdog.failure import WorkerFailure, failed_line

    boom = WorkerFailure(rank=1, local_rank=0, exitcode=1, at=10, max_restarts=0, raised="RuntimeError: boom on rank 1")
    gloo = WorkerFailure(rank=0, local_rank=0, exitcode=1, at=11, max_restarts=0, raised="RuntimeError: [gloo] closed")
    names = {0: "10.0.0.5, host a", 1: "10.0.0.6, host b"}
    out = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "t.py", line 3',
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        "nodekit: error: a worker failed (torchrun's report: /outputs/nodekit/node-0.log)",
        failed_line([(0, 1, gloo), (1, 1, boom)], names, "the job failed (this node exits 19)"),
    ]
    monkeypatch.setattr(node, "follow", lambda path, project: iter(out))
    monkeypatch.setattr(docker, "compose_wait", lambda path, project, service=None: 19)
    with pytest.raises(JobFailed) as failed:
        node.up(plan(tmp_path), RecordingReporter(), detach=False, on_line=lambda line: None)
    assert failed.value.message == (
        "the job exited with code 19: node 1 (10.0.0.6, host b) failed: worker rank 1 (local rank 0) raised "
        "RuntimeError: boom on rank 1 (exit code 1); torchrun restarts no worker (max_restarts = 0)"
    )
