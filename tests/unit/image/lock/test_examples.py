"""The examples' committed locks: each one is what `nodekit build` accepts for its nodekit.toml without locking again
(the inputs recorded in its header are the toml's packages, and every pin satisfies them), so a user who copies an
example builds exactly the packages this repository tested.

The LightlyTrain example's lock is also held here to what its two-node test (tests/integration/test_lightlytrain.py,
marked big: a 6.8 GB image, about 4 minutes on a cold CI machine) builds from: LightlyTrain 0.18 itself, its
sdist-only dependency built into a hashed wheel, and PyPI's CUDA torch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from nodekit.image.lock.format import normalize_inputs, parse_lock, unsatisfied

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
LOCKED = sorted(p.parent.name for p in EXAMPLES.glob("*/nodekit.lock"))


def test_every_example_with_packages_is_locked() -> None:
    assert "lightlytrain" in LOCKED and "cuda" in LOCKED and "ddp" in LOCKED, LOCKED


@pytest.mark.parametrize("example", LOCKED)
def test_an_example_s_lock_is_current_for_its_toml(example: str) -> None:
    packages = tomllib.loads((EXAMPLES / example / "nodekit.toml").read_text())["packages"]
    lock = parse_lock((EXAMPLES / example / "nodekit.lock").read_text())
    assert sorted(lock.inputs) == sorted(normalize_inputs(packages))
    assert unsatisfied(lock, packages) == []


def test_the_lightlytrain_lock_holds_lightly_train_0_18_and_its_sdist_built_dependency() -> None:
    text = (EXAMPLES / "lightlytrain" / "nodekit.lock").read_text()
    lock = parse_lock(text)
    lightly = lock.get("lightly-train")
    assert lightly is not None and lightly.version == "0.18.0"  # not the empty 0.0.0 placeholder
    assert re.search(r"^antlr4-python3-runtime==4\.9\.\S+ --hash=sha256:[0-9a-f]{64}$", text, re.M), text
    built = lock.built_from("antlr4-python3-runtime")
    assert built is not None, "the sdist-only dependency is recorded as built on the host"
    assert lock.torch_version == "2.14.1" and lock.get("nvidia-nccl-cu13") is not None
