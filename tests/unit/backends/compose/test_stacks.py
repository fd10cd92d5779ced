"""``nodekit stacks`` on the host (nodekit/backends/compose/stacks.py, nodekit/cli/stacks.py): the exact docker command
lines, each node's answer read (what real nodes printed, tests/unit/launcher/fixtures), and every way a node can fail
to answer, said in one line with its fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.backends.compose.stacks import READER, Target, gather, read_node
from nodekit.errors import NodekitError
from nodekit.system import docker, proc
from tests.fake_runner import FakeRunner

FIXTURES = Path(__file__).resolve().parents[2] / "launcher" / "fixtures"


def answer(node: int) -> str:
    return (FIXTURES / f"mismatch-node{node}.json").read_text()


def test_a_node_is_read_through_its_own_engine_by_the_images_reader_in_one_call(fake_runner: FakeRunner) -> None:
    fake_runner.on("exec", stdout=answer(1))
    found = read_node(Target(1, "nodekit-demo-node1", "ssh://root@n1", None, "root@n1"))
    assert found is not None and [(s.rank, s.node) for s in found] == [(1, 1)]
    assert [c.cmd for c in fake_runner.calls] == [
        ["docker", "--host", "ssh://root@n1", "exec", "nodekit-demo-node1-train-1",
         "/opt/venv/bin/python", "-m", "nodekit.launcher.stacks"],
    ]  # fmt: skip
    assert fake_runner.only("exec").deadline == 60.0 and READER[-1] == "nodekit.launcher.stacks"


def test_a_container_named_otherwise_is_found_through_its_project(fake_runner: FakeRunner) -> None:
    fake_runner.on("exec", stderr="Error response from daemon: No such container: x\n", returncode=1)
    fake_runner.on("ps", "--quiet", stdout="c0ffee\n")
    fake_runner.on("exec", "c0ffee", stdout=answer(0))
    found = read_node(Target(0, "nodekit-demo-node0"))
    assert found is not None and [s.rank for s in found] == [0]
    assert [c.cmd[:4] for c in fake_runner.calls] == [
        ["docker", "exec", "nodekit-demo-node0-train-1", "/opt/venv/bin/python"],
        ["docker", "compose", "--project-name", "nodekit-demo-node0"],
        ["docker", "exec", "c0ffee", "/opt/venv/bin/python"],
    ]
    assert fake_runner.calls[1].cmd[-3:] == ["ps", "--quiet", "train"]


@pytest.mark.parametrize("why", ["No such container: nodekit-demo-node0-train-1", "container 1f2e is not running"])
def test_a_node_without_a_running_container_is_absent_not_an_error(fake_runner: FakeRunner, why: str) -> None:
    fake_runner.on("exec", stderr=f"Error response from daemon: {why}\n", returncode=1)
    fake_runner.on("ps", "--quiet", stdout="")
    assert read_node(Target(0, "nodekit-demo-node0")) is None
    assert [c.cmd[-3:] for c in fake_runner.calls][1] == ["ps", "--quiet", "train"]


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "says", "fix"),
    [
        ("", "/opt/venv/bin/python: No module named nodekit.launcher.stacks\n", 1, "No module named",
         "nodekit build, then start the job again: its image predates nodekit stacks"),
        ("", "OCI runtime exec failed: exec failed: unable to start container process\n", 126, "unable to start",
         "docker exec into nodekit-demo-node0's container on this host and run /opt/venv/bin/python -m "
         "nodekit.launcher.stacks"),
        ("Traceback (most recent call last):\n", "", 0, "answered something other than nodekit's stack format",
         "nodekit build, then start the job again, so that the image's launcher matches this nodekit"),
    ],
)  # fmt: skip
def test_a_node_that_cannot_be_read_is_one_line_with_its_fix(
    fake_runner: FakeRunner, stdout: str, stderr: str, code: int, says: str, fix: str
) -> None:
    fake_runner.on("exec", stdout=stdout, stderr=stderr, returncode=code)
    with pytest.raises(NodekitError) as e:
        read_node(Target(0, "nodekit-demo-node0"))
    assert says in e.value.message and e.value.fix == fix


def test_gather_sorts_answers_absences_and_failures() -> None:
    def read(t: Target) -> list[object] | None:
        if t.rank == 2:
            raise NodekitError(f"cannot read the stacks of node 2 on {t.where}: boom", fix="look")
        return None if t.rank == 1 else read_node_like(t)

    def read_node_like(t: Target) -> list[object]:
        from nodekit.launcher.stacks import collect
        from nodekit.launcher.stacks.places import RankStack

        return [RankStack.of(p, t.rank) for p in collect.from_json(answer(0))]

    found = gather([Target(r, f"p{r}", where=f"h{r}") for r in (0, 1, 2)], read=read)  # type: ignore[arg-type]
    assert [s.rank for s in found.stacks] == [0]
    assert found.absent_lines() == ["node 1 runs no container of the job on h1 (p1)"]
    assert found.problems == ["cannot read the stacks of node 2 on h2: boom. Fix: look"]
    assert found.nothing_runs() is None


# ---- the command ---------------------------------------------------------------------------------------------


def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: str = "") -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text(f'name = "t"\nscript = "train.py"\nnnodes = 2\n{hosts}')
    monkeypatch.chdir(tmp_path)


def engines(monkeypatch: pytest.MonkeyPatch, answers: dict[str, proc.Result | None]) -> list[tuple[str, object]]:
    """docker.compose_exec answering per compose project; the calls made."""
    asked: list[tuple[str, object]] = []

    def exec_(file: object, name: str, service: str, argv: list[str], *, host: str | None = None,
              deadline: float) -> object:  # fmt: skip
        asked.append((name, host))
        return answers[name]

    monkeypatch.setattr(docker, "compose_exec", exec_)
    return asked


def ok(node: int) -> proc.Result:
    return proc.Result((), 0, answer(node), "")


def test_nodekit_stacks_groups_both_nodes_of_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.cli.app import app

    project(tmp_path, monkeypatch)
    asked = engines(monkeypatch, {"nodekit-t-node0": ok(0), "nodekit-t-node1": ok(1)})
    result = CliRunner().invoke(app, ["stacks"])
    assert result.exit_code == 0, result.output
    assert sorted(asked) == [("nodekit-t-node0", None), ("nodekit-t-node1", None)]
    out = result.stdout
    assert out.startswith("2 rank(s) on 2 node(s), 2 place(s):\n"), out
    assert re.search(r"^  rank 0 in all_reduce at stall\.py:\d+$", out, re.M), out
    assert re.search(r"^  rank 1 in all_gather at stall\.py:\d+$", out, re.M), out


def test_nodekit_stacks_says_when_no_node_runs_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.cli.app import app

    project(tmp_path, monkeypatch)
    engines(monkeypatch, {"nodekit-t-node0": ok(0), "nodekit-t-node1": None})
    one = CliRunner().invoke(app, ["stacks"])
    assert one.exit_code == 0 and one.stdout.startswith("1 rank(s) on 1 node(s)") and one.stderr == "", one.output
    engines(monkeypatch, {"nodekit-t-node0": None, "nodekit-t-node1": None})
    none = CliRunner().invoke(app, ["stacks"])
    assert none.exit_code == 1 and none.stdout == ""
    assert none.stderr.strip() == (
        "nodekit: error: no node of the job runs a container on this host. "
        "Fix: nodekit ps (or nodekit status), then nodekit up or nodekit run"
    )
    asked = CliRunner().invoke(app, ["stacks", "--node", "1"])
    assert asked.exit_code == 1 and "node 1 runs no container of the job on this host (nodekit-t-node1)" in asked.stderr
    bad = CliRunner().invoke(app, ["stacks", "--node", "2"])
    assert bad.exit_code == 2 and "--node 2 is not one of 0..1" in bad.stderr


def test_nodekit_stacks_over_the_fleet_names_a_host_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodekit.cli.app import app

    project(tmp_path, monkeypatch, hosts='hosts = ["ssh://a", "ssh://b"]\n')
    failed = proc.Result((), 255, "", "ssh: connect to host b port 22: Connection refused\n")
    asked = engines(monkeypatch, {"nodekit-t-node0": ok(0), "nodekit-t-node1": failed})
    result = CliRunner().invoke(app, ["stacks"])
    assert result.exit_code == 1, result.output
    assert sorted(asked) == [("nodekit-t-node0", "ssh://a"), ("nodekit-t-node1", "ssh://b")]
    assert result.stdout.startswith("1 rank(s) on 1 node(s)")
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert line.startswith("nodekit: error: stacks: cannot read the stacks of node 1 on b: ssh: connect to host b")
