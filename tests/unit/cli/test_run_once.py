"""Two `nodekit run` of one project on the same hosts at once (review N6): the later one is refused at once with exit
2, naming the earlier (pid, command, since when) and the fix, before it records a run or reaches any host; the earlier
goes on untouched, and once it ends (a crash included) the project runs again. The earlier is a real process running
the same CLI path (its run blocked in place of the fleet's), holding the real lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodekit.backends.fleet import run as fleet
from nodekit.cli.app import app

ROOT = Path(__file__).resolve().parents[3]
CONFIG = 'name = "twice"\nscript = "train.py"\nhosts = ["ssh://root@10.0.0.5", "ssh://root@10.0.0.6"]\n'

FIRST = """
import os, sys, time
from typer.testing import CliRunner
from nodekit.backends.fleet import run as fleet
from nodekit.cli.app import app

def blocked(*a, **k):
    os.write(1, b"holding\\n")
    time.sleep(120)
    return 0

fleet.run = blocked
CliRunner().invoke(app, ["run", "--image", "nodekit/twice:0123456789ab", "--config", sys.argv[1]])
"""


def runs(project: Path) -> list[Path]:
    return sorted((project / ".nodekit" / "runs").glob("*")) if (project / ".nodekit" / "runs").exists() else []


def test_a_second_run_of_the_project_is_refused_naming_the_first_which_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    (project / "nodekit.toml").write_text(CONFIG)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    ran: list[Any] = []
    monkeypatch.setattr(fleet, "run", lambda *a, **k: ran.append(a) or 0)
    argv = ["run", "--image", "nodekit/twice:0123456789ab", "--config", str(project / "nodekit.toml")]
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(project / "nodekit.toml")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout is not None and first.stderr is not None
        said_first = first.stdout.readline()
        # Seen once (stop 55): the first run ended without a line; what it said on stderr is the diagnosis.
        assert said_first == "holding\n", f"the first run said {said_first!r}, then ended: {first.stderr.read()}"
        recorded = runs(project)
        second = CliRunner().invoke(app, argv)
        assert second.exit_code == 2, second.output
        said = " ".join(second.output.split())
        assert f"project twice is already being run on these hosts by pid {first.pid} (nodekit run in {ROOT}" in said
        assert "since " in said and "Fix: wait for it to end, or stop it" in said, said
        assert ran == [] and runs(project) == recorded, "the refused run reached the hosts or recorded a run"
        assert first.poll() is None, "the first run was disturbed"
        os.kill(first.pid, signal.SIGKILL)  # the first crashes: the kernel releases its lock
        first.wait()
        again = CliRunner().invoke(app, argv)
        assert again.exit_code == 0, again.output
        assert len(ran) == 1
    finally:
        first.kill()
        first.wait()


def test_other_projects_and_other_hosts_do_not_exclude_each_other() -> None:
    from nodekit.backends.fleet.hosts import parse_host
    from nodekit.backends.fleet.once import run_lock_name

    a, b, c = (parse_host(f"ssh://root@10.0.0.{i}", 0) for i in (5, 6, 7))
    names = {run_lock_name("twice", [a, b]), run_lock_name("other", [a, b]), run_lock_name("twice", [a, c])}
    assert len(names) == 3
    assert run_lock_name("twice", [a, b]) == run_lock_name("twice", [b, a])
