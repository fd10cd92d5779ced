"""nodekit k8s from the command line: what it writes, what a dry run shows, and every bad input refused (one line,
exit 2, the fix named, nothing written: no manifest, no secret file)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nodekit.backends.k8s import plan as k8s
from nodekit.cli.app import app
from nodekit.image.builder import LAST_BUILD

runner = CliRunner()
FP = "fedcba987654" + "0" * 52
BUILT = f"nodekit/clitest:{FP[:12]}"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_MASTER_PORT", "NODEKIT_NAME", "NODEKIT_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def built(project: Path) -> None:
    """The record `nodekit build` leaves (nodekit/image/builder/record.py), without an engine."""
    (project / LAST_BUILD).parent.mkdir(parents=True, exist_ok=True)
    (project / LAST_BUILD).write_text(json.dumps({"tag": BUILT, "fingerprint": FP, "image_id": "sha256:x"}))


def test_writes_the_manifests_that_validate_strictly(project: Path) -> None:
    built(project)
    result = runner.invoke(app, ["k8s", "--gpus", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["k8s/job.yaml", "k8s/secret.yaml"]
    assert "next: kubectl apply -f k8s/" in result.stderr
    assert "names no registry" in result.stderr  # a local tag: preloaded on every node, or a registry
    secret_file = project / "k8s" / "secret.yaml"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    value = (project / ".nodekit" / "job-secret").read_text().strip()  # the project's secret, as `nodekit up`'s
    assert yaml.safe_load(secret_file.read_text())["stringData"]["job-secret"] == value
    assert value not in (project / "k8s" / "job.yaml").read_text()
    job = list(yaml.safe_load_all((project / "k8s" / "job.yaml").read_text()))[1]
    assert job["metadata"]["labels"]["nodekit/fingerprint"] == FP[:12]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == BUILT
    # The validator's own command line, as a user would run it, on what was written.
    tool = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    for version in k8s.K8S_VERSIONS:
        proc = subprocess.run(
            [tool, "--strict", "-k", version, "k8s/job.yaml", "k8s/secret.yaml"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("passed") == 3


def test_a_registry_image_keeps_the_built_fingerprint(project: Path) -> None:
    built(project)
    ref = f"registry.example.com/team/clitest:{FP[:12]}"
    result = runner.invoke(app, ["k8s", "--image", ref, "--namespace", "ml"])
    assert result.exit_code == 0, result.output
    svc, job = yaml.safe_load_all((project / "k8s" / "job.yaml").read_text())
    assert job["metadata"]["annotations"]["nodekit/fingerprint"] == FP
    assert svc["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml"
    assert "names no registry" not in result.stderr


def test_dry_run_shows_everything_but_the_secret_and_writes_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "shell-secret-0123456789abcdef"
    monkeypatch.setenv("NODEKIT_JOB_SECRET", value)
    result = runner.invoke(app, ["k8s", "--dry-run", "--image", "reg.example.com/x:1"])
    assert result.exit_code == 0, result.output
    assert "# would write k8s/job.yaml:" in result.stdout and "# would write k8s/secret.yaml:" in result.stdout
    assert "kind: Secret" in result.stdout and "job-secret: ********" in result.stdout
    assert value not in result.output
    assert not (project / "k8s").exists() and not (project / ".nodekit").exists()


def test_a_trainjob_replaces_the_job_written_before(project: Path) -> None:
    built(project)
    assert runner.invoke(app, ["k8s"]).exit_code == 0
    result = runner.invoke(app, ["k8s", "--trainjob"])
    assert result.exit_code == 0, result.output
    # kubectl apply -f k8s/ would otherwise start the job twice.
    assert sorted(p.name for p in (project / "k8s").iterdir()) == ["secret.yaml", "trainjob.yaml"]
    (project / "k8s" / "job.yaml").write_text("# mine\n")
    assert runner.invoke(app, ["k8s", "--trainjob"]).exit_code == 0
    assert (project / "k8s" / "job.yaml").read_text() == "# mine\n"  # not nodekit's: left alone


@pytest.mark.parametrize(
    ("toml", "args", "needles"),
    [
        ('name = "my_proj"\n', [], ["'my_proj'", "DNS label", '[k8s] name = "demo"']),
        ('[k8s]\nname = "3d-unet"\n', [], ["'3d-unet'", "[k8s] name"]),
        ('[k8s]\nname = "' + "a" * 62 + '"\n', [], ["at most 61 characters"]),
        ("", ["--namespace", "Bad_NS"], ["namespace 'Bad_NS'", "DNS label"]),
        ("", ["--gpus", "65"], ["65 GPUs", "0..64"]),
        ("", ["--gpus", "-1"], ["-1 GPUs", "0..64"]),
        ("", ["--nnodes", "0"], ["nnodes"]),
        ("", ["--nnodes", "100001"], ["100001", "nnodes between 1 and 10000"]),
        ('[k8s]\nclaims = { "/data" = "x" }\n', [], ["/data", "[[mounts]]"]),
        ('[k8s]\nshm_size = "lots"\n', [], ["shm_size", "16Gi"]),
        ("[k8s]\nhost_network = true\n", ["--trainjob"], ["host_network", "TrainJob"]),
        ('ib = "on"\n', [], ['ib = "on"', "device plugin"]),
        ("[nodes.1]\ngpus = 4\n", ["--gpus", "8"], ["different GPU counts"]),
        (
            '[[mounts]]\nsource = "data"\nhost = "/d"\ncontainer = "/d"\n',
            [],
            ["source = 'data'", "PersistentVolumeClaim"],
        ),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    project: Path, toml: str, args: list[str], needles: list[str]
) -> None:
    base = (project / "nodekit.toml").read_text()
    if toml.startswith("name"):
        base = base.replace('name = "clitest"\n', "")
    # Top-level keys before the file's own, tables after them.
    (project / "nodekit.toml").write_text(base + toml if toml.startswith("[") else toml + base)
    result = runner.invoke(app, ["k8s", "--image", "reg.example.com/x:1", *args])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nodekit: error:") and "Fix:" in lines[0]
    for needle in needles:
        assert needle in lines[0]
    assert not (project / "k8s").exists() and not (project / ".nodekit").exists()


def test_no_image_names_the_fix(project: Path) -> None:
    result = runner.invoke(app, ["k8s"])
    assert result.exit_code == 2
    assert "nothing was built here" in result.stderr and "nodekit build" in result.stderr
    assert not (project / "k8s").exists()
