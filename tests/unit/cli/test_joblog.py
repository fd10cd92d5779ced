"""A tqdm bar in a job's log, through the real log stream and printer: one line per node per second at most, where
every redraw was a line of its own (issue 32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.system import docker
from tests.fake_runner import FakeRunner

runner = CliRunner()
BAR = "".join(f"\r{i:3d}%|{'#' * (i // 10):<10}| {i}/100" for i in range(100)) + "\r100%|##########| 100/100\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "t"\nscript = "train.py"\nnnodes = 2\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_log_stream_keeps_a_redraws_carriage_return(fake_runner: FakeRunner) -> None:
    fake_runner.on("logs", stdout="start\r\n 1%\r 2%\r\rdone\nlast")
    assert list(docker.compose_logs(None, "p", follow=False)) == ["start", " 1%\r", " 2%\r", "done", "last"]


def test_a_progress_bar_is_one_line_per_node_not_one_per_redraw(project: Path, fake_runner: FakeRunner) -> None:
    fake_runner.on("compose", "ls", stdout=json.dumps([{"Name": "nodekit-t-node0", "Status": "exited(1)"}]))
    fake_runner.on("--project-name", "nodekit-t-node0", "logs", stdout=f"epoch 1\n{BAR}epoch 2\n")
    result = runner.invoke(app, ["logs", "--node-rank", "0"])
    assert result.exit_code == 0, result.output
    # the redraws arrive together here, so one of them is shown, then the bar's end
    assert result.stdout.splitlines() == [
        "[node 0] epoch 1",
        "[node 0]   0%|          | 0/100",
        "[node 0] 100%|##########| 100/100",
        "[node 0] epoch 2",
    ]
