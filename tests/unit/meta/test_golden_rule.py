"""The golden-file rule (tests/golden.py): the update flag rewrites outside CI, fails in CI, and every golden test
goes through that one helper."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden import GOLDEN, UPDATE_VAR, update_golden

TESTS = Path(__file__).resolve().parents[2]
REPO = TESTS.parent


def test_the_flag_rewrites_outside_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("old\n")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(UPDATE_VAR, raising=False)
    update_golden(path, "new\n")
    assert path.read_text() == "old\n"
    monkeypatch.setenv(UPDATE_VAR, "1")
    update_golden(path, "new\n")
    assert path.read_text() == "new\n"


def test_the_flag_fails_in_ci_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "g.yaml"
    path.write_text("old\n")
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(UPDATE_VAR, "1")
    with pytest.raises(pytest.fail.Exception, match=UPDATE_VAR):
        update_golden(path, "new\n")
    assert path.read_text() == "old\n"


def test_no_test_reads_the_flag_but_the_helper() -> None:
    """A golden test that read NODEKIT_UPDATE_GOLDEN itself would escape the CI rule."""
    readers = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == TESTS / "golden.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == UPDATE_VAR:
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert readers == []


def test_every_golden_test_fails_when_the_flag_is_set_in_ci() -> None:
    """End to end: the golden tests run with the flag in CI fail, and the golden files stay as they were."""
    before = {p.name: p.read_bytes() for p in GOLDEN.iterdir()}
    env = {**os.environ, "CI": "true", UPDATE_VAR: "1"}
    files = [
        "tests/unit/backends/compose/test_render.py",
        "tests/unit/backends/k8s/test_manifests.py",
        "tests/unit/system/test_net.py",
    ]
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "golden", *files]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-2000:]
    assert " failed" in summary and "passed" not in summary, summary
    assert {p.name: p.read_bytes() for p in GOLDEN.iterdir()} == before
