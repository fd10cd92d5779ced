"""The heavy tiers' grouping for `make test` (tests/conftest.py): every real-engine test in one group, every cluster
test in the other, so the two tiers run side by side while the tests inside each stay serial."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import tier_of

ROOT = Path(__file__).resolve().parents[3]


def test_each_heavy_test_file_has_its_tier_and_unit_tests_have_none() -> None:
    for tier, folder in (("engine", "integration"), ("cluster", "cluster")):
        files = sorted((ROOT / "tests" / folder).glob("test_*.py"))
        assert files
        assert {tier_of(f"{f.relative_to(ROOT).as_posix()}::test_x[a@b]") for f in files} == {tier}
    assert (
        tier_of("tests/unit/meta/test_tiers.py::test_each_heavy_test_file_has_its_tier_and_unit_tests_have_none")
        is None
    )
