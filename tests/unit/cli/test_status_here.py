"""`nodekit status` without hosts (nodes started by hand with `nodekit up`) shows this host's nodes, as `nodekit ps`
does, instead of refusing with "no hosts configured" (issue 46)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.system import docker
from nodekit.system.docker.models import ContainerState

runner = CliRunner()


def test_status_without_hosts_lists_this_hosts_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "here"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    states = {"nodekit-here-node1": [ContainerState(name="c1", status="exited", running=False, exit_code=3)]}
    monkeypatch.setattr(docker, "compose_ps", lambda path, project: states.get(project, []))
    shown = runner.invoke(app, ["status"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[1].split() == ["1", "nodekit-here-node1", "exited", "3"]
    as_json = runner.invoke(app, ["status", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == [
        {"node": 1, "project": "nodekit-here-node1", "state": "exited", "exit_code": 3}
    ]


def test_logs_after_a_finished_run_says_where_its_output_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished `nodekit run` removes its containers: `nodekit logs` then has nothing to print, and says where the
    run's output is instead of printing nothing (issue 46)."""
    from nodekit.backends.fleet import manage

    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "gone"\nscript = "t.py"\nhosts = ["ssh://a", "ssh://b"]\n')
    (tmp_path / "t.py").write_text("")
    monkeypatch.chdir(tmp_path)
    lines: list[tuple[int, str]] = []
    monkeypatch.setattr(manage, "logs", lambda s, h, on_line, **k: [on_line(r, t) for r, t in lines] and [])
    shown = runner.invoke(app, ["logs"])
    assert shown.exit_code == 0, shown.output
    assert "no output from any node" in shown.stderr and "nodekit runs show last --log" in shown.stderr
    lines.append((1, "epoch 3"))
    shown = runner.invoke(app, ["logs"])
    assert "epoch 3" in shown.stdout and "no output" not in shown.stderr
