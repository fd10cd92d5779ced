"""Every backend's plan has one shape (nodekit/backends/shape.py) and every CLI's --dry-run prints it through one
path: what the dry run prints is the plan object the command would otherwise apply."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.backends.compose import node
from nodekit.backends.fleet import plan as fleet
from nodekit.backends.fleet.hosts import hosts_of
from nodekit.backends.fleet.nodes import gather
from nodekit.backends.k8s import plan as k8s
from nodekit.backends.shape import BackendPlan, PlannedFile
from nodekit.cli.app import app
from nodekit.config.settings import Settings, load
from nodekit.job.gather import gather_node
from nodekit.job.spec import LaunchSpec, launch_spec

runner = CliRunner()
SECRET = "s3cr3t" * 4


def test_shown_is_steps_then_each_file_under_its_heading_then_notes_and_warnings_with_secrets_masked() -> None:
    plan = BackendPlan(
        "toy",
        detail=None,
        files=(
            PlannedFile(Path("out/a.yaml"), f"key: {SECRET}\n", secret=SECRET, about="project p"),
            PlannedFile(Path("out/b.sh"), "echo no newline"),
        ),
        steps="step one\nstep two",
        notes=("a note",),
        warnings=("a warning",),
    )
    assert plan.shown() == (
        "step one\nstep two\n"
        "# would write out/a.yaml (project p):\n"
        f"key: {plan.files[0].shown.split(': ')[1]}"
        "# would write out/b.sh:\n"
        "echo no newline\n"
        "# note: a note\n"
        "# warning: a warning\n"
    )
    assert SECRET not in plan.shown()
    assert SECRET in plan.files[0].text  # the file applying writes carries the value itself


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_MASTER_PORT", "NODEKIT_NAME", "NODEKIT_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text(
        'name = "shape"\nscript = "train.py"\nnnodes = 2\nhosts = ["unix:///var/run/docker.sock", "ssh://u@h2"]\n'
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_compose_dry_run_prints_the_plan_write_compose_carries_out(project: Path) -> None:
    result = runner.invoke(app, ["compose", "-r", "1", "--main", "10.0.0.1", "--image", "i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    s = load(project / "nodekit.toml")
    world = gather_node(s, 1, "10.0.0.1", image="i:1", environ={}, job_secret=lambda: SECRET, dry_run=True)
    plan = node.plan(s, world)
    assert plan.backend == "compose"
    assert (plan.files[0].path, plan.files[0].text) == (plan.detail.compose_path, plan.detail.text)
    # The printed plan is this shape's text (the secret is the only thing that differs: masked either way).
    assert result.stdout.splitlines()[0] == plan.files[0].heading
    assert result.stdout.endswith("".join(f"# note: {n}\n" for n in plan.notes))
    assert not (project / "compose").exists()


def test_k8s_and_fleet_dry_runs_print_their_plans_shown(project: Path) -> None:
    s = load(project / "nodekit.toml")
    result = runner.invoke(app, ["k8s", "--image", "reg.example.com/i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    job = k8s.k8s_job(s, image="reg.example.com/i:1", fingerprint="")
    p = k8s.plan(s, job, secret=SECRET, kind="job", out_dir=Path("k8s"))
    assert p.backend == "k8s" and p.files == p.detail.files
    assert [line for line in result.stdout.splitlines() if line.startswith("# would write")] == [
        f.heading for f in p.files
    ]
    assert result.stdout.endswith("".join(f"# note: {n}\n" for n in p.notes))

    result = runner.invoke(app, ["run", "--image", "i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    f = fleet.plan(gather(s, hosts_of(s), image="i:1"))
    assert f.backend == "fleet" and result.stdout == f.shown()
    assert [line for line in result.stdout.splitlines() if line.startswith("# would write")] == [
        file.heading for file in f.files
    ]


def test_the_k8s_command_builds_the_jobs_launch_once(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []

    def counted(settings: Settings) -> LaunchSpec:
        built.append(settings)
        return launch_spec(settings)

    monkeypatch.setattr(k8s, "launch_spec", counted)
    result = runner.invoke(app, ["k8s", "--image", "reg.example.com/i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert len(built) == 1


def test_the_compose_command_builds_the_jobs_launch_once(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.job import gather

    built = []

    def counted(settings: Settings) -> LaunchSpec:
        built.append(settings)
        return launch_spec(settings)

    monkeypatch.setattr(gather, "launch_spec", counted)
    monkeypatch.setattr(node, "launch_spec", counted, raising=False)  # planning takes the node's own
    result = runner.invoke(app, ["compose", "-r", "1", "--main", "10.0.0.1", "--image", "i:1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert len(built) == 1
