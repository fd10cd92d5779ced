"""What the configuration tests share: an empty project directory as the working directory, with no NODEKIT_*
variable of the test runner's own shell in the way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in [v for v in os.environ if v.startswith("NODEKIT_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    return tmp_path
