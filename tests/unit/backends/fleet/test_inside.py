"""nodekit exec's command lines, through the fake runner: docker exec in a running container, a snapshot of an
ended one run as the job's container was set up, the lookup by compose project, and --all's prefixed lines."""

from __future__ import annotations

import json

import pytest

from nodekit.backends.fleet import inside
from nodekit.backends.fleet.hosts import parse_host
from nodekit.backends.fleet.targets import Target
from tests.fake_runner import FakeRunner

ID = "c0ffee" + "0" * 58


def container(running: bool, **host: object) -> str:
    state = {"Running": running, "Status": "running" if running else "exited"}
    doc = {"Id": ID, "Name": "/nodekit-demo-node1-train-1", "State": state,
           "HostConfig": {"NetworkMode": "host", "IpcMode": "host", **host}}  # fmt: skip
    return json.dumps([doc])


def node1() -> Target:
    return Target(1, "nodekit-demo-node1", parse_host("ssh://me@10.0.0.6", 1))


def test_a_running_container_gets_docker_exec_with_the_terminal(fake_runner: FakeRunner) -> None:
    fake_runner.on("ps", stdout=ID + "\n")
    fake_runner.on("container", "inspect", stdout=container(True))
    fake_runner.on("exec", returncode=3)
    assert inside.run_one(node1(), ["bash", "-l"], stdin=True, tty=True) == 3
    ps = fake_runner.only("ps")
    assert ps.cmd == ["docker", "--host", "ssh://me@10.0.0.6", "ps", "--all", "--quiet", "--no-trunc", "--filter",
                      "label=com.docker.compose.project=nodekit-demo-node1"]  # fmt: skip
    ex = fake_runner.only("exec")
    assert ex.cmd == ["docker", "--host", "ssh://me@10.0.0.6", "exec", "-i", "-t", ID, "bash", "-l"]
    assert ex.group is False, "a terminal's keys reach only its foreground process group"
    assert not [c for c in fake_runner.calls if "commit" in c.cmd]


def test_an_ended_container_is_copied_with_its_mounts_network_gpus_and_limits(fake_runner: FakeRunner) -> None:
    fake_runner.on("ps", stdout=ID + "\n")
    limits = [{"Name": "memlock", "Soft": -1, "Hard": -1}, {"Name": "stack", "Soft": 67108864, "Hard": 67108864}]
    fake_runner.on("container", "inspect", stdout=container(False, DeviceRequests=[{"Count": -1}], Ulimits=limits))
    assert inside.run_one(node1(), ["ls", "/outputs"], stdin=False, tty=False) == 0
    commit = fake_runner.only("commit")
    ref = commit.cmd[-1]
    assert commit.cmd[3:6] == ["commit", "--pause=false", ID] and ref.startswith(
        "nodekit-exec/nodekit-demo-node1-train-1:"
    )
    run = fake_runner.only("run", "--rm")
    assert run.cmd[3:] == [
        "run", "--rm", "--volumes-from", ID, "--label", "com.docker.compose.project=nodekit-exec", "--pull", "never",
        "--network", "host", "--ipc", "host", "--gpus", "all", "--ulimit=memlock=-1:-1",
        "--ulimit=stack=67108864:67108864", "--entrypoint", "ls", ref, "/outputs",
    ]  # fmt: skip
    assert fake_runner.only("image", "rm").cmd[-1] == ref, "the snapshot is removed afterwards"
    names = [c.cmd[3] for c in fake_runner.calls]
    assert names == ["ps", "container", "commit", "run", "image"]


def test_a_node_without_a_container_is_named_with_the_fix(fake_runner: FakeRunner) -> None:
    with pytest.raises(inside.NoContainer, match=r"node 1 \(me@10.0.0.6\) has no container of nodekit-demo-node1"):
        inside.run_one(node1(), ["true"], stdin=False, tty=False)


def test_every_node_at_once_with_each_line_named_and_the_first_failure(fake_runner: FakeRunner) -> None:
    fake_runner.on("ps", stdout=ID + "\n")
    fake_runner.on("container", "inspect", stdout=container(True))
    fake_runner.on("exec", stdout="2.13.0+cpu\n")
    fake_runner.on("--host", "ssh://me@h2", "exec", stdout="boom\n", returncode=7)
    targets = [Target(r, f"p{r}", parse_host(f"ssh://me@h{r}", r)) for r in range(3)]
    lines: list[tuple[int, str]] = []
    ended = inside.run_all(
        targets, ["python", "-c", "import torch; print(torch.__version__)"], lambda r, t: lines.append((r, t))
    )
    assert sorted(lines) == [(0, "2.13.0+cpu"), (1, "2.13.0+cpu"), (2, "boom")]
    assert [e.code for e in ended] == [0, 0, 7]
    failed = inside.first_failure(ended)
    assert failed is not None and failed.target.rank == 2
    assert all(c.group for c in fake_runner.calls if "exec" in c.cmd), "--all's children end with nodekit"
