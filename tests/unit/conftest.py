"""The unit tier's fake process runner: no process starts, every command line is recorded (tests/fake_runner.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_runner import FakePopen, FakeRunner

STUBS = ("docker", "timeout", "env", "ssh", "ssh-keygen", "ssh-agent", "ssh-add", "nvidia-smi", "zstd")


@pytest.fixture
def fake_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunner]:
    """Replaces nodekit.system.proc's one spawn function, and python-on-whales' own process starts, with a recorder.

    The programs nodekit looks up on PATH are stubs first on PATH (they fail loudly if anything ever ran one), so
    command lines are the same on every machine; GNU timeout counts as present. Every child nodekit started must
    have been reaped by the end of the test (none left in nodekit.system.proc.live()).
    """
    import python_on_whales.utils as pow_utils

    from nodekit.system import proc
    from nodekit.system.proc import spawn

    fake = FakeRunner()
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\necho 'the fake runner let a real process start' >&2\nexit 97\n")
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(spawn, "_popen", fake.popen)
    monkeypatch.setattr(spawn, "gnu_timeout", lambda: True)
    monkeypatch.setattr(pow_utils, "subprocess", fake.pow_subprocess)
    monkeypatch.setattr(pow_utils, "Popen", fake.pow_popen)
    yield fake
    from nodekit.system.proc import children

    left = [c for c in proc.live() if isinstance(c._popen, FakePopen)]
    for c in left:
        children._live.pop(id(c), None)
    assert left == [], f"children never reaped: {[c.what for c in left]}"
