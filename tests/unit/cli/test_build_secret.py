"""`nodekit build` leaves the project's job secret in .nodekit/job-secret (0600): the by-hand flow copies it to
every worker right after the build and push, before any `nodekit up` would have made it (issue 46)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodekit.cli import images
from nodekit.cli.app import app
from nodekit.image import builder

runner = CliRunner()


class _Built:
    def summary(self) -> str:
        return "built"


@pytest.mark.parametrize("shell_secret", [False, True])
def test_build_leaves_the_job_secret_to_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shell_secret: bool
) -> None:
    for var in ("NODEKIT_CONFIG", "NODEKIT_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)
    if shell_secret:  # one exported for every node: nothing is written
        monkeypatch.setenv("NODEKIT_JOB_SECRET", "s" * 32)
    (tmp_path / "nodekit.toml").write_text('name = "sec"\nscript = "train.py"\n')
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(images, "base_when_missing", lambda *a: None)
    monkeypatch.setattr(builder, "build", lambda *a, **k: _Built())
    made = runner.invoke(app, ["build"])
    assert made.exit_code == 0, made.output
    path = tmp_path / ".nodekit" / "job-secret"
    assert path.exists() != shell_secret
    if not shell_secret:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text().strip()) == 32
        assert path.read_text().strip() not in made.output
    dry: Any = runner.invoke(app, ["build", "--dry-run"])
    assert dry.exit_code == 0
