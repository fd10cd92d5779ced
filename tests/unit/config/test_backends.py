"""Adding a backend is its folder, its CLI module and one registration (nodekit/config/backends.py; the recipe in
docs/architecture.md). This test writes a throwaway backend into a copy of the package, touching exactly those, and
runs it from the copy as a user would: `nodekit --help` lists its command, its table is in nodekit.toml's reference and
its keys are named the way the other backends' are in errors, its --dry-run prints the one plan shape, applying
writes what was printed, and its runs are recorded. The registry also drives every list in this tree (the second
test)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from nodekit.cli.app import app
from nodekit.cli.common import TOPICS
from nodekit.config import backends
from nodekit.config.file import shown_key
from nodekit.config.settings import Settings
from nodekit.runs.model import NotARecord, RunRecord

ROOT = Path(__file__).resolve().parents[3]

REGISTRY_EDITS = (
    (
        "class BackendTables(BaseModel):",
        '''class ToySettings(BaseModel):
    """``[toy]``: the throwaway backend of tests/unit/config/test_backends.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    greeting: str = Field("hello", description="what the toy backend writes")


class BackendTables(BaseModel):''',
    ),
    (
        'the Kubernetes manifests ([k8s])")\n',
        'the Kubernetes manifests ([k8s])")\n'
        '    toy: ToySettings = Field(default_factory=ToySettings, description="nodekit toy ([toy])")\n',
    ),
    (
        '    Backend("k8s", topic="k8s", commands=("k8s",), table="k8s"),\n',
        '    Backend("k8s", topic="k8s", commands=("k8s",), table="k8s"),\n'
        '    Backend("toy", topic="toy", commands=("toy",), records=("toy",), table="toy"),\n',
    ),
)

TOY_PLAN = '''"""The throwaway backend: one text file per job."""

from __future__ import annotations

from pathlib import Path

from nodekit.backends.shape import BackendPlan, PlannedFile
from nodekit.config.settings import Settings
from nodekit.job.spec import launch_spec
from nodekit.system.files import write_atomic


def plan(settings: Settings) -> BackendPlan[Path]:
    launch = launch_spec(settings)
    path = settings.resolve(Path("toy/job.txt"))
    text = f"{settings.toy.greeting}: {launch.nnodes} nodes of {launch.name}\\n"
    return BackendPlan("toy", path, files=(PlannedFile(path, text),), notes=("a toy",))


def apply(plan: BackendPlan[Path], project_dir: Path) -> Path:
    for f in plan.files:
        write_atomic(f.path, f.text, mode=0o644, within=project_dir)
    return plan.detail
'''

TOY_CLI = '''"""``nodekit toy``: the throwaway backend."""

from __future__ import annotations

from typing import Any

import typer

from nodekit.cli.common import ConfigOpt, DryRunOpt, app, handled, job_flags, load_settings


@app.command()
@handled
@job_flags
def toy(dry_run: DryRunOpt = False, config: ConfigOpt = None, **job: Any) -> None:
    """Write the toy backend's file for the job."""
    from nodekit.backends.toy import plan as toy_plan
    from nodekit.cli.ui import show_plan
    from nodekit.runs.recorder import recording

    settings = load_settings(config, **job)
    plan = toy_plan.plan(settings)
    if dry_run:
        show_plan(plan)
        return
    with recording(settings, "toy", [(0, "here")], warn=print) as rec:
        typer.echo(toy_plan.apply(plan, settings.project_dir))
        rec.finish(0)
