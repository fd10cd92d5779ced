"""The bad-input property (tests/unit/cli/test_bad_input_property.py) for the commands that ask the engine:
``build --dry-run`` (resolves the lock, looks up the base image) and ``doctor``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.cli.test_bad_input_property import BOUNDED, FIELDS, NODEKIT_ENV, TOML, _check, _count, _remove_projects

pytestmark = pytest.mark.docker
__all__ = ["_remove_projects"]  # the fixture that removes the projects the examples make


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
        _check(argv, doc, env, allow_1=doctor)  # doctor exits 1 when a check FAILs: a finding, not bad input

    check()
    _count("build_doctor", seen, record_property)
