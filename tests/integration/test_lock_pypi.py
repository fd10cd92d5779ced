"""The lightly-train tree against the real PyPI: the newest lightly-train is locked, not lightly-train 0.0.0 (an
empty placeholder pip backtracks to without a word, because hydra-core needs antlr4-python3-runtime==4.9.*,
published only as a source distribution), and antlr4 is built into a pure wheel on this host, reproducibly.

It resolves the CUDA torch stack (about twenty nvidia-* wheels) with the host's pip configuration, so it needs
PyPI (or a mirror in pip's configuration) and takes minutes: see the report in docs for its measured time.

Marked big: `make test-big` and `make bench` run it, `make test` does not. It took 64 to 70 s of the engine tier,
and its answer changes when PyPI does. The same rule (the newest release, a dependency published only as an sdist
built into a wheel, reproducibly) is held in `make test` against a local index by tests/unit/image/lock/test_sdist.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from packaging.version import Version

from nodekit.config.settings import load
from nodekit.image import lock as locking
from nodekit.image.lock import Lock
from nodekit.image.probe import WheelTarget
from nodekit.system.progress import RecordingReporter

PACKAGES = ["torch==2.14.1", "torchvision==0.29.1", "lightly-train", "pillow", "numpy"]
IMAGE = WheelTarget(python_version="3.11", wheel_platform="manylinux_2_36_x86_64", source="settings")  # nodekit's base
ANTLR = "antlr4-python3-runtime"
pytestmark = pytest.mark.big


def test_the_lightly_train_tree_locks_the_newest_release_with_antlr4_built_from_source(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    quoted = ", ".join(f'"{p}"' for p in PACKAGES)
    (proj / "nodekit.toml").write_text(f'name = "lt"\nscript = "train.py"\npackages = [{quoted}]\n')
    result = locking.lock(load(proj / "nodekit.toml"), RecordingReporter(), target=IMAGE)
    lk = result.lock
    lightly_train = lk.get("lightly-train")
    assert lightly_train is not None and Version(lightly_train.version) >= Version("0.18.0"), lightly_train
    assert lk.get("torch").version == "2.14.1"  # type: ignore[union-attr]
    assert lk.get("hydra-core") is not None and lk.get("lightly") is not None
    record = lk.built_from(ANTLR)
    pin = lk.get(ANTLR)
    assert record is not None and pin is not None and record.version.startswith("4.9.")
    assert any(b.startswith("setuptools==") for b in record.backend)
    (wheel,) = (proj / ".nodekit" / "wheelhouse").glob("antlr4_python3_runtime-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == pin.hashes[0]

    # Built again elsewhere from the lock's record alone: the same bytes.
    other = tmp_path / "other"
    other.mkdir()
    (other / "nodekit.toml").write_text(f'name = "lt"\nscript = "train.py"\npackages = ["{ANTLR}"]\n')
    only = Lock(
        python_version=lk.python_version, platform=lk.platform, inputs=(ANTLR,), packages=(pin,), built=(record,)
    )
    again = locking.ensure_wheelhouse(load(other / "nodekit.toml"), only, RecordingReporter())
    assert again[ANTLR].read_bytes() == wheel.read_bytes()
