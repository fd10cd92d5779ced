"""The tour's commands as written: ``nodekit logs`` and ``nodekit down`` without a rank act on this host's nodes,
script arguments after ``--`` reach the script, and node 0 needs no ``--main`` (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from tests.fake_runner import FakeRunner

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS", "NODEKIT_MAIN", "NODEKIT_ARGS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NODEKIT_JOB_SECRET", "a-secret-of-twenty-chars")
    (tmp_path / "nodekit.toml").write_text('name = "t"\nscript = "train.py"\nnnodes = 2\nargs = ["--epochs", "5"]\n')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _projects(fake_runner: FakeRunner, *names: str) -> None:
    listed = [{"Name": n, "Status": "running(1)", "ConfigFiles": f"/x/{n}.yaml"} for n in names]
    fake_runner.on("compose", "ls", stdout=json.dumps(listed))


def test_down_without_a_rank_stops_every_node_of_the_project_on_this_host(
    project: Path, fake_runner: FakeRunner
) -> None:
    _projects(fake_runner, "nodekit-t-node0", "nodekit-t-node1", "nodekit-other-node0", "nodekit-t-node1x")
    result = runner.invoke(app, ["down"])
    assert result.exit_code == 0, result.output
    assert "node 0 (nodekit-t-node0) is down" in result.stdout
    assert "node 1 (nodekit-t-node1) is down" in result.stdout
    downs = [c.cmd for c in fake_runner.calls if "down" in c.cmd]
    assert len(downs) == 2 and all("nodekit-t-node0" in d or "nodekit-t-node1" in d for d in downs), downs


def test_down_with_nothing_here_says_so(project: Path, fake_runner: FakeRunner) -> None:
    _projects(fake_runner)
    result = runner.invoke(app, ["down"])
    assert result.exit_code == 0, result.output
    assert "nothing to stop" in result.stdout


def test_logs_without_a_rank_merges_this_hosts_nodes(project: Path, fake_runner: FakeRunner) -> None:
    _projects(fake_runner, "nodekit-t-node0", "nodekit-t-node1")
    fake_runner.on("--project-name", "nodekit-t-node0", "logs", stdout="epoch 1 loss 0.5\n")
    fake_runner.on("--project-name", "nodekit-t-node1", "logs", stdout="epoch 1 loss 0.4\n")
    result = runner.invoke(app, ["logs"])
    assert result.exit_code == 0, result.output
    assert "[node 0] epoch 1 loss 0.5" in result.stdout and "[node 1] epoch 1 loss 0.4" in result.stdout


def test_logs_with_no_node_here_names_the_fix(project: Path, fake_runner: FakeRunner) -> None:
    _projects(fake_runner)
    result = runner.invoke(app, ["logs"])
    assert result.exit_code == 2
    assert "no node of t is on this host" in result.stderr and "nodekit up" in result.stderr


def test_logs_and_down_of_a_node_that_is_not_here_say_so_and_touch_nothing(
    project: Path, fake_runner: FakeRunner
) -> None:
    """A --node-rank that names no node of the project on this host is named, as no node at all is, rather than a
    silent empty log or a "down" of nothing; the node that is here is not touched."""
    _projects(fake_runner, "nodekit-t-node0")
    logs = runner.invoke(app, ["logs", "--node-rank", "9"])
    assert logs.exit_code == 2 and "node 9 of t (nodekit-t-node9) is not on this host" in logs.stderr, logs.output
    down = runner.invoke(app, ["down", "--node-rank", "9"])
    assert down.exit_code == 0 and "node 9 of t (nodekit-t-node9) is not on this host: nothing to stop" in down.stdout
    assert not [c.cmd for c in fake_runner.calls if "logs" in c.cmd or "down" in c.cmd]
    fake_runner.on("--project-name", "nodekit-t-node0", "logs", stdout="epoch 1 loss 0.5\n")
    here = runner.invoke(app, ["logs", "--node-rank", "0"])
    assert here.exit_code == 0 and here.stdout == "[node 0] epoch 1 loss 0.5\n", here.output


@pytest.mark.parametrize("command", ["compose", "up"])
def test_arguments_after_the_double_dash_reach_the_script(project: Path, command: str) -> None:
    plan = ["-r", "1", "-m", "10.0.0.5", "--image", "nodekit/t:0123", "--dry-run"]
    result = runner.invoke(app, [command, *plan, "--", "--epochs", "1", "--lr", "3e-4"])
    assert result.exit_code == 0, result.output
    command_lines = result.stdout.split("command:\n", 1)[1].split("environment:", 1)[0].split()
    assert command_lines == ["-", "train.py", "-", "--epochs", "-", "'1'", "-", "--lr", "-", "3e-4"]
    plain = runner.invoke(app, [command, *plan])
    assert "- '5'" in plain.stdout  # without `--`, nodekit.toml's args


def test_run_passes_arguments_after_the_double_dash_to_every_node(project: Path) -> None:
    (project / "nodekit.toml").write_text(
        (project / "nodekit.toml").read_text() + 'hosts = ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"]\n'
    )
    result = runner.invoke(app, ["run", "--dry-run", "--image", "nodekit/t:0123", "--", "--lr", "3e-4"])
    assert result.exit_code == 0, result.output
    assert "command: train.py --lr 3e-4 (torchrun, on every node)" in result.stdout, result.stdout


def test_node_zero_needs_no_main(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.system.host import net

    monkeypatch.setattr(net, "default_address_here", lambda: "10.9.8.7")
    monkeypatch.setattr(net, "resolve", lambda a: a)
    from nodekit.job import gather

    monkeypatch.setattr(gather, "_facts_here", lambda rank, main_ip, host_network: _facts())
    result = runner.invoke(app, ["compose", "-r", "0", "--image", "nodekit/t:0123", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "MASTER_ADDR: 10.9.8.7" in result.stdout
    assert "main is 10.9.8.7, this host's address on its default route" in result.stdout
    worker = runner.invoke(app, ["compose", "-r", "1", "--image", "nodekit/t:0123", "--dry-run"])
    assert worker.exit_code == 2 and "pass --main" in worker.stderr


def _facts() -> object:
    from nodekit.system.host.facts import HostFacts

    return HostFacts(iface="eth0", local_addr="10.9.8.7")
