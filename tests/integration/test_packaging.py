"""The distribution users install: ``pip install nodekit-torch`` (``nodekit`` on PyPI is another project) gives the
``nodekit`` command, working without a checkout: the Dockerfile, the compose template and the launcher travel
inside the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = "nodekit-torch"
"""The distribution's name on PyPI: free there (``nodekit`` is an unrelated library); the command stays nodekit."""


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built by the build backend itself (no isolated environment, nothing fetched)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-t", "sdist", "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("nodekit_torch-*.whl")
    (sdist,) = out.glob("nodekit_torch-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_distribution_is_named_for_pypi_and_the_command_stays_nodekit() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST
    assert project["scripts"] == {"nodekit": "nodekit.cli.app:main"}


def test_wheel_and_sdist_carry_the_assets_and_the_launcher(dists: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(dists["wheel"]).namelist())
    for needed in (
        "nodekit/_assets/images/Dockerfile",
        "nodekit/launcher/__main__.py",
        "nodekit/launcher/runlog.py",
        "nodekit/py.typed",
    ):
        assert needed in names, f"{needed} missing from {dists['wheel'].name}"
    assert not any(n.startswith(("tests/", "docs/")) for n in names)
    with tarfile.open(dists["sdist"]) as sdist:
        inside = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    # (No compose template any more: every backend renders nodekit/job/container.py's ContainerSpec.)
    needed_in_sdist = (
        "pyproject.toml",
        "README.md",
        "images/Dockerfile",
        "nodekit/job/container.py",
        "nodekit/cli/app.py",
    )
    for needed in needed_in_sdist:
        assert needed in inside, f"{needed} missing from {dists['sdist'].name}"


def test_installed_wheel_finds_its_assets_outside_a_checkout(dists: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(dists["wheel"])],
        check=True,
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "nodekit.toml").write_text('name = "pkgtest"\nscript = "train.py"\nnnodes = 2\n')
    (project / "train.py").write_text("print('x')\n")
    env = os.environ | {"PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import nodekit.system.assets as a; print(a.images_dir()); print(a.launcher_dir())"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    images, launcher = (Path(line) for line in where.stdout.split())
    assert images.is_relative_to(target) and (images / "Dockerfile").is_file()
    assert launcher.is_relative_to(target)
    plan = subprocess.run(
        [sys.executable, "-m", "nodekit", "compose", "-r", "1", "-m", "10.0.0.5", "--image", "x:y", "--dry-run"],
        cwd=project, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert "network_mode: host" in plan.stdout and "init: true" in plan.stdout


def test_a_fresh_environment_runs_version_init_and_a_build_plan_from_the_wheel(
    dists: dict[str, Path], tmp_path: Path, docker_engine: None, record_property: pytest.RecordProperty
) -> None:
    """As a user would: a new virtual environment, ``pip install`` of the wheel (its dependencies from the index),
    then the tour's first three commands in a project of their own, far from any checkout."""
    started = time.monotonic()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(dists["wheel"])],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    record_property("fresh_venv_install_s", round(time.monotonic() - started, 1))
    cli = str(venv / "bin" / "nodekit")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODEKIT_", "PYTHONPATH", "VIRTUAL_ENV"))}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)

    project = tmp_path / "myproject"
    project.mkdir()
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == "nodekit 0.1.0", version.stdout + version.stderr
    # The user's own project: a script and its requirements, which init takes; the example's lock matches them.
    shutil.copy(ROOT / "examples" / "ddp" / "train.py", project / "train.py")
    (project / "requirements.txt").write_text("torch==2.13.0\nnumpy\n")
    init = run("init", "--name", "pkgtest")
    assert init.returncode == 0, init.stdout + init.stderr
    assert "packages from requirements.txt" in init.stdout and (project / ".dockerignore").is_file()
    shutil.copy(ROOT / "examples" / "ddp" / "nodekit.lock", project / "nodekit.lock")
    plan = run("build", "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "would build nodekit/pkgtest:" in plan.stdout + plan.stderr
    # The Dockerfile it planned with is the wheel's, not this checkout's.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import nodekit.system.assets as a; print(a.images_dir())"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
