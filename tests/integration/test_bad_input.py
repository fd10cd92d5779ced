"""The bad-input property (tests/unit/cli/test_bad_input_property.py, harness tests/bad_input.py) for the commands
that ask the engine:
``build --dry-run`` (resolves the lock, looks up the base image) and ``doctor``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bad_input import BOUNDED, FIELDS, NODEKIT_ENV, TOML, assert_contract, report_count

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("bad_input_projects")]


def test_build_dry_run_and_doctor_never_traceback(record_property: Callable[[str, object], None]) -> None:
    """Fewer examples: build --dry-run resolves the lock and doctor asks the engine, seconds each."""
    seen: list[int] = []

    @settings(BOUNDED, max_examples=12)
    @given(
        doc=st.one_of(st.fixed_dictionaries({"packages": st.just(["torch==2.13.0", "numpy"])}, optional=FIELDS), TOML),
        env=NODEKIT_ENV,
        doctor=st.booleans(),
        rank=st.one_of(st.none(), st.integers(0, 3)),
    )
    def check(doc: dict[str, Any] | str, env: dict[str, str], doctor: bool, rank: int | None) -> None:
        seen.append(1)
        argv = ["doctor"] if doctor else ["build", "--dry-run"]
        if doctor and rank is not None:
            argv += ["--node-rank", str(rank)]
        assert_contract(argv, doc, env, allow_1=doctor)  # doctor exits 1 when a check FAILs: a finding, not bad input

    check()
    report_count("build_doctor", seen, record_property)
