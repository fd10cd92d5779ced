"""A real image whose lock holds a wheel nodekit built from a source distribution.

The image still installs offline with ``--require-hashes``: the built wheel travels in the wheelhouse, its hash in
the lock. The project has no torch, so the build takes seconds; the package index is offline (a find-links
directory made by the test).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from nodekit.config.settings import load
from nodekit.errors import EngineError
from nodekit.image import builder as building
from nodekit.image.lock import parse_lock
from nodekit.image.plan import LABEL_NAME
from nodekit.system import docker
from nodekit.system.progress import RecordingReporter
from tests.conftest import unavailable
from tests.factories import make_sdist

pytestmark = pytest.mark.docker

NAME = "nodekit-itest-sdist"


def _remove_images() -> None:
    for info in docker.images_labelled(LABEL_NAME, NAME):
        for tag in info.tags:
            docker.remove_image(tag)


def test_an_image_installs_a_wheel_built_from_an_sdist_offline_with_hashes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setuptools_wheel: Path,
) -> None:
    try:
        docker.check_engine()
    except EngineError as e:
        unavailable("real-Docker tests", e.one_line())
    links = tmp_path / "links"
    links.mkdir()
    shutil.copy(setuptools_wheel, links)
    sdist = make_sdist(links, "sdonly", "1.0")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "nodekit.toml").write_text(f'name = "{NAME}"\nscript = "train.py"\npackages = ["sdonly"]\n')
    (proj / "train.py").write_text("import sdonly\nprint('sdonly', sdonly.VERSION)\n")
    settings = load(proj / "nodekit.toml")
    if docker.image_info(settings.base_image) is None:
        unavailable("real-Docker tests", f"base image {settings.base_image} is missing (nodekit base)")
    _remove_images()
    try:
        result = building.build(settings, RecordingReporter())
        lock = parse_lock((proj / "nodekit.lock").read_text())
        (record,) = lock.built
        assert record.name == "sdonly" and record.sdist_sha256 == hashlib.sha256(sdist.read_bytes()).hexdigest()
        pin = lock.get("sdonly")
        assert pin is not None
        out = docker.run_in_image(
            result.tag,
            ["-c", "import sdonly, importlib.metadata as m; print(sdonly.VERSION, m.version('sdonly'))"],
            entrypoint="python",
        )
        assert out.strip().splitlines()[-1] == "1.0 1.0"
        # the wheel the image installed is the locked one: pip checked its hash (--require-hashes) in the build
        staged = next((proj / ".nodekit" / "build").rglob("sdonly-1.0-py3-none-any.whl"))
        assert hashlib.sha256(staged.read_bytes()).hexdigest() == pin.hashes[0]
        assert docker.run_in_image(result.tag, ["/opt/venv/nodekit.lock"], entrypoint="cat").count("# built:") == 1
    finally:
        _remove_images()
