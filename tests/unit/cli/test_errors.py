"""Every bad input: one line on stderr naming the problem and the fix, exit code 2, no compose file written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodekit.cli.app import app

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("NODEKIT_NNODES", "NODEKIT_CONFIG", "NODEKIT_MASTER_PORT", "NODEKIT_NAME"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 2\n')
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stderr


def assert_refused(project: Path, code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("nodekit: error:")
    assert "Fix:" in lines[0]
    for needle in needles:
        assert needle in lines[0]
    assert not (project / "compose").exists(), "a refused command must not write a compose file"


@pytest.mark.parametrize("command", ["compose", "up"])
def test_rank_out_of_range(project: Path, command: str) -> None:
    code, err = run(command, "--node-rank", "2", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, "node rank 2", "0..1")


def test_negative_rank(project: Path) -> None:
    code, err = run("compose", "--node-rank", "-1", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, "node rank -1")


def test_nnodes_below_one(project: Path) -> None:
    code, err = run("compose", "--node-rank", "0", "--main", "10.0.0.5", "--nnodes", "0", "--image", "x:y")
    assert_refused(project, code, err, "nnodes")


def test_unresolvable_main(project: Path) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "no-such-host.invalid", "--image", "x:y")
    assert_refused(project, code, err, "no-such-host.invalid", "neither an IP")


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_port_out_of_range(project: Path, port: str) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--master-port", port, "--image", "x:y")
    assert_refused(project, code, err, "master_port")


def test_missing_script(project: Path) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--script", "nope.py", "--image", "x:y")
    assert_refused(project, code, err, "nope.py", "not found")


def test_bad_nproc(project: Path) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--nproc-per-node", "many", "--image", "x:y")
    assert_refused(project, code, err, "nproc-per-node")


def test_no_docker_engine(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{project}/no-engine.sock")
    code, err = run("up", "--node-rank", "1", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, "no Docker engine", "make engine")


def test_good_input_writes_the_file(project: Path) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--image", "nodekit/clitest:abc")
    assert code == 0, err
    text = (project / "compose" / "node-1.yaml").read_text()
    assert "NODE_RANK: '1'" in text and "MASTER_ADDR: 10.0.0.5" in text and "network_mode: host" in text
    assert not [p for p in (project / "compose").iterdir() if p.name.startswith(".")], "temp file left behind"


def test_dry_run_writes_nothing(project: Path) -> None:
    result = runner.invoke(app, ["compose", "-r", "0", "-m", "127.0.0.1", "--image", "x:y", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    assert "NODE_RANK: '0'" in result.stdout
    assert not (project / "compose").exists()


def test_init_then_refuses_to_overwrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run("init", "--name", "x")[0] == 0
    text = (tmp_path / "nodekit.toml").read_text()
    assert 'name = "x"' in text and "torch==2.13.0" in text
    code, err = run("init")
    assert code == 2 and "already exists" in err


def test_master_port_with_no_room_for_preflight(project: Path) -> None:
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--image", "x:y", "--master-port", "65535")
    assert_refused(project, code, err, "master_port")


def test_nodekit_config_naming_a_missing_file(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEKIT_CONFIG", str(project / "elsewhere.toml"))
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, "NODEKIT_CONFIG", "elsewhere.toml")


@pytest.mark.parametrize("key", ["MASTER_ADDR", "NODEKIT_FINGERPRINT", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK"])
def test_env_table_may_not_set_nodekits_own_variables(project: Path, key: str) -> None:
    (project / "nodekit.toml").write_text(
        f'name = "clitest"\nscript = "train.py"\nnnodes = 2\n[env]\n{key} = "1"\nNCCL_DEBUG = "WARN"\n'
    )
    code, err = run("compose", "--node-rank", "1", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, key, "set by nodekit itself")


def test_main_on_another_machine_is_refused_for_rank_0(project: Path) -> None:
    # 198.51.100.7 (TEST-NET-2) is never one of this machine's addresses; loopback stays fine for all-local runs.
    code, err = run("compose", "--node-rank", "0", "--main", "198.51.100.7", "--image", "x:y")
    if "no route" in err:
        pytest.skip("this machine has no default route, so the address check is never reached")
    assert_refused(project, code, err, "198.51.100.7", "not one of this machine's addresses")
    code, err = run("compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y")
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('launcher = "deepspeed"', "launcher"),
        ('precision = "bf16-mixed"', 'only apply to launcher = "fabric"'),
        ('pass_env = ["HF-TOKEN"]', "pass_env"),
        ("[nodes.2]\nnproc_per_node = 1", "[nodes.2] is outside node ranks 0..1"),
    ],
)
@pytest.mark.parametrize("command", ["compose", "up"])
def test_bad_launch_settings_are_refused(project: Path, command: str, extra: str, needle: str) -> None:
    toml = project / "nodekit.toml"
    toml.write_text(toml.read_text() + extra + "\n")
    code, err = run(command, "--node-rank", "0", "--main", "10.0.0.5", "--image", "x:y")
    assert_refused(project, code, err, needle)


def test_an_unknown_relay_mode_is_refused_before_any_engine_is_asked(project: Path) -> None:
    code, err = run("push", "x:y", "--to", "ssh://me@10.0.0.6", "--relay", "sometimes")
    assert_refused(project, code, err, "--relay 'sometimes' is not one of auto, always, never", "--relay auto")


def test_a_bad_relay_setting_is_refused(project: Path) -> None:
    (project / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\nnnodes = 2\nrelay = "sometimes"\n')
    code, err = run("push", "x:y", "--to", "ssh://me@10.0.0.6")
    assert_refused(project, code, err, "relay")


def test_a_path_nodekit_cannot_write_is_one_line_exit_2(project: Path) -> None:
    """An OSError reaching the command's edge is one line naming the path, not a traceback. /proc
    refuses a new directory even to root, as a read-only or foreign directory refuses a user."""
    (project / "nodekit.toml").write_text('name = "clitest"\nscript = "train.py"\ncompose_dir = "/proc/nodekit-x"\n')
    code, err = run("compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "/proc/nodekit-x" in lines[0] and "Fix:" in lines[0], err
    assert not Path("/proc/nodekit-x").exists()


def test_an_os_error_that_is_not_the_users_path_exits_1() -> None:
    import errno

    from nodekit.cli.common import os_error

    line, code = os_error(OSError(errno.ENOSPC, "No space left on device", "/p/compose/node-0.yaml"))
    assert code == 1 and line.startswith("No space left on device (/p/compose/node-0.yaml)")
    line, code = os_error(PermissionError(errno.EACCES, "Permission denied", "/p/compose"))
    assert (
        code == 2
        and line
        == "Permission denied: /p/compose. Fix: check its permissions, or point the setting that names it elsewhere"
    )


def test_a_hung_nvidia_smi_is_one_line_and_exit_2(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU driver whose nvidia-smi never answers: a real hung nvidia-smi (first on PATH) is stopped at its deadline
    and named in one line, not a TimeoutExpired traceback."""
    from nodekit.system.host import facts

    if any(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        pytest.skip("this host lists its GPUs in /proc: nvidia-smi is never asked")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 60\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(facts, "NVIDIA_SMI_S", 0.5)
    code, err = run("compose", "--node-rank", "0", "--main", "127.0.0.1", "--image", "x:y")
    assert_refused(project, code, err, "nvidia-smi did not finish within 0.5 s and was stopped", "NVIDIA driver")
