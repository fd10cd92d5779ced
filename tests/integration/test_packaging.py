"""`pip install .` must give a working nodekit without a checkout: the Dockerfile, the compose template and the
launcher travel inside the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (found,) = out.glob("nodekit-*.whl")
    return found


def test_wheel_carries_the_assets_and_the_launcher(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "nodekit/_assets/images/Dockerfile",
        "nodekit/launcher/__main__.py",
        "nodekit/py.typed",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert not any(n.startswith("tests/") for n in names)


def test_installed_wheel_finds_its_assets_outside_a_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
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
