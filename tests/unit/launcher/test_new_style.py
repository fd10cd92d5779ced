"""Adding a launch style is a change to two files (the recipe in docs/architecture.md): its name in
nodekit/launcher/contract.py and its plan, with how it runs (``plan.Runs``), in nodekit/launcher/plan.py. These
tests make exactly those two edits to a copy of the package and run the style from it: nodekit.toml accepts it,
every backend renders it (compose, Slurm, Kubernetes), and the launcher, started with the compose file's
environment, becomes its process (an exec style) or starts and watches its processes (a children style: two nodes
on loopback, with the preflight, the peer watchdog, the stall watch and the naming of a failed process, none of
which main.py had to be told about)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from nodekit.launcher.contract import EXIT_PEER_LOST, EXIT_STALLED
from tests.ports import quiet_ports

ROOT = Path(__file__).resolve().parents[3]

CONTRACT_EDIT = (
    '    DISTRIBUTED_LAUNCH = "torch.distributed.launch"',
    '    THROWAWAY = "throwaway"  # a style made by tests/unit/launcher/test_new_style.py',
)
MODES_EDIT = ("LaunchMode.MPIRUN)", "LaunchMode.MPIRUN, LaunchMode.THROWAWAY)")
PLAN_EDIT = """

def _throwaway(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    code = "import os, sys; print('throwaway style: node', os.environ['NODE_RANK'], 'runs', *sys.argv[1:])"
    return ExecPlan(argv=(tools.python, "-c", code, *command.argv()))


STYLES[LaunchMode.THROWAWAY] = Style(_throwaway, Runs.EXEC)
"""

DRIVER = r"""
import json, os, sys
from pathlib import Path
from nodekit.backends.compose.render import render_compose
from nodekit.backends.k8s.plan import plan_k8s
from nodekit.backends.slurm.job import InspectedImage, plan_job
from nodekit.backends.slurm.render import render
from nodekit.config.settings import load
from nodekit.job.plan import plan_container
from nodekit.job.spec import launch_spec, node_spec
from nodekit.system.host.facts import HostFacts

project = Path(sys.argv[1])
s = load(project / "nodekit.toml")
node = node_spec(s, launch_spec(s), 0, "127.0.0.1", HostFacts())
spec = plan_container(node, HostFacts(), image="i", output_dir="/o")
env = render_compose(spec)["services"]["train"]["environment"]
job = plan_job(s, InspectedImage(ref="i", id="sha256:1"), mode="docker", job_secret="s" * 16, report_token="t" * 32)
script = render(job)
k8s = plan_k8s(s, image="r/i:1", fingerprint="", secret="s" * 16, kind="job", out_dir=Path("k8s")).files[0].text
print(json.dumps({"env": env, "slurm": script, "k8s": k8s}))
"""


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer has {old!r}: update this test and the recipe"
    path.write_text(text.replace(old, new))


def _copy_with_style(tmp_path: Path, plan_edit: str) -> Path:
    """A copy of nodekit with the style ``throwaway`` added by the recipe's two edits, and nothing else changed."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "nodekit", copy / "nodekit", ignore=shutil.ignore_patterns("__pycache__"))
    launcher = copy / "nodekit" / "launcher"
    _edit(launcher / "contract.py", CONTRACT_EDIT[0], "\n".join(CONTRACT_EDIT))
    _edit(launcher / "contract.py", *MODES_EDIT)
    (launcher / "plan.py").write_text((launcher / "plan.py").read_text() + plan_edit)
    changed = [
        p.relative_to(copy).as_posix()
        for p in sorted((copy / "nodekit").rglob("*.py"))
        if p.read_bytes() != (ROOT / p.relative_to(copy)).read_bytes()
    ]
    assert changed == ["nodekit/launcher/contract.py", "nodekit/launcher/plan.py"]
    return copy


def test_a_new_launch_style_is_two_files(tmp_path: Path) -> None:
    copy = _copy_with_style(tmp_path, PLAN_EDIT)

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "nodekit.toml").write_text('name = "demo"\nscript = "train.py"\nnnodes = 2\nlauncher = "throwaway"\n')
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(project)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert str(copy) in subprocess.run(
        [sys.executable, "-c", "import nodekit; print(nodekit.__file__)"], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    ).stdout  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["env"]["NODEKIT_LAUNCHER"] == "throwaway"
    assert "--env=NODEKIT_LAUNCHER=throwaway" in out["slurm"]
    assert "name: NODEKIT_LAUNCHER\n          value: throwaway" in out["k8s"]

    # The launcher, given node 0's environment from the compose file, becomes the new style's process.
    node = {k: v for k, v in out["env"].items() if v is not None} | {"NODEKIT_PREFLIGHT": "0"}
    ran = subprocess.run(
        [sys.executable, "-m", "nodekit.launcher", "train.py", "--lr", "1"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(copy), **node},
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "throwaway style: node 0 runs train.py --lr 1" in ran.stdout


CHILDREN_EDIT = """

def _throwaway(cfg: LaunchConfig, command: Command, tools: Tools) -> ExecPlan:
    first = cfg.node_rank * cfg.nproc_per_node
    each = tuple((("THROWAWAY_RANK", str(first + i)), ("THROWAWAY_LOCAL", str(i))) for i in range(cfg.nproc_per_node))
    return ExecPlan(argv=(tools.python, *command.argv()), per_process=each, first_rank=first)


STYLES[LaunchMode.THROWAWAY] = Style(_throwaway, Runs.CHILDREN)
"""

# The unit tier has no torch. The preflight asks torch its version, and the stacks hook (armed in every process of
# the job, as the image's exit guard arms it) asks torch.distributed whether a process group is up and which rank
# this is: this stand-in answers those questions and nothing else.
TORCH_STAND_IN = {
    "torch/__init__.py": "__version__ = '0.0+stand-in'\nfrom torch import distributed, version\n",
    "torch/version.py": "cuda = None\n",
    "torch/distributed/__init__.py": (
        "import os\n"
        "def is_available(): return True\n"
        "def is_initialized(): return True\n"
        "def get_rank(): return int(os.environ['THROWAWAY_RANK'])\n"
        "def get_world_size(): return 4\n"
    ),
}

# Each process of the job: arms the stacks hook as the exit guard would, then does what THROWAWAY_DO says for its
# rank: "fail" (exit 3 after a second) or anything else (wait, in one place, for a minute).
TRAIN = """
import os, sys, time
from nodekit.launcher.stacks import hook
import torch.distributed
assert hook.arm_from_env()
print("throwaway process", os.environ["THROWAWAY_RANK"], "of node", os.environ["NODE_RANK"], flush=True)
if os.environ.get("THROWAWAY_DO") == os.environ["THROWAWAY_RANK"]:
    time.sleep(1)
    sys.exit(3)
time.sleep(60)
"""


def _two_nodes(tmp_path: Path, copy: Path, **extra: str) -> list[tuple[int, str]]:
    """Both nodes' launchers on loopback, each with its compose file's environment; their exit codes and output."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    toml = 'name = "demo"\nscript = "train.py"\nnnodes = 2\nnproc_per_node = 2\nlauncher = "throwaway"\n'
    (project / "nodekit.toml").write_text(toml)
    for rel, text in TORCH_STAND_IN.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_text(text)
    pythonpath = {"PYTHONPATH": str(copy)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(project)], env={**os.environ, **pythonpath},
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in json.loads(done.stdout)["env"].items() if v is not None}
    port, preflight = quiet_ports(2)  # not from the ephemeral range, which other tests' connections draw on
    job = env | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODEKIT_PREFLIGHT_PORT": str(preflight),
                 "NODEKIT_JOB_SECRET": "s" * 32, "NODEKIT_OUTPUT_DIR": str(tmp_path / "out"),
                 "NODEKIT_LINK_CHECK": "off", "NODEKIT_GPU_HEALTH": "off", "NODEKIT_PEER_TIMEOUT": "5",
                 "NODEKIT_RDZV_TIMEOUT": "60", **extra}  # fmt: skip
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "nodekit.launcher", "train.py"],
            env={
                "PATH": os.environ["PATH"],
                **pythonpath,
                **job,
                "NODE_RANK": str(rank),
                "NODEKIT_WORKER_DIR": str(tmp_path / f"workers{rank}"),
            },
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        return [(p.returncode, out) for p in nodes for out, _ in [p.communicate(timeout=120)]]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_children_style_names_the_failed_process_and_stops_the_other_node(tmp_path: Path) -> None:
    copy = _copy_with_style(tmp_path, CHILDREN_EDIT)
    (code0, out0), (code1, out1) = _two_nodes(tmp_path, copy, THROWAWAY_DO="3", NODEKIT_STALL_TIMEOUT="0")
    assert "nodekit preflight: ok" in out0 and "throwaway process 0 of node 0" in out0
    # Node 1's own processes: the failed one is named by its global rank, the other stopped, its code is the node's.
    assert "process rank 3 (local rank 1) exited with code 3; stopping the other 1 process(es)" in out1, out1
    assert code1 == 3, out1
    # Node 0, through the peer watchdog: node 1 failed, so it stops its part and says why.
    assert code0 == EXIT_PEER_LOST, out0
    assert "node 1" in out0 and "rank 3 (local rank 1) exited with code 3; nothing restarts it" in out0, out0


def test_a_children_style_is_under_the_stall_watch(tmp_path: Path) -> None:
    copy = _copy_with_style(tmp_path, CHILDREN_EDIT)
    (code0, out0), (code1, out1) = _two_nodes(tmp_path, copy, NODEKIT_STALL_TIMEOUT="5")
    assert (code0, code1) == (EXIT_STALLED, EXIT_STALLED), out0 + out1
    assert "train.py" in out0, out0  # every rank's stack, grouped by where it waits
