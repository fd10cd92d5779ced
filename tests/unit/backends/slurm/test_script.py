"""nodekit slurm's script, run by bash on a Slurm-shaped stage (fake srun, scontrol, getent; a docker or ch-run
that records exactly what it was given): every value reaches the container byte for byte, each task takes its
rank from SLURM_NODEID and main from the first host, and the script exits with the failing node's code.

Golden scripts for each container mode: regenerate after an intended change with NODEKIT_UPDATE_GOLDEN=1 and
review the diff.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nodekit.backends.slurm.job import InspectedImage, SlurmJob, plan_job
from nodekit.backends.slurm.render import render
from nodekit.backends.slurm.shell import quote, word
from nodekit.config.settings import Mount, NodeOverride, Settings, SlurmSettings
from tests.golden import GOLDEN, update_golden
from tests.unit.backends.slurm import fakes as fake

TRICKY = ["plain", "two words", "it's", 'say "hi"', "$HOME and `id` and $(id)", "back\\slash", "new\nline",
          "tab\there", "ünïcödé ✓", "", "-dash", "*glob?", "semi;colon&amp|pipe", "NODEKIT_TASK"]  # fmt: skip
IMAGE = InspectedImage(
    ref="nodekit/demo:0123456789ab",
    id="sha256:" + "ab" * 32,
    env=(("PATH", "/opt/venv/bin:/usr/bin:/bin"), ("NODEKIT_FINGERPRINT", "f" * 64), ("PYTHONPATH", "/opt/nodekit")),
    entrypoint=("/opt/venv/bin/python", "-m", "nodekit.launcher"),
    workdir="/workspace",
)
SECRET = "s3cr3t" * 6
REPORT_TOKEN = "70ca1e" * 5


def project(d: Path, **kw: object) -> Settings:
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text("print('hi')\n")
    base: dict[str, object] = {"name": "demo", "script": "train.py", "args": ("--epochs", "3"), "nnodes": 2}
    return Settings(project_dir=d, **(base | kw))  # type: ignore[arg-type]


def job(s: Settings, mode: str = "docker", image_path: str = "/shared/demo.sqsh") -> SlurmJob:
    return plan_job(s, IMAGE, mode=mode, job_secret=SECRET, report_token=REPORT_TOKEN, image_path=image_path)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", TRICKY)
def test_quote_is_exact_in_bash(value: str) -> None:
    out = subprocess.run(["bash", "-c", f"printf %s {quote(value)}"], capture_output=True, timeout=10).stdout
    assert out.decode() == value
    assert "\n" not in quote(value)


def test_docker_gets_every_value_byte_for_byte(tmp_path: Path) -> None:
    env_table = {f"V{i}": v for i, v in enumerate(TRICKY)}
    s = project(tmp_path / "p", env=env_table, args=tuple(TRICKY), pass_env=("FROM_SHELL",))
    stage = fake.stage(tmp_path, "docker")
    done = fake.run_script(render(job(s)), {**stage, "FROM_SHELL": "x $y 'z'"}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        argv = fake.recorded(tmp_path, "argv", rank)
        assert argv[0] == "run" and "--rm" in argv
        assert argv[argv.index("nodekit/demo:0123456789ab") + 1 :] == ["train.py", *TRICKY]
        envs = dict(a.removeprefix("--env=").split("=", 1) for a in argv if a.startswith("--env=") and "=" in a[6:])
        assert {k: envs[k] for k in env_table} == env_table
        assert envs["NODE_RANK"] == str(rank) and envs["MASTER_ADDR"] == "10.9.0.1"
        # The image as this node's engine has it: the sha256 of what its `docker image inspect` printed (the fake's
        # "sha256:node<R>"; tests/integration/test_image_stores.py runs the real template on both image stores).
        inspected = hashlib.sha256(f"sha256:node{rank}".encode()).hexdigest()
        assert envs["NODEKIT_IMAGE_ID"] == f"sha256:{inspected}"
        # The job secret and pass_env by name: docker takes them from the task's environment, never an argument.
        assert "--env=NODEKIT_JOB_SECRET" in argv and not [a for a in argv if SECRET in a]
        assert fake.environ(tmp_path, rank)["NODEKIT_JOB_SECRET"] == SECRET
        assert "--env=FROM_SHELL" in argv
        assert fake.environ(tmp_path, rank)["FROM_SHELL"] == "x $y 'z'"
        assert f"--name=nodekit-demo-slurm42-node{rank}" in argv
        assert "--label=org.nodekit.slurm-job=42" in argv and f"--label=org.nodekit.rank={rank}" in argv
        assert {"--network=host", "--ipc=host", "--init", "--workdir=/workspace"} <= set(argv)
        assert "--ulimit=stack=67108864:67108864" in argv  # within this node's hard limit (unlimited here)
        memlock = subprocess.run(["bash", "-c", "ulimit -H -l"], capture_output=True, text=True).stdout.strip()
        assert ("--ulimit=memlock=-1:-1" in argv) == (memlock == "unlimited")
        out = str(tmp_path / "p" / "outputs")
        assert f"--mount=type=bind,source={out},target=/outputs" in argv
        # The node's own engine, not the submitting shell's.
        assert "DOCKER_HOST" not in fake.environ(tmp_path, rank)
    assert "nodekit-slurm: every node finished (exit code 0)" in done.stdout
    assert "0: training on node 0" in done.stdout and "1: training on node 1" in done.stdout


def test_charliecloud_gets_exactly_the_containers_environment(tmp_path: Path) -> None:
    s = project(tmp_path / "p", env={"A": "it's $HOME\nx"}, pass_env=("FROM_SHELL", "UNSET_ONE"))
    stage = fake.stage(tmp_path, "ch-run")
    image = tmp_path / "demo.sqsh"
    image.write_text("not really a squashfs")
    done = fake.run_script(render(job(s, "charliecloud", str(image))), {**stage, "FROM_SHELL": "v"}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        argv = fake.recorded(tmp_path, "argv", rank)
        own = task_dir(argv)
        assert argv[: argv.index("--")] == [
            "--private-tmp", "--unset-env=USER", "--unset-env=CH_IMAGE_STORAGE", f"--mount={own}/mnt",
            f"--bind={tmp_path / 'p' / 'outputs'}:/outputs", "--cd=/workspace", str(image),
        ]  # fmt: skip
        assert argv[argv.index("--") + 1 :] == ["/opt/venv/bin/python", "-m", "nodekit.launcher", "train.py",
                                                "--epochs", "3"]  # fmt: skip
        env = fake.environ(tmp_path, rank)
        env.pop("USER")  # for ch-run itself (its --unset-env=USER drops it in the container)
        assert env.pop("CH_IMAGE_STORAGE") == own  # the same: ch-run looks image names up only there
        expected_image = dict(IMAGE.env)
        assert {k: env[k] for k in expected_image} == expected_image
        assert env["A"] == "it's $HOME\nx" and env["FROM_SHELL"] == "v" and "UNSET_ONE" not in env
        assert env["NODE_RANK"] == str(rank) and env["MASTER_ADDR"] == "10.9.0.1"
        assert env["NODEKIT_IMAGE_ID"] == IMAGE.id
        assert env["NODEKIT_JOB_SECRET"] == SECRET and not [a for a in argv if SECRET in a]
        # Nothing of the task's own environment leaks in: Slurm's variables, HOME, the fakes' PATH.
        assert not [k for k in env if k.startswith(("SLURM", "FAKE"))] and "HOME" not in env


CH_TASK_DIR = re.compile(r"^/var/tmp/nodekit-slurm-ch\.42\.[01]\.[A-Za-z0-9]{6,}$")


def task_dir(argv: list[str]) -> str:
    """The task's own directory that ch-run was given (its mount point is ``mnt`` there)."""
    mounts = [a.removeprefix("--mount=") for a in argv if a.startswith("--mount=")]
    assert len(mounts) == 1 and mounts[0].endswith("/mnt"), argv
    return mounts[0].removesuffix("/mnt")


