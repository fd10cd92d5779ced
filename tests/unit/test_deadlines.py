"""Calls that can hang have deadlines and end in one line naming what hung."""

from __future__ import annotations

import time

import pytest

from nodekit import deadline, lock
from nodekit.errors import DeadlineError


def test_a_hung_pip_is_stopped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, `nodekit lock`/`build` waited on a stalled pip (an index that stopped answering) forever."""
    monkeypatch.setattr(lock, "resolve_argv", lambda *a, **k: ["sleep", "30"])
    monkeypatch.setattr(deadline, "PIP_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(DeadlineError) as e:
        lock._run_pip_report(["torch==2.13.0"], [], python_version="3.11", platform="manylinux_2_36_x86_64")
    assert time.monotonic() - started < 5
    assert e.value.one_line().startswith("pip resolving the lock did not finish within 0.5 s and was stopped")
    assert "\n" not in e.value.one_line()


def test_a_streamed_process_that_hangs_is_killed_and_named() -> None:
    """mmdebstrap's output is streamed line by line; a stalled mirror used to keep `nodekit base` waiting."""
    import subprocess

    started = time.monotonic()
    proc = subprocess.Popen(["sh", "-c", "echo fetching; exec sleep 30"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with deadline.Killer(proc, 0.5, "mmdebstrap", "check the mirror") as killer:
        lines = list(proc.stdout)
        proc.wait()
    with pytest.raises(DeadlineError, match=r"^mmdebstrap did not finish within 0.5 s"):
        killer.check()
    assert lines == ["fetching\n"] and time.monotonic() - started < 5
