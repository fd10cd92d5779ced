"""The guides' own scripts, unmodified, as 2-node jobs on a real engine (main 127.0.0.1): Lightning's Trainer
(launcher env), Fabric without .launch() (launcher fabric), a torch.distributed.launch-style script (--local_rank),
and the exit-code proof: consecutive runs of the Lightning script, every one exit 0 on both nodes (20 by default
and in make test-big; make test runs 3: NODEKIT_EXIT_CODE_RUNS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from nodekit.backends.compose.node import compose_path, project_for
from nodekit.config.settings import load
from nodekit.system import docker
from tests import wheelcache
from tests.integration.helpers import nodekit

pytestmark = pytest.mark.docker
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _project(tmp: Path, example: str) -> Path:
    """examples/<example> in ``tmp`` with its image built; wheels are reused from every example's wheelhouse and
    the new ones kept in the example's, so the next run downloads nothing."""
    dest = tmp / example
    shutil.copytree(
        EXAMPLES / example, dest, ignore=shutil.ignore_patterns("outputs", "compose", ".nodekit", "__pycache__")
    )
    house = dest / ".nodekit" / "wheelhouse"
    house.mkdir(parents=True)
    for other in EXAMPLES.glob("*/.nodekit/wheelhouse/*.whl"):
        if not (house / other.name).exists():
            _link_or_copy(str(other), str(house / other.name))
    wheelcache.warm(dest)
    built = nodekit("build", "--create-base", config=dest / "nodekit.toml", timeout=1500)
    assert built.returncode == 0, built.stdout + built.stderr
    wheelcache.kept(dest)
    keep = EXAMPLES / example / ".nodekit" / "wheelhouse"
    keep.mkdir(parents=True, exist_ok=True)
    for wheel in house.glob("*.whl"):
        if not (keep / wheel.name).exists():
            _link_or_copy(str(wheel), str(keep / wheel.name))
    return dest


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory, docker_engine: None) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("modes")
    return {ex: _project(tmp, ex) for ex in ("lightning", "fabric", "legacy")}


def run_two_nodes(config: Path, port: int, env: dict[str, str] | None = None) -> tuple[int, int, str]:
    """Node 1 detached, node 0 in the foreground (both with ``env`` added, e.g. NODEKIT_* settings); both nodes'
    exit codes and node 0's output."""
    flags = ["--main", "127.0.0.1", "--master-port", str(port)]
    settings = load(config)
    try:
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config, env=env)
        assert bg.returncode == 0, bg.stdout + bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, env=env, timeout=300)
        worker = docker.compose_wait(compose_path(settings, 1), project_for(settings, 1))
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    return fg.returncode, worker, fg.stdout + fg.stderr


@pytest.mark.parametrize(
    ("example", "port", "line"),
    [
        ("lightning", 29760, "lightning: 5 steps, parameters equal on 2 ranks"),
        ("fabric", 29762, "fabric: 5 steps"),
        ("legacy", 29764, "legacy: local_rank 0"),
    ],
)
def test_each_guides_script_trains_to_equal_parameters(
    projects: dict[str, Path], example: str, port: int, line: str
) -> None:
    main, worker, out = run_two_nodes(projects[example] / "nodekit.toml", port)
    assert (main, worker) == (0, 0), out
    assert line in out, out
    assert "equal on 2 ranks" in out, out


def test_lightning_starts_its_own_processes_for_several_devices_per_node(projects: dict[str, Path]) -> None:
    """launcher env with 2 devices per node: Lightning spawns the second process on each node itself."""
    config = projects["lightning"] / "nodekit.toml"
    two = {"NODEKIT_ARGS": '["--num-nodes", "2", "--devices", "2", "--max-steps", "3"]', "NODEKIT_NPROC_PER_NODE": "2"}
    main, worker, out = run_two_nodes(config, 29774, two)
    assert (main, worker) == (0, 0), out
    assert "lightning: 3 steps, parameters equal on 4 ranks" in out, out


