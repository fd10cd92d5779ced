"""torchrun's and the launcher's tracebacks go to the run's log file; the job's output gets one line that says what
failed and the fix (issue 32: ~30 lines of launcher and torchrun frames after a user's exception, a 40-line
traceback for a taken port, and a C++ stack trace from the exit barrier of a run that succeeded)."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from nodekit.launcher import runlog


class ChildFailedError(Exception):
    """What torchrun raises when a worker failed (its str is a boxed report)."""


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:
        return e


def test_a_failed_worker_is_one_line_and_torchruns_report_is_kept(tmp_path: Path) -> None:
    log = runlog.log_path(str(tmp_path), 1)
    error = _raised(ChildFailedError("\n=====\ntrain.py FAILED\n-----\nRoot Cause (first observed failure):\n rank: 1"))
    line = runlog.torchrun_failed(error, log, worker_failed=True)
    assert line == f"a worker failed: its own output above says why (torchrun's report: {log})"
    kept = log.read_text()
    assert log == tmp_path / "nodekit" / "node-1.log"
    assert "Traceback (most recent call last)" in kept and "Root Cause (first observed failure)" in kept


def test_a_taken_port_names_the_cause_and_the_fix(tmp_path: Path) -> None:
    error = _raised(RuntimeError(
        "The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, "
        "code: -98, name: EADDRINUSE, message: address already in use\nException raised from makeWithPort at "
        "/pytorch/torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp:1234 (most recent call first):\nframe #0: x"
    ))  # fmt: skip
    line = runlog.torchrun_failed(error, runlog.log_path(str(tmp_path), 0), worker_failed=False)
    assert line.startswith("torchrun stopped: the rendezvous port is taken on this machine (RuntimeError: The server")
    assert "Fix: stop what holds it (`nodekit down`" in line and "--master-port" in line
    assert "frame #0" not in line and "\n" not in line


def test_nothing_is_lost_when_the_log_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nodekit").write_text("a file where the log directory would go")
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    line = runlog.torchrun_failed(_raised(ValueError("odd")), runlog.log_path(str(tmp_path), 0), worker_failed=False)
    assert line == "torchrun stopped: ValueError: odd (torchrun's report follows)"
    assert "Traceback (most recent call last)" in stderr.getvalue()


def test_the_exit_barriers_traceback_goes_to_the_log_not_the_jobs_output(tmp_path: Path) -> None:
    """The record torchrun's agent logs (logger.exception) when another node left first."""
    path = runlog.log_path(str(tmp_path), 1)
    runlog.quiet_exit_barrier(path)
    runlog.quiet_exit_barrier(path)  # installed once
    logger = logging.getLogger(runlog.EXIT_BARRIER_LOGGER)
    shown = io.StringIO()
    handler = logging.StreamHandler(shown)
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("Connection reset by peer\nframe #0: c10::Error::Error\nframe #1: c10d::TCPStore::get")
        except RuntimeError:
            logger.exception("Error waiting on exit barrier. Elapsed: %s seconds", 0.25)
        logger.warning("a warning of torchrun's own")
    finally:
        logger.removeHandler(handler)
        for f in list(logger.filters):
            logger.removeFilter(f)
    assert shown.getvalue() == "a warning of torchrun's own\n"
    kept = path.read_text()
    assert "Error waiting on exit barrier. Elapsed: 0.25 seconds" in kept and "frame #1: c10d::TCPStore::get" in kept
