"""The one fail-or-skip rule for real-engine tests (tests/conftest.py), and that no test module keeps its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import unavailable

TESTS = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({"CI": "true"}, pytest.fail.Exception),
        ({"NODEKIT_REQUIRE_DOCKER": "1"}, pytest.fail.Exception),
        ({}, pytest.skip.Exception),
    ],
)
def test_fail_in_ci_skip_elsewhere(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], outcome: type[BaseException]
) -> None:
    for var in ("CI", "NODEKIT_REQUIRE_DOCKER"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(outcome):
        unavailable("real-Docker tests", "no engine")


def test_no_real_engine_test_module_has_its_own_skip_rule() -> None:
    own = [
        str(p.relative_to(TESTS))
        for p in [*TESTS.glob("integration/*.py"), *TESTS.glob("cluster/*.py")]
        if p.name != "conftest.py" and re.search(r"pytest\.skip\(|NODEKIT_REQUIRE_DOCKER", p.read_text())
    ]
    assert own == [], f"use tests.conftest.unavailable instead: {own}"