RUNS = int(os.environ.get("NODEKIT_EXIT_CODE_RUNS", "20"))


def test_an_unmodified_lightning_trainer_exits_0_on_both_nodes_every_time(projects: dict[str, Path]) -> None:
    config = projects["lightning"] / "nodekit.toml"
    codes = []
    start = time.monotonic()
    for i in range(RUNS):
        main, worker, out = run_two_nodes(config, 29766)
        codes.append((main, worker))
        assert (main, worker) == (0, 0), f"run {i + 1} of {RUNS}: exit codes {codes}\n{out}"
    took = time.monotonic() - start
    print(f"{RUNS} two-node Lightning runs, all exit 0 on both nodes, {took / RUNS:.1f} s per run")


def test_a_one_plus_two_process_job_runs_with_world_3(ddp_project: Path) -> None:
    """Heterogeneous nodes declared in the shared configuration: node 0 runs 1 process, node 1 runs 2."""
    config = ddp_project / "nodekit.toml"
    hetero = {"NODEKIT_NODES": '{"1": {"nproc_per_node": 2}}', "NODEKIT_ARGS": '["--epochs", "1"]'}
    main, worker, out = run_two_nodes(config, 29768, hetero)
    assert (main, worker) == (0, 0), out
    assert "| 1 proc/node | world 3 |" in out
    assert "nproc_per_node: 1 on node 0; 2 on node 1" in out  # a note, not a mismatch
    result = json.loads((ddp_project / "outputs" / "result.json").read_text())
    assert result["world_size"] == 3 and result["checksums_equal"] is True and len(result["checksums"]) == 3


SECRET = "nk-secret-3b1f9a7c5e"


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_pass_env_reaches_the_job_and_no_file_nodekit_wrote(projects: dict[str, Path]) -> None:
    """The secret is in the container's environment (from the shell that ran nodekit up) and nowhere else: not in
    the compose file, the outputs, nodekit's output, --dry-run, or the container's labels."""
    project = projects["legacy"]
    config = project / "nodekit.toml"
    shell = {"NODEKIT_PASS_ENV": '["NK_TEST_TOKEN", "NK_TEST_UNSET"]', "NK_TEST_TOKEN": SECRET}
    flags = ["--main", "127.0.0.1", "--master-port", "29770"]
    settings = load(config)
    outputs: list[str] = []
    try:
        dry = nodekit("up", "--node-rank", "0", *flags, "--dry-run", config=config, env=shell)
        outputs.append(dry.stdout + dry.stderr)
        assert "NK_TEST_TOKEN" in dry.stdout and SECRET not in dry.stdout
        bg = nodekit("up", "--node-rank", "1", *flags, "--detach", config=config, env=shell)
        outputs.append(bg.stdout + bg.stderr)
        assert bg.returncode == 0, bg.stdout + bg.stderr
        assert "pass_env NK_TEST_UNSET is not set" in bg.stderr
        fg = nodekit("up", "--node-rank", "0", *flags, config=config, env=shell, timeout=300)
        outputs.append(fg.stdout + fg.stderr)
        assert fg.returncode == 0, fg.stdout + fg.stderr
        compose_file = compose_path(settings, 0)
        resolved = subprocess.run(
            ["docker", "compose", "-f", str(compose_file), "config"],
            env=os.environ | {"NK_TEST_TOKEN": SECRET},
            capture_output=True,
            text=True,
        )
        assert resolved.returncode == 0, resolved.stderr
        assert f"NK_TEST_TOKEN: {SECRET}" in resolved.stdout  # compose takes the value from its shell
        inspect = subprocess.run(
            ["docker", "compose", "-f", str(compose_file), "-p", project_for(settings, 0), "ps", "-a", "-q"],
            capture_output=True,
            text=True,
        )
        cid = inspect.stdout.split()[0]
        env = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Config.Env}}", cid], capture_output=True, text=True
        )
        labels = subprocess.run(
            ["docker", "inspect", "--format", "{{json .Config.Labels}}", cid], capture_output=True, text=True
        )
        assert f"NK_TEST_TOKEN={SECRET}" in env.stdout
        assert SECRET not in labels.stdout
    finally:
        for rank in (0, 1):
            nodekit("down", "--node-rank", str(rank), config=config)
    assert _files_holding(project, SECRET.encode()) == []
    assert all(SECRET not in o for o in outputs)


