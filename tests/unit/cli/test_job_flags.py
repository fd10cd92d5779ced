"""The job's shape flags (--nnodes, --nproc-per-node, --master-port, --script) are declared once
(nodekit/cli/common.py ``job_flags``) and every command that plans the job takes all four, ``nodekit run`` and
``nodekit slurm`` included, and ``up --build`` builds with --nproc-per-node kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

from nodekit.backends.slurm import job as slurm_job
from nodekit.backends.slurm import submit
from nodekit.cli.app import app

JOB_COMMANDS = ("compose", "up", "run", "slurm", "k8s")
FLAGS = ["--nnodes", "--nproc-per-node", "--master-port", "--script"]
runner = CliRunner()


def _options(command: str) -> dict[str, TyperOption]:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    return {p.opts[0]: p for p in group.commands[command].params if isinstance(p, TyperOption)}


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_every_command_that_plans_the_job_takes_the_four_flags_in_one_place(command: str) -> None:
    names = list(_options(command))
    at = names.index("--nnodes")
    assert names[at : at + 4] == FLAGS, names
    assert names[-2:] == ["--dry-run", "--config"], "the shape flags go before --dry-run and --config"
    helps = {flag: _options(command)[flag].help for flag in FLAGS}
    assert helps == {flag: _options("compose")[flag].help for flag in FLAGS}
    assert all(not _options(command)[flag].required for flag in FLAGS)


def test_debug_means_the_same_on_every_command() -> None:
    helps = {c: _options(c)["--debug"].help for c in ("compose", "up", "run", "slurm")}
    assert len(set(helps.values())) == 1, helps
    assert "NCCL_DEBUG=INFO" in helps["run"]


def test_compose_and_up_still_ask_for_rank_and_main_first() -> None:
    for command in ("compose", "up"):
        options = _options(command)
        assert list(options)[:2] == ["--node-rank", "--main"]
        # --main has a default (nodekit.toml's main; node 0's own address): nodekit/job/gather.py main_address
        assert options["--node-rank"].required and not options["--main"].required


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_HOSTS", "NODEKIT_MAIN", "NODEKIT_MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NODEKIT_JOB_SECRET", "a-secret-of-twenty-chars")
    (tmp_path / "nodekit.toml").write_text(
        'name = "t"\nscript = "train.py"\nnnodes = 2\nhosts = ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6"]\n'
        'main = "10.0.0.5"\n'
    )
    (tmp_path / "train.py").write_text("")
    (tmp_path / "other.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_run_takes_the_processes_and_the_port_from_the_flags(project: Path) -> None:
    result = runner.invoke(
        app, ["run", "--dry-run", "--image", "nodekit/t:0123", "--master-port", "29610", "--nproc-per-node", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "main: 10.0.0.5:29610 (rendezvous; nodekit's preflight store on 29611)" in result.stdout
    for rank in (0, 1):
        assert f"launch: node_rank {rank}, nnodes 2, nproc_per_node 3, main 10.0.0.5:29610" in result.stdout


def test_run_refuses_a_bad_process_count_in_one_line(project: Path) -> None:
    result = runner.invoke(app, ["run", "--dry-run", "--nproc-per-node", "many"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--nproc-per-node must be an integer or auto" in result.stderr


def test_slurm_takes_all_four_into_the_script(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image = slurm_job.InspectedImage(ref="nodekit/t:0123", id="sha256:" + "c" * 64, entrypoint=("python",))
    monkeypatch.setattr(submit, "gather_image", lambda settings, ref: image)
    argv = ["--nnodes", "3", "--master-port", "29610", "--nproc-per-node", "3", "--script", "other.py"]
    result = runner.invoke(app, ["slurm", "--dry-run", *argv])
    assert result.exit_code == 0, result.stderr
    script = result.stdout
    assert "#SBATCH --nodes=3" in script
    assert "--env=MASTER_PORT=29610" in script and "--env=NODEKIT_PREFLIGHT_PORT=29611" in script
    assert "--env=NPROC_PER_NODE=3" in script and "--env=NODEKIT_NPROC_DECLARED=0:3,1:3,2:3" in script
    assert "        other.py\n" in script and "train.py" not in script


def test_more_hosts_than_nnodes_is_never_a_silent_cut(project: Path) -> None:
    """A host list longer than nnodes (a nodekit.toml that says nnodes = 2 beside three hosts) is refused in one
    line; --nnodes on the command line is a stated choice, and the run says which hosts it leaves out."""
    (project / "nodekit.toml").write_text(
        'name = "t"\nscript = "train.py"\nnnodes = 2\n'
        'hosts = ["ssh://me@10.0.0.5", "ssh://me@10.0.0.6", "ssh://me@10.0.0.7"]\n'
    )
    result = runner.invoke(app, ["run", "--dry-run", "--image", "nodekit/t:0123"])
    assert result.exit_code == 2, result.output
    assert "hosts lists 3 hosts but nnodes = 2: 1 host(s) would be left out (ssh://me@10.0.0.7)" in result.output
    assert "--nnodes 2" in result.output and "Traceback" not in result.output
    stated = runner.invoke(app, ["run", "--dry-run", "--image", "nodekit/t:0123", "--nnodes", "2"])
    assert stated.exit_code == 0, stated.output
    assert "the first 2 of 3 hosts run the job (--nnodes 2); left out: ssh://me@10.0.0.7" in stated.stderr
    assert "launch: node_rank 1, nnodes 2" in stated.stdout and "node_rank 2" not in stated.stdout