@pytest.mark.parametrize("codes", [{}, {"FAKE_EXIT_1": "3"}], ids=["success", "failure"])
def test_each_charliecloud_task_gets_its_own_private_directory_removed_at_its_end(
    tmp_path: Path, codes: dict[str, str]
) -> None:
    """ch-run's defaults (/var/tmp/$USER.ch/mnt, and /var/tmp/$USER.ch as image storage) are shared by every ch-run
    of the user on the node, and any user may make them first: each task makes its own directory instead (mktemp:
    0700, a name nobody can guess or take first), ch-run mounts in it and looks images up by name only there, and
    the task removes it when it ends, whatever its exit code."""
    stage = fake.stage(tmp_path, "ch-run")
    image = tmp_path / "demo.sqsh"
    image.write_text("not really a squashfs")
    s = project(tmp_path / "p", pass_env=tuple(codes))  # the fake ch-run's exit code, through its clean environment
    done = fake.run_script(render(job(s, "charliecloud", str(image))), {**stage, **codes}, tmp_path)
    assert done.returncode == (3 if codes else 0), done.stdout + done.stderr
    owner = pwd.getpwuid(os.getuid()).pw_name
    dirs = [task_dir(fake.recorded(tmp_path, "argv", rank)) for rank in (0, 1)]
    for rank, d in enumerate(dirs):
        assert CH_TASK_DIR.match(d) and f".{rank}." in d, d
        # While ch-run ran: the task's directory was 0700 and this user's, holding only the empty mount point.
        seen = (tmp_path / f"dirs-{rank}").read_text().splitlines()
        assert seen == [f"mount 755 {owner} ", f"storage 700 {owner} mnt "], seen
        assert fake.environ(tmp_path, rank)["CH_IMAGE_STORAGE"] == d
        assert not Path(d).exists(), f"{d} left behind"
    assert dirs[0] != dirs[1]