def test_a_dataset_differing_on_one_node_is_refused_with_the_file_named(
    projects: dict[str, Path], tmp_path: Path
) -> None:
    project = projects["legacy"]
    config = project / "nodekit.toml"
    for node, extra in (("a", b""), ("b", b"!")):
        (tmp_path / node / "train").mkdir(parents=True)
        for i in range(3):
            (tmp_path / node / "train" / f"{i}.bin").write_bytes(b"x" * 10 + (extra if i == 2 else b""))
    shell = {
        "NODEKIT_MOUNTS": f'[{{"host": "{tmp_path / "a"}", "container": "/data", "check": "sizes"}}]',
        "NODEKIT_NODES": f'{{"1": {{"mounts": {{"/data": "{tmp_path / "b"}"}}}}}}',
    }
    main, worker, out = run_two_nodes(config, 29772, shell)
    assert (main, worker) == (17, 17), out
    assert "DATA DIFFERS" in out and "train/2.bin: 11 bytes, main has 10" in out, out
    assert "legacy:" not in out  # training never started


def test_a_mount_missing_on_a_node_is_one_line_before_anything_starts(
    projects: dict[str, Path], tmp_path: Path
) -> None:
    config = projects["legacy"] / "nodekit.toml"
    shell = {"NODEKIT_MOUNTS": f'[{{"host": "{tmp_path / "absent"}", "container": "/data"}}]'}
    up = nodekit("up", "--node-rank", "1", "--main", "127.0.0.1", config=config, env=shell)
    assert up.returncode == 2
    lines = [ln for ln in up.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not exist on node 1" in lines[0], up.stderr


@pytest.mark.parametrize(("guard", "loaded"), [("1", "True"), ("0", "False"), (None, "False")])
def test_the_image_loads_the_exit_guard_only_when_asked(
    projects: dict[str, Path], guard: str | None, loaded: str
) -> None:
    from nodekit.image.builder import current_image

    image = current_image(load(projects["lightning"] / "nodekit.toml"))
    env = ["-e", f"NODEKIT_EXIT_GUARD={guard}"] if guard is not None else []
    probe = "import sys, json; print('nodekit.launcher.exitguard' in sys.modules)"
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", *env, "--entrypoint", "python", image, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == loaded


ABORTS_IN_TEARDOWN = """
import os, sys
class AbortsInTeardown:
    def __del__(self):
        os.abort()  # as the gloo/NCCL teardown of torch now and then does (SIGABRT)
keep = AbortsInTeardown()
import json
print("trained", flush=True)
"""


@pytest.mark.parametrize(("guard", "code"), [("1", 0), ("0", 134)])
def test_in_the_image_a_finished_script_whose_teardown_aborts_exits_0(
    projects: dict[str, Path], guard: str, code: int
) -> None:
    """The abort the guard exists for does not reproduce on demand with torch (0 of 20 unguarded Lightning runs
    failed on the CI machine), so the image's interpreter is shown the same abort at teardown directly."""
    from nodekit.image.builder import current_image

    image = current_image(load(projects["lightning"] / "nodekit.toml"))
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-e", f"NODEKIT_EXIT_GUARD={guard}", "--entrypoint", "sh",
         image, "-c", f"python -c '{ABORTS_IN_TEARDOWN}'; echo exit=$?"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert "trained" in proc.stdout
    assert f"exit={code}" in proc.stdout, proc.stdout + proc.stderr
