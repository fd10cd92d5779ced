"""Real builds on the real engine: one small torch project, built once per session and shared by every test.

A torch image takes minutes on two cores, so the tests are few and ordered to reuse that build: labels and
records, a no-op rebuild, a code-only rebuild that shares every layer but the last, running torch, inspect.
Without an engine (or without the base image) they follow tests/conftest.py's one rule: skip on a laptop, fail
in CI.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodekit.config.settings import Settings, load
from nodekit.errors import EngineError, ImageError
from nodekit.image import builder as building
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_LOCK, LABEL_NAME, LABEL_PYTHON, LABEL_TORCH
from nodekit.system import docker
from nodekit.system.progress import RecordingReporter
from tests.conftest import unavailable

pytestmark = pytest.mark.docker

NAME = "nodekit-itest-build"
TRAIN = "import torch\nprint('loss', torch.zeros(1).sum().item())\n"


@dataclass
class Built:
    project: Path
    settings: Settings
    first: building.BuildResult
    reporter: RecordingReporter


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    try:
        docker.check_engine()
    except EngineError as e:
        unavailable("real-Docker tests", e.one_line())
    project = tmp_path_factory.mktemp("build") / "proj"
    (project / "data").mkdir(parents=True)
    (project / "nodekit.toml").write_text(f'name = "{NAME}"\nscript = "train.py"\npackages = ["torch==2.13.0"]\n')
    (project / "train.py").write_text(TRAIN)
    (project / "data" / "big.bin").write_bytes(os.urandom(1 << 20))
    (project / ".dockerignore").write_text("data\n")
    settings = load(project / "nodekit.toml")
    if docker.image_info(settings.base_image) is None:
        unavailable("real-Docker tests", f"base image {settings.base_image} is missing (nodekit base)")
    _remove_images()  # a run killed before its teardown leaves them, and the first build would be a no-op
    rep = RecordingReporter()
    first = building.build(settings, rep)
    yield Built(project, settings, first, rep)
    _remove_images()
    shutil.rmtree(project, ignore_errors=True)


def _remove_images() -> None:
    for info in docker.images_labelled(LABEL_NAME, NAME):
        for tag in info.tags:
            docker.remove_image(tag)


def test_first_build_creates_the_lock_and_labels_the_image(built: Built) -> None:
    r = built.first
    assert not r.skipped and r.lock_created
    assert (built.project / "nodekit.lock").is_file()
    assert re.fullmatch(rf"nodekit/{NAME}:[0-9a-f]{{12}}", r.tag)
    assert r.tag.endswith(r.fingerprint[:12])
    info = docker.require_image(r.tag)
    assert info.id == r.image_id
    assert info.labels[LABEL_FINGERPRINT] == r.fingerprint
    assert info.labels[LABEL_NAME] == NAME
    assert info.labels[LABEL_TORCH] == "2.13.0+cpu"
    assert info.labels[LABEL_PYTHON] == "3.11"
    assert len(info.labels[LABEL_LOCK]) == 64
    assert info.env["NODEKIT_FINGERPRINT"] == r.fingerprint
    assert info.env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # A first build lacks every package layer: BuildKit builds them at once, its lines tagged with each layer.
    said = built.reporter.said("step")
    assert "building 3 layers at once: Python environment and CUDA libraries, framework, packages" in said, said
    details = built.reporter.said("detail")
    for name in ("env", "framework", "packages"):
        assert any(d.startswith(f"{name} | {name} layer ") for d in details), details
    assert any(d.startswith("packages | #") and "RUN --mount=type=bind,from=wheels" in d for d in details), details
    record = json.loads((built.project / ".nodekit" / "last-build.json").read_text())
    assert record["tag"] == r.tag and record["image_id"] == r.image_id
    assert building.current_image(built.settings) == r.tag


def test_noop_rebuild_is_skipped_and_fast(built: Built) -> None:
    building.build(built.settings, RecordingReporter())  # whatever an earlier test left, built now
    for path in (built.project / "train.py", built.project / "data" / "big.bin"):
        os.utime(path, (time.time() + 60, time.time() + 60))  # mtimes are not inputs
    (built.project / "data" / "big.bin").write_bytes(b"ignored by .dockerignore")
    t0 = time.monotonic()
    again = building.build(built.settings, RecordingReporter())
    elapsed = time.monotonic() - t0
    assert again.skipped
    assert elapsed < 2.0, f"no-op rebuild took {elapsed:.2f} s"


def test_a_checkout_without_the_blob_store_writes_it_again_as_the_same_image(built: Built) -> None:
    """A fresh clone on a machine that already has the image: its push must not fall back to `docker save` for want
    of the image's layers in the store, so the build writes the store again (BuildKit's cache makes the package
    layers at once), the same image id."""
    from nodekit.image.blobs import BLOBS

    before = building.build(built.settings, RecordingReporter())
    store = built.project / BLOBS
    shutil.rmtree(store)
    rep = RecordingReporter()
    again = building.build(built.settings, rep)
    assert again.image_id == before.image_id and again.tag == before.tag
    assert any("blob store lacks its layers" in d for d in rep.said("detail")), rep.said("detail")
    assert (store / "sha256" / before.image_id.removeprefix("sha256:")).is_file()
    assert building.build(built.settings, RecordingReporter()).skipped  # now whole: a no-op again


def test_code_change_rebuilds_only_the_last_layer(built: Built) -> None:
    before = building.build(built.settings, RecordingReporter())
    (built.project / "train.py").write_text(TRAIN + "# changed\n")
    try:
        t0 = time.monotonic()
        after = building.build(built.settings, RecordingReporter())
        elapsed = time.monotonic() - t0
    finally:
        (built.project / "train.py").write_text(TRAIN)
    assert not after.skipped and after.tag != before.tag
    old, new = building.layers(before.tag), building.layers(after.tag)
    assert len(old) == len(new)
    assert old[:-1] == new[:-1], "base, environment and launcher layers are shared"
    assert old[-1] != new[-1]
    # generous against a busy machine; benchmarks/build_bench.py reports the real number (target < 10 s)
    assert elapsed < 30, f"code-only rebuild took {elapsed:.1f} s"
    # back to the original code: same fingerprint as before, so nothing to build
    assert building.build(built.settings, RecordingReporter()).tag == before.tag


def test_image_runs_torch_with_the_code_and_without_ignored_files(built: Built) -> None:
    tag = built.first.tag
    out = docker.run_in_image(
        tag, ["-c", "import torch, os; print(torch.__version__); print(sorted(os.listdir('.')))"], entrypoint="python"
    )
    version, listing = out.strip().splitlines()[-2:]
    assert version == "2.13.0+cpu"
    files = ast.literal_eval(listing)
    assert "train.py" in files and "nodekit.lock" in files
    assert not {"data", ".nodekit", ".dockerignore"} & set(files)


def test_inspect_reports_the_stack(built: Built) -> None:
    report = building.inspect_image(built.first.tag)
    assert report.fingerprint == built.first.fingerprint
    assert report.torch == "2.13.0+cpu"
    assert report.python and report.python.startswith("3.11")
    assert report.cuda is None and report.cudnn is None and report.nccl is None
    assert report.packages["torch"] == "2.13.0+cpu"
    assert report.not_as_locked == ()
    text = report.to_text()
    assert "none (CPU-only torch)" in text and built.first.fingerprint in text
    assert json.loads(report.to_json())["torch"] == "2.13.0+cpu"


def test_dry_run_prints_the_plan_and_changes_nothing(built: Built) -> None:
    current = building.build(built.settings, RecordingReporter())
    record = (built.project / ".nodekit" / "last-build.json").read_text()
    result = building.build(built.settings, RecordingReporter(), dry_run=True)
    assert result.dry_run and not result.skipped
    assert result.tag == current.tag
    text = str(result)
    assert result.tag in text and "build-arg BASE_IMAGE" in text and "label org.nodekit.fingerprint" in text
    assert (built.project / ".nodekit" / "last-build.json").read_text() == record


def test_two_no_cache_builds_give_the_same_image_id(built: Built, tmp_path: Path) -> None:
    """Reproducible builds, on a small package so that it takes seconds, not minutes."""
    (tmp_path / "nodekit.toml").write_text(f'name = "{NAME}-repro"\nscript = "t.py"\npackages = ["mpmath==1.3.0"]\n')
    (tmp_path / "t.py").write_text("print(1)\n")
    settings = load(tmp_path / "nodekit.toml")
    try:
        first = building.build(settings, RecordingReporter(), no_cache=True)
        os.utime(tmp_path / "t.py", (1, 1))  # another checkout: other mtimes
        second = building.build(settings, RecordingReporter(), no_cache=True)
        assert not second.skipped
        assert second.image_id == first.image_id
    finally:
        docker.remove_image(building.last_build(settings)["tag"])  # type: ignore[index]


def test_missing_base_is_refused_with_the_fix(built: Built, tmp_path: Path) -> None:
    (tmp_path / "nodekit.toml").write_text('name = "nobase"\nscript = "t.py"\nbase_image = "nodekit/absent:none"\n')
    with pytest.raises(ImageError) as e:
        building.build(load(tmp_path / "nodekit.toml"), RecordingReporter())
    assert "nodekit base" in (e.value.fix or "")
    assert not (tmp_path / "nodekit.lock").exists(), "refused before locking"