'''

DRIVER = r"""
import json, sys
from nodekit.cli.reference import config_page
from nodekit.config.backends import backend
from nodekit.runs.model import RunRecord
print(json.dumps({"reference": config_page(), "registered": backend("toy").commands}))
"""


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer has {old!r}: update this test and the recipe"
    path.write_text(text.replace(old, new))


def _run(copy: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEKIT_")} | {"PYTHONPATH": str(copy)}
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_new_backend_is_its_folder_its_cli_module_and_one_registration(tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "nodekit", copy / "nodekit", ignore=shutil.ignore_patterns("__pycache__"))
    package = copy / "nodekit"
    for old, new in REGISTRY_EDITS:
        _edit(package / "config" / "backends.py", old, new)
    (package / "backends" / "toy").mkdir()
    (package / "backends" / "toy" / "__init__.py").write_text('"""The throwaway backend."""\n')
    (package / "backends" / "toy" / "plan.py").write_text(TOY_PLAN)
    (package / "cli" / "toy.py").write_text(TOY_CLI)
    changed = sorted(
        p.relative_to(copy).as_posix()
        for p in package.rglob("*.py")
        if not (ROOT / p.relative_to(copy)).is_file() or p.read_bytes() != (ROOT / p.relative_to(copy)).read_bytes()
    )
    assert changed == [
        "nodekit/backends/toy/__init__.py",
        "nodekit/backends/toy/plan.py",
        "nodekit/cli/toy.py",
        "nodekit/config/backends.py",
    ]

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "nodekit.toml").write_text('name = "demo"\nscript = "train.py"\nnnodes = 2\n\n[toy]\ngreeting = "hi"\n')
    assert str(copy) in _run(copy, project, "-c", "import nodekit; print(nodekit.__file__)").stdout

    helped = _run(copy, project, "-m", "nodekit", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "toy" in helped.stdout and "Write the toy backend's file" in helped.stdout

    dry = _run(copy, project, "-m", "nodekit", "toy", "--nnodes", "3", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    path = project / "toy" / "job.txt"
    assert dry.stdout == f"# would write {path}:\nhi: 3 nodes of demo\n# note: a toy\n"
    assert not path.exists()

    done = _run(copy, project, "-m", "nodekit", "toy", "--nnodes", "3")
    assert done.returncode == 0, done.stderr
    assert path.read_text() == "hi: 3 nodes of demo\n"  # what the dry run printed
    records = list((project / ".nodekit" / "runs").rglob("*.json"))
    assert any(json.loads(r.read_text()).get("command") == "toy" for r in records), records

    (project / "nodekit.toml").write_text('name = "demo"\nscript = "train.py"\n\n[toy]\ngreetin = "hi"\n')
    bad = _run(copy, project, "-m", "nodekit", "toy", "--dry-run")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "[toy] greetin" in bad.stderr and "did you mean greeting?" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

    derived = _run(copy, project, "-c", DRIVER)
    assert derived.returncode == 0, derived.stderr
    out = json.loads(derived.stdout)
    assert "## [toy]\n" in out["reference"] and "| `greeting` | string |" in out["reference"]
    assert out["registered"] == ["toy"]


def test_the_registry_drives_every_list_of_backends() -> None:
    registered = {b.name: b for b in backends.BACKENDS}
    assert set(registered) == {p.name for p in (ROOT / "nodekit" / "backends").iterdir() if p.is_dir()} - {
        "__pycache__"
    }
    commands = {c.name or getattr(c.callback, "__name__", ""): c for c in app.registered_commands}
    for b in backends.BACKENDS:
        assert b.topic in TOPICS
        assert (ROOT / "nodekit" / "cli" / f"{b.topic}.py").is_file()
        for name in b.commands:
            assert commands[name].callback is not None
            assert commands[name].callback.__module__ == f"nodekit.cli.{b.topic}", name
        assert set(b.records) <= set(b.commands)
        if b.table is not None:
            assert b.table in Settings.model_fields
            assert shown_key([b.table, "key"]) == f"[{b.table}] key"
            # Its model beside its registration, as the recipe writes the throwaway backend's: no shared module
            # of tables (config/tables.py) to edit as well.
            model = backends.BackendTables.model_fields[b.table].annotation
            assert getattr(model, "__module__", None) == backends.__name__, (b.table, model)
    assert backends.recorded() == ("up", "run", "slurm")
    base = {"id": "r", "project": "/p", "started": 1.0, "pid": 1, "settings": {}, "settings_digest": "", "nodes": []}
    for command in backends.recorded():
        assert RunRecord.from_dict({**base, "command": command}).command == command
    try:
        RunRecord.from_dict({**base, "command": "k8s"})
    except NotARecord as e:
        assert "up, run, slurm" in str(e)
    else:
        raise AssertionError("a record of a command that records no runs was read")
