"""A stale image is refused naming what changed since it was built, the same way on every host: the build records
its inputs, and the project's code and lock as they are now are compared with them (no base image needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.config.settings import Settings
from nodekit.errors import ImageError
from nodekit.image import builder as build
from nodekit.image.builder import selection
from nodekit.image.builder.staleness import Inputs, changes, current_inputs
from nodekit.image.plan import LABEL_FINGERPRINT, LABEL_NAME
from nodekit.system import docker

LOCK = "# python: 3.11\n# platform: manylinux_2_36_x86_64\nsix==1.17.0 --hash=sha256:" + "a" * 64 + "\n"


def test_changes_name_files_and_packages_in_a_users_words() -> None:
    old = Inputs(code={"train.py": "1", "data.py": "2", "pkg": ""}, packages={"six": "1.16.0", "tqdm": "4"})
    new = Inputs(code={"train.py": "9", "pkg": "", "eval.py": "3"}, packages={"six": "1.17.0", "rich": "13"})
    assert changes(old, new, most=10) == [
        "data.py removed", "eval.py added", "train.py changed", "package rich==13 added",
        "package six 1.16.0 -> 1.17.0", "package tqdm removed",
    ]  # fmt: skip
    assert changes(old, new, most=2) == ["data.py removed", "eval.py added", "and 4 more"]
    assert changes(old, old) == []
    assert changes(old.model_copy(update={"base": "a"}), old.model_copy(update={"base": "b"})) == ["the base image"]
    # An unknown base (a node without it) is no change.
    assert changes(old.model_copy(update={"base": "a"}), old) == []


def project(tmp_path: Path) -> Settings:
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "nodekit.lock").write_text(LOCK)
    (tmp_path / "nodekit.toml").write_text('name = "p"\nscript = "train.py"\n')
    return Settings(project_dir=tmp_path, name="p", script="train.py")


def test_nodekit_toml_is_no_input_of_the_image(tmp_path: Path) -> None:
    s = project(tmp_path)
    before = current_inputs(s)
    (tmp_path / "nodekit.toml").write_text('name = "p"\nscript = "train.py"\nrdzv_timeout = 60\nnnodes = 4\n')
    assert before is not None and current_inputs(s) == before


def test_a_host_without_the_base_refuses_a_stale_recorded_image_naming_the_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = project(tmp_path)
    inputs = current_inputs(s)
    assert inputs is not None
    tag = "nodekit/p:" + "a" * 12
    info = docker.ImageInfo(id="sha256:" + "a" * 64, tags=(tag,), labels={LABEL_NAME: "p", LABEL_FINGERPRINT: "a"},
                            size=1)  # fmt: skip
    monkeypatch.setattr(docker, "image_info", lambda ref, host=None: info if ref == tag else None)
    monkeypatch.setattr(docker, "images_labelled", lambda *a, **k: [info])
    monkeypatch.setattr(selection, "project_fingerprint", lambda *a, **k: (None, "base image nodekit/base is not here"))
    monkeypatch.setattr(selection, "last_build", lambda _: {"tag": tag, "inputs": inputs.model_dump()})
    assert build.choose(s).ref == tag  # unchanged: the recorded image is the project's
    (tmp_path / "train.py").write_text("print(2)\n")
    with pytest.raises(ImageError) as e:
        build.choose(s)
    assert e.value.message == f"the image built here last, {tag}, no longer matches the project: train.py changed"
    assert "nodekit run --build" in (e.value.fix or "")
