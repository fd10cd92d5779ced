"""The unit tier's fake process runner: no process starts, every command line is recorded (tests/fake_runner.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fake_runner import FakeRunner

STUBS = ("docker", "timeout", "env", "ssh", "ssh-keygen", "ssh-agent", "ssh-add", "nvidia-smi", "zstd")


@pytest.fixture
def fake_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    """Replaces nodekit.proc's one spawn function, and python-on-whales' own process starts, with a recorder.

    The programs nodekit looks up on PATH are stubs first on PATH (they fail loudly if anything ever ran one), so
    command lines are the same on every machine; GNU timeout counts as present.
    """
    import python_on_whales.utils as pow_utils

    from nodekit import proc

    fake = FakeRunner()
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\necho 'the fake runner let a real process start' >&2\nexit 97\n")
        stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(proc, "_popen", fake.popen)
    monkeypatch.setattr(proc, "gnu_timeout", lambda: True)
    monkeypatch.setattr(pow_utils, "subprocess", fake.pow_subprocess)
    monkeypatch.setattr(pow_utils, "Popen", fake.pow_popen)
    return fake