def test_a_cancelled_charliecloud_task_removes_its_directory(tmp_path: Path) -> None:
    """scancel signals every process of the step (SIGTERM): the task removes its directory before it dies."""
    stage = fake.stage(tmp_path, "ch-run")
    image = tmp_path / "demo.sqsh"
    image.write_text("not really a squashfs")
    path = tmp_path / "job.sbatch"
    # The gate that never opens reaches the fake ch-run by pass_env: it trains until cancelled.
    path.write_text(render(job(project(tmp_path / "p", pass_env=("FAKE_GATE",)), "charliecloud", str(image))))
    gate = tmp_path / "never"
    proc = subprocess.Popen(
        ["bash", str(path)], env={**stage, "FAKE_GATE": str(gate)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"argv-{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the fake ch-run did not start on both nodes"
            time.sleep(0.05)
        dirs = [task_dir(fake.recorded(tmp_path, "argv", rank)) for rank in (0, 1)]
        assert all(Path(d).is_dir() for d in dirs)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        deadline = time.monotonic() + 10
        while [d for d in dirs if Path(d).exists()] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [d for d in dirs if Path(d).exists()] == [], "left behind after SIGTERM"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.parametrize(
    ("codes", "job_code", "named"),
    [
        ({}, 0, None),
        ({"1": "3"}, 3, "node 1 (n2) failed first"),  # node 1's script failed; node 0's watchdog stops it: 19
        ({"0": "19", "1": "5"}, 5, "node 1 (n2) failed first"),
        ({"0": "17", "1": "17"}, 17, "failed first"),  # whichever reported first
        ({"0": "19"}, 19, "a node was lost or failed"),
    ],
)
def test_the_job_exits_with_the_failing_nodes_code(
    tmp_path: Path, codes: dict[str, str], job_code: int, named: str | None
) -> None:
    stage = fake.stage(tmp_path, "docker")
    env = {**stage, **{f"FAKE_EXIT_{r}": c for r, c in codes.items()}}
    if codes == {"1": "3"}:
        env["FAKE_EXIT_0"] = "19"
    done = fake.run_script(render(job(project(tmp_path / "p"))), env, tmp_path)
    assert done.returncode == job_code, done.stdout + done.stderr
    if named:
        assert named in done.stdout.splitlines()[-1]


SPOOF = "nodekit-slurm: node 0 (n1) exited with code 3"


@pytest.mark.parametrize(
    "said",
    [
        SPOOF + "\\n",
        "nodekit-slurm: node 1 (n2) exited with code 3\\n",  # its own rank
        "0: " + SPOOF + "\\n",  # as if srun had labelled it node 0's
        "x " + SPOOF + "\\n",  # a token that is not the job's
        SPOOF,  # the job's last line, left open: the task's own report follows on the same line
    ],
)
def test_the_jobs_own_output_cannot_decide_the_jobs_exit_code(tmp_path: Path, said: str) -> None:
    """Rank 1's job prints the line a task reports its exit code with, then both nodes exit 0: the job ends 0.
    Only a line tagged with the job's report token (in the tasks' environment, never printed) counts."""
    stage = fake.stage(tmp_path, "docker")
    done = fake.run_script(render(job(project(tmp_path / "p"))), {**stage, "FAKE_SAY_1": said}, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "nodekit-slurm: every node finished (exit code 0)", done.stdout
    assert REPORT_TOKEN not in done.stdout + done.stderr


def test_a_report_after_an_open_last_line_still_counts(tmp_path: Path) -> None:
    """A job whose last output has no newline (a progress bar's \\r line) shares its line with the task's report;
    the report is still read, and the job's part is shown as a line of its own."""
    stage = fake.stage(tmp_path, "docker")
    env = {**stage, "FAKE_SAY_1": "epoch 3 73%", "FAKE_EXIT_1": "3", "FAKE_EXIT_0": "19"}
    done = fake.run_script(render(job(project(tmp_path / "p"))), env, tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "1: epoch 3 73%" in lines and "1: nodekit-slurm: node 1 (n2) exited with code 3" in lines
    assert lines[-1] == "nodekit-slurm: the job failed with exit code 3: node 1 (n2) failed first"


def test_the_log_streams_while_the_job_runs(tmp_path: Path) -> None:
    """Every line reaches the log when the task prints it, not when the job ends (Debian's mawk, which decides the
    exit code, would otherwise hold a pipe's lines back until a block is full). The fake job waits at a gate until
    the test has seen its first line: a log that lags would never show it."""
    import selectors

    stage = fake.stage(tmp_path, "docker")
    path = tmp_path / "job.sbatch"
    path.write_text(render(job(project(tmp_path / "p"))))
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        ["bash", str(path)], env={**stage, "FAKE_GATE": str(gate)}, stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=20)
    first = proc.stdout.readline() if ready else ""
    gate.touch()
    rest = proc.stdout.read()
    assert proc.wait(timeout=30) == 0, first + rest
    assert "training on node" in first, f"no line reached the log while the job ran; at its end:\n{rest}"
    assert "still training" in rest


def test_a_node_without_docker_ends_the_job_with_exit_2_naming_it(tmp_path: Path) -> None:
    stage = fake.stage(tmp_path)  # no docker anywhere on PATH
    env = {**stage, "PATH": stage["PATH"].split(":", 1)[0] + ":" + _path_without("docker", tmp_path / "sys")}
    done = fake.run_script(render(job(project(tmp_path / "p"))), env, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nodekit: [node 1 on n2] docker is not on PATH. Fix: install Docker on every node" in done.stdout
    assert "nodekit-slurm: the nodes' check failed (exit code 2): nothing was started" in done.stdout
    assert not (tmp_path / "argv-0").exists()


def _path_without(tool: str, d: Path) -> str:
    """A directory of symlinks to /usr/bin and /bin's programs except ``tool``."""
    d.mkdir()
    for src in (Path("/bin"), Path("/usr/bin")):
        for f in src.iterdir():
            if f.name != tool and not (d / f.name).exists():
                (d / f.name).symlink_to(f)
    return str(d)


@pytest.mark.parametrize("mode", ["docker", "charliecloud", "pyxis"])
def test_golden(tmp_path: Path, mode: str) -> None:
    s = project(
        tmp_path / "p",
        env={"NCCL_DEBUG": "WARN", "QUOTED": "a 'b' $c"},
        pass_env=("WANDB_API_KEY",),
        mounts=(Mount(host="/data/set", container="/data", check="sizes"),),
        slurm=SlurmSettings(
            container=mode,  # type: ignore[arg-type]
            partition="gpu",
            account="ml",
            time="2:00:00",
            gpus_per_node=4,
            sbatch_args=("--exclusive", "--qos=high"),
        ),
        nproc_per_node="auto",
    )
    text = render(job(s, mode)).replace(str(tmp_path / "p"), "/srv/project")
    path = GOLDEN / f"slurm-{mode}.sbatch"
    update_golden(path, text)
    assert text == path.read_text()
    assert "#SBATCH --gpus-per-node=4" in text and "NPROC_PER_NODE=4" in text


def test_per_node_differences_get_their_own_case(tmp_path: Path) -> None:
    s = project(tmp_path / "p", nodes={1: NodeOverride(nproc_per_node=2)}, nproc_per_node=1)
    text = render(job(s))
    assert "\n0)\n" in text and "\n1)\n" in text and "--env=NPROC_PER_NODE=2" in text
    same = render(job(project(tmp_path / "q", nproc_per_node=1)))
    assert "\n0|1)\n" in same


def test_every_field_of_a_gpu_infiniband_container_has_a_docker_run_flag(tmp_path: Path) -> None:
    """The container nodekit up runs on a node with GPUs and InfiniBand, rendered field by field."""
    from nodekit.backends.slurm.modes import docker_args
    from nodekit.job.plan import plan_container
    from nodekit.job.spec import launch_spec, node_spec
    from nodekit.system.host.facts import HostFacts

    s = project(tmp_path / "p", nodes={1: NodeOverride(gpus=4)})
    facts = HostFacts(gpu_count=4, infiniband=("/dev/infiniband/uverbs0",))
    spec = plan_container(node_spec(s, launch_spec(s), 1, None, facts), facts, image=IMAGE.ref, output_dir="/o")
    args = [word(a) for a in docker_args(job(s), spec)]
    assert spec.gpus == 4 and '--gpus="${nk_gpus}"' in args
    assert "--device=/dev/infiniband/uverbs0:/dev/infiniband/uverbs0" in args and "--cap-add=IPC_LOCK" in args
    # The limits are this node's to decide at run time (nk_ulimit), up to what nodekit up asks for.
    assert {"--stop-timeout=45", "$(nk_ulimit stack -s 67108864)", "$(nk_ulimit memlock -l -1)"} <= set(args)


def test_the_secret_is_in_the_script_once_exported_and_never_in_a_task_argument(tmp_path: Path) -> None:
    """srun and bash -c carry the task's body as an argument, which every user of the node can read in ps: the
    secret is only in the batch shell's environment (this 0600 script), whence srun passes it to every task."""
    for mode in ("docker", "charliecloud", "pyxis"):
        text = render(job(project(tmp_path / mode), mode))
        assert [ln for ln in text.splitlines() if SECRET in ln] == [f"export NODEKIT_JOB_SECRET={SECRET}"], mode
        # The report token too: whoever reads it could write the line that decides the job's exit code.
        assert [ln for ln in text.splitlines() if REPORT_TOKEN in ln] == [f"export NODEKIT_REPORT_TOKEN={REPORT_TOKEN}"]


def test_a_10000_node_script_with_per_node_gpus_passes_no_argument_that_grows_with_the_nodes(tmp_path: Path) -> None:
    """The task's body grows with the job (every node's declared GPUs and processes: 191 kB at 10,000 nodes, the
    documented bound); as one argument of srun and of bash -c it passed Linux's 128 KiB per argument ("srun: Argument
    list too long"). It travels in pieces; the script runs on the stage (its first two nodes report) and each node's
    docker run gets the whole declaration."""
    n = 10_000
    s = project(tmp_path / "p", nnodes=n, nodes={r: NodeOverride(gpus=8) for r in range(n)})
    text = render(job(s))
    stage = fake.stage(tmp_path, "docker")
    # The stage's srun records its arguments, then runs on.
    srun = Path(stage["PATH"].split(":")[0]) / "srun"
    srun.write_text(
        srun.read_text().replace("set -o pipefail\n", 'set -o pipefail\nprintf "%s\\0" "$@" > "$FAKE_DIR/srun-args"\n')
    )
    done = fake.run_script(text, stage, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    args = (tmp_path / "srun-args").read_bytes().split(b"\0")
    assert max(len(a) for a in args) <= 32 * 1024, "an argument of srun grows with the number of nodes"
    declared = ",".join(f"{r}:8" for r in range(n))
    for rank in (0, 1):
        assert f"--env=NODEKIT_GPUS_DECLARED={declared}" in fake.recorded(tmp_path, "argv", rank)
