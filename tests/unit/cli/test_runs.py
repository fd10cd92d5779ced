"""nodekit runs, runs show, runs report, and the refusals of exec and top, through the real CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.config import settings as config
from nodekit.runs import store
from nodekit.runs.recorder import begin

runner = CliRunner()
HOSTS = [(0, "root@10.0.0.1"), (1, "root@10.0.0.2"), (2, "root@10.0.0.3")]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 3\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def two_runs(project: Path) -> tuple[str, str]:
    settings = config.load(project / "nodekit.toml")
    now = [1_795_000_000.0]
    ok = begin(settings, "run", HOSTS, environ={}, clock=lambda: now[0])
    now[0] += 42
    ok.finish(0)
    now[0] += 3600
    bad = begin(settings, "run", HOSTS, environ={}, clock=lambda: now[0])
    for r in range(3):
        bad.phase(r, "started")
        bad.line(r, f"step 1 on {r}")
    now[0] += 10
    bad.exited(2, 137)
    bad.failed(2, 137, "node 2 failed with exit code 137")
    bad.finish(137)
    return ok.dir.name, bad.dir.name


def test_runs_lists_newest_first_with_the_failing_node_and_signal(project: Path) -> None:
    ok, bad = two_runs(project)
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "COMMAND", "STARTED"]
    assert lines[1].startswith(bad) and "failed" in lines[1] and "137" in lines[1]
    assert lines[1].endswith("node 2 (root@10.0.0.3) SIGKILL")
    assert lines[2].startswith(ok) and " ok " in lines[2] and "42s" in lines[2]
    listed = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert [(r["id"], r["state"], r["exit_code"], r["failed_rank"], r["signal"]) for r in listed] == [
        (bad, "failed", 137, 2, "SIGKILL"), (ok, "ok", 0, None, None)
    ]  # fmt: skip


def test_show_prints_one_run_with_its_phases_and_log(project: Path) -> None:
    _, bad = two_runs(project)
    result = runner.invoke(app, ["runs", "show", bad[:17], "--log"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"run      {bad} (nodekit run" in out and "exit code 137" in out
    assert "failed   node 2 (root@10.0.0.3) SIGKILL: node 2 failed with exit code 137" in out
    assert "[node 2] step 1 on 2" in out and "last lines of node 2:" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("2     root@10.0.0.3"))
    assert row.split()[-1] == "137" and "+0.0s" in row
    shown = json.loads(runner.invoke(app, ["runs", "show", "last", "--json"]).stdout)
    assert shown["id"] == bad and shown["state"] == "failed" and shown["nodes"][2]["exit_code"] == 137


def test_report_writes_one_page_and_prints_where(project: Path) -> None:
    _, bad = two_runs(project)
    result = runner.invoke(app, ["runs", "report", "last"])
    assert result.exit_code == 0, result.output
    path = Path(result.stdout.strip())
    assert path == store.runs_dir(project) / bad / "report.html" and '<svg id="timeline"' in path.read_text()
    out = project / "r.html"
    assert runner.invoke(app, ["runs", "report", bad, "-o", str(out)]).exit_code == 0 and out.is_file()


@pytest.mark.parametrize("where", ["report.html", "run"])
def test_report_refuses_a_link_a_cloned_repository_shipped_in_a_run(
    project: Path, tmp_path_factory: pytest.TempPathFactory, where: str
) -> None:
    """A clone ships .nodekit/runs/<id>/report.html -> a file of the user's, or a run directory that is a link to
    one of the user's directories: the report is refused in one line, never written through (review 2026-12, N3)."""
    _, bad = two_runs(project)
    home = tmp_path_factory.mktemp("home")
    (home / "report.html").write_text("the user's\n")
    run = store.runs_dir(project) / bad
    if where == "run":
        moved = store.runs_dir(project) / "elsewhere"
        run.rename(moved)
        for f in moved.iterdir():
            f.rename(home / f.name)
        moved.rmdir()
        run.symlink_to(home, target_is_directory=True)
        link = run
    else:
        link = run / "report.html"
        link.symlink_to(home / "report.html")
    result = runner.invoke(app, ["runs", "report", bad])
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and f"{link} is a symbolic link" in lines[0], result.output
    assert (home / "report.html").read_text() == "the user's\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["runs", "show", "1999"], "no run with id '1999'"),
        (["exec", "--", "hostname"], "give -r R for one node or --all"),
        (["exec", "-r", "1", "--all", "--", "hostname"], "give -r R for one node or --all"),
        (["exec", "--all", "--tty", "--", "bash"], "--all runs without a terminal"),
        (["exec", "--all"], "no command to run"),
        (["exec", "-r", "5", "--", "hostname"], "node 5 is not one of this job's nodes 0..2"),
        (["top", "--json"], "--json prints one table"),
        (["top", "-r", "3", "--once"], "node 3 is not one of this job's nodes 0..2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(project: Path, args: list[str], needle: str) -> None:
    if args[:2] == ["runs", "show"]:
        two_runs(project)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nodekit: error:") and "Fix:" in lines[0], result.stderr
    assert needle in lines[0]


def test_no_records_yet_says_how_one_is_made(project: Path) -> None:
    result = runner.invoke(app, ["runs", "show"])
    assert result.exit_code == 2 and "no run records" in result.stderr
    listed = runner.invoke(app, ["runs"])
    assert listed.exit_code == 0 and len(listed.stdout.splitlines()) == 1


def test_a_refused_run_is_listed_as_refused_with_its_reason_not_as_failed(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nodekit run` refused before any node started (here: the script is missing) changed nothing anywhere: the
    list says so, and why, instead of a failed run beside the runs that did fail."""
    (project / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nhosts = ["ssh://a", "ssh://b"]\n')
    (project / "train.py").unlink()
    monkeypatch.setenv("PATH", str(project))  # no ssh, no docker here: nothing may be contacted
    refused = runner.invoke(app, ["run"])
    assert refused.exit_code == 2, refused.output
    listed = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    said = [(r["command"], r["state"], r["exit_code"], r["failed_rank"]) for r in listed]
    assert said == [("run", "refused", 2, None)]
    row = runner.invoke(app, ["runs"]).stdout.splitlines()[1]
    assert " refused " in row and "failed" not in row, row
    shown = runner.invoke(app, ["runs", "show", "last"]).stdout
    assert "state    refused, exit code 2" in shown and "refused  training script train.py not found" in shown, shown


def test_a_run_whose_nodes_started_and_then_exited_2_is_failed_not_refused(project: Path) -> None:
    """Exit 2 from a node's launcher (bad input found inside the container) comes after nodes started: a failure."""
    from nodekit.errors import JobFailed
    from nodekit.runs.recorder import recording

    settings = config.load(project / "nodekit.toml")
    with pytest.raises(JobFailed), recording(settings, "run", HOSTS, warn=lambda _: None) as rec:
        rec.phase(0, "started")
        raise JobFailed("node 0 failed with exit code 2", exit_code=2)
    listed = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert [(r["state"], r["exit_code"]) for r in listed] == [("failed", 2)]
