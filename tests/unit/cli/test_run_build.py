"""`nodekit run --build`: the fix a stale image's refusal names (issue 32) builds first and runs what it built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodekit.backends.fleet import run as fleet
from nodekit.cli.app import app
from nodekit.image import builder as building


def test_run_build_builds_then_runs_that_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "nodekit.toml").write_text('name = "p"\nscript = "train.py"\nhosts = ["ssh://root@10.0.0.5"]\n')
    seen: dict[str, Any] = {}

    class Built:
        tag = "nodekit/p:0123456789ab"

    def fake_build(settings: Any, reporter: Any, **kw: Any) -> Built:
        seen["built"] = settings.project_dir
        return Built()

    def fake_run(settings: Any, hosts: Any, reporter: Any, on_line: Any, **kw: Any) -> int:
        seen["image"] = kw["image"]
        return 0

    monkeypatch.setattr(building, "build", fake_build)
    monkeypatch.setattr(fleet, "run", fake_run)
    done = CliRunner().invoke(app, ["run", "--build", "--config", str(tmp_path / "nodekit.toml")])
    assert done.exit_code == 0, done.output
    assert seen == {"built": tmp_path, "image": "nodekit/p:0123456789ab"}
