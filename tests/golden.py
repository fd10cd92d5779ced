"""The one rule for golden files, used by every golden test.

A golden test renders text and compares it with a file under ``tests/unit/golden/``. After an intended change,
``NODEKIT_UPDATE_GOLDEN=1`` rewrites the files with what the code renders now (review the diff before committing).
In CI (``CI=true``) that flag is an error: a run there must compare, never rewrite the very thing it checks, or every
golden test would pass whatever the code renders. tests/unit/meta/test_golden_rule.py holds every test to this helper.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

UPDATE_VAR = "NODEKIT_UPDATE_GOLDEN"
GOLDEN = Path(__file__).parent / "unit" / "golden"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def update_golden(path: Path, text: str) -> None:
    """With NODEKIT_UPDATE_GOLDEN=1, write ``text`` to ``path`` (the caller then compares, and passes); fail the test
    instead, writing nothing, when that flag is set in CI. Without the flag, do nothing."""
    if os.environ.get(UPDATE_VAR) != "1":
        return
    if in_ci():
        pytest.fail(f"{UPDATE_VAR}=1 in CI would rewrite {path.name} instead of checking it; unset it", pytrace=False)
    path.write_text(text)
