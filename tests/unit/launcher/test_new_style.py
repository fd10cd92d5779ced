"""Adding a launch style is a change to two files (issue 29; the recipe in docs/architecture.md): its name in
nodekit/launcher/contract.py and its exec plan in nodekit/launcher/plan.py. This test makes exactly those two edits
to a copy of the package and runs the style end to end from it: nodekit.toml accepts it, every backend renders it
(compose, Slurm, Kubernetes), and the launcher, started with the compose file's environment, becomes its process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


STYLES[LaunchMode.THROWAWAY] = Style(_throwaway, torchrun=False)
"""

DRIVER = r"""
import json, os, sys
from pathlib import Path
from nodekit.backends.compose.render import render_compose
from nodekit.backends.k8s.plan import plan_k8s
from nodekit.backends.slurm.job import ImageFacts, plan_job
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
job = plan_job(s, ImageFacts(ref="i", id="sha256:1"), mode="docker", job_secret="s" * 16, report_token="t" * 32)
script = render(job)
k8s = plan_k8s(s, image="r/i:1", fingerprint="", secret="s" * 16, kind="job", out_dir=Path("k8s")).files[0].text
print(json.dumps({"env": env, "slurm": script, "k8s": k8s}))
"""


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer has {old!r}: update this test and the recipe"
    path.write_text(text.replace(old, new))


def test_a_new_launch_style_is_two_files(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "nodekit", copy / "nodekit", ignore=shutil.ignore_patterns("__pycache__"))
    launcher = copy / "nodekit" / "launcher"
    _edit(launcher / "contract.py", CONTRACT_EDIT[0], "\n".join(CONTRACT_EDIT))
    _edit(launcher / "contract.py", *MODES_EDIT)
    (launcher / "plan.py").write_text((launcher / "plan.py").read_text() + PLAN_EDIT)
    changed = [
        p.relative_to(copy).as_posix()
        for p in sorted((copy / "nodekit").rglob("*.py"))
        if p.read_bytes() != (ROOT / p.relative_to(copy)).read_bytes()
    ]
    assert changed == ["nodekit/launcher/contract.py", "nodekit/launcher/plan.py"]

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
