"""nodekit slurm's bad input: one line naming the problem and the fix, exit 2, no script written, nothing submitted.

The Slurm client here is a fake on PATH that logs every call (a refused request never reaches a real ``sbatch``
without ``--test-only``); the image is given as data (no engine needed). The real refusals (a partition or a GPU
request the cluster's Slurm does not have) are in tests/cluster/test_slurm.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.backends.slurm import job as slurm_job
from nodekit.backends.slurm import submit
from nodekit.cli.app import app
from tests.fake_runner import FakeRunner

runner = CliRunner()
IMAGE = slurm_job.InspectedImage(ref="nodekit/clitest:0123", id="sha256:" + "c" * 64, entrypoint=("python",))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_SLURM", "NODEKIT_JOB_SECRET"):
        monkeypatch.delenv(var, raising=False)
    d = tmp_path / "project"
    d.mkdir()
    (d / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 2\n')
    (d / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(d)
    monkeypatch.setattr(submit, "gather_image", lambda settings, image: IMAGE)
    return d


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, refuse: str = "") -> Path:
    """sbatch, scontrol, scancel, srun on PATH (and nothing else of Slurm's); they log their arguments. sbatch
    --test-only fails with ``refuse`` when given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("sbatch", "scontrol", "scancel", "srun"):
        body = f'echo "{tool} $*" >> {log}\n'
        if tool == "sbatch" and refuse:
            body += f'echo "sbatch: error: {refuse}" >&2\nexit 1\n'
        (bin_dir / tool).write_text("#!/bin/sh\n" + body)
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return log


def assert_refused(project: Path, code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("nodekit: error:") and "Fix:" in lines[0], err
    for needle in needles:
        assert needle in lines[0], err
    assert not (project / "compose").exists(), "a refused command must not write the script"
    assert not (project / ".nodekit" / "slurm").exists(), "a refused command must not make an image"


def test_unknown_container_mode(project: Path) -> None:
    result = runner.invoke(app, ["slurm", "--container", "singularity"])
    assert_refused(project, result.exit_code, result.stderr, "unknown Slurm container mode 'singularity'", "docker")


def test_unknown_container_mode_in_the_file(project: Path) -> None:
    (project / "nodekit.toml").write_text((project / "nodekit.toml").read_text() + '[slurm]\ncontainer = "lxc"\n')
    result = runner.invoke(app, ["slurm"])
    assert_refused(project, result.exit_code, result.stderr, "[slurm] container")


def test_no_slurm_client_on_path(project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = runner.invoke(app, ["slurm", "--submit"])
    assert_refused(project, result.exit_code, result.stderr, "sbatch is not on PATH", "login node")


def test_a_request_sbatch_refuses_is_not_submitted(
    project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = fake_slurm(tmp_path, monkeypatch, refuse="invalid partition specified: nope")
    result = runner.invoke(app, ["slurm", "--submit"])
    assert_refused(project, result.exit_code, result.stderr, "invalid partition specified: nope", "partition")
    assert log.read_text().splitlines() == ["sbatch --test-only"]  # validated, never submitted


def test_pyxis_missing_is_refused_before_submitting(
    project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = fake_slurm(tmp_path, monkeypatch)  # srun --help lists no --container-image: no pyxis here
    result = runner.invoke(app, ["slurm", "--submit", "--container", "pyxis"])
    assert_refused(project, result.exit_code, result.stderr, "no pyxis", "--container-image")
    assert "sbatch --parsable" not in log.read_text()


def test_charliecloud_without_its_tools_here(project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(submit.shutil, "which", lambda tool: None if tool == "mksquashfs" else tool)
    result = runner.invoke(app, ["slurm", "--submit", "--container", "charliecloud"])
    assert_refused(project, result.exit_code, result.stderr, "mksquashfs", "apt-get install squashfs-tools")


def test_per_node_mounts_with_pyxis(project: Path) -> None:
    (project / "nodekit.toml").write_text(
        'name = "clitest"\nscript = "train.py"\nnnodes = 2\n[[mounts]]\nhost = "/data"\ncontainer = "/data"\n'
        '[nodes.1]\nmounts = { "/data" = "/scratch/data" }\n'
    )
    result = runner.invoke(app, ["slurm", "--container", "pyxis"])
    assert_refused(project, result.exit_code, result.stderr, "pyxis", "[nodes.R] mounts")


def test_dry_run_prints_the_script_with_the_secret_masked(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_JOB_SECRET", "a-secret-of-twenty-chars")
    result = runner.invoke(app, ["slurm", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --nodes=2" in result.stdout and "NODEKIT_JOB_SECRET=********" in result.stdout
    assert "a-secret-of-twenty-chars" not in result.stdout
    assert not (project / "compose").exists()


def test_the_script_is_written_private(project: Path) -> None:
    result = runner.invoke(app, ["slurm"])
    assert result.exit_code == 0, result.stderr
    path = project / "compose" / "slurm.sbatch"
    assert result.stdout.strip() == str(path)
    assert path.stat().st_mode & 0o777 == 0o600  # it carries the job secret


def test_each_script_gets_a_fresh_report_token(project: Path) -> None:
    """The token that tags the tasks' exit-code reports is random per script: a job cannot learn it from an
    earlier one's script or log."""
    tokens = []
    for _ in range(2):
        assert runner.invoke(app, ["slurm"]).exit_code == 0
        text = (project / "compose" / "slurm.sbatch").read_text()
        tokens += [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("export NODEKIT_REPORT_TOKEN=")]
    assert len(tokens) == 2 and tokens[0] != tokens[1] and all(len(t) == 32 for t in tokens)


# --- the command lines, through nodekit's one process runner (faked: nothing runs) -------------------------------


@pytest.fixture
def slurm_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch, scontrol, scancel found on PATH (stubs that never run: the fake runner answers instead)."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "scontrol", "scancel"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 97\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def test_submit_validates_then_submits_and_exits_with_the_jobs_code(
    project: Path, slurm_client: None, fake_runner: FakeRunner
) -> None:
    log = project / "outputs" / "slurm-42.out"
    fake_runner.on("sbatch", "--parsable", stdout="42\n")
    fake_runner.on(
        "scontrol", "show", "job",
        stdout=f"JobId=42 JobState=FAILED Reason=NonZeroExitCode ExitCode=17:0 NodeList=n[1-2] StdOut={log}",
    )  # fmt: skip
    result = runner.invoke(app, ["slurm", "--submit"])
    assert result.exit_code == 17, result.stderr
    script = project / "compose" / "slurm.sbatch"
    test_only = fake_runner.only("sbatch", "--test-only")
    assert test_only.cmd == ["sbatch", "--test-only"] and bytes(test_only.written) == script.read_bytes()
    assert fake_runner.only("sbatch", "--parsable").cmd == ["sbatch", "--parsable", str(script)]
    assert fake_runner.only("scontrol").cmd == ["scontrol", "show", "job", "-o", "42"]
    assert all(c.deadline == 30.0 for c in fake_runner.calls)
    assert "Slurm job 42 ended FAILED with exit code 17" in result.stderr


def test_a_signal_while_following_cancels_the_job(
    project: Path, slurm_client: None, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodekit.backends.slurm import follow

    fake_runner.on("sbatch", "--parsable", stdout="42\n")
    calls: list[float | None] = []

    def following(job_id: str, on_state: object, on_line: object, **kw: object) -> follow.JobInfo:
        calls.append(kw.get("deadline_s"))  # type: ignore[arg-type]
        if len(calls) == 1:
            raise follow.Stopped(15)
        return follow.JobInfo(job_id, "CANCELLED", 0, 15)

    monkeypatch.setattr(follow, "follow", following)
    result = runner.invoke(app, ["slurm", "--submit"])
    assert result.exit_code == 143, result.stderr
    assert fake_runner.only("scancel").cmd == ["scancel", "42"]
    assert calls == [None, follow.CANCEL_WAIT_S]  # it follows the cancelled job to its end, within a deadline


def test_a_mount_with_a_source_is_refused_with_what_to_do_instead(project: Path) -> None:
    (project / "nodekit.toml").write_text(
        (project / "nodekit.toml").read_text() + '[[mounts]]\nsource = "data"\nhost = "/data"\ncontainer = "/data"\n'
    )
    result = runner.invoke(app, ["slurm"])
    assert_refused(project, result.exit_code, result.stderr, "[[mounts]] /data has source = 'data'",
                   "shared file system", "sbcast")  # fmt: skip
