"""Following a Slurm job without a Slurm: scontrol's answers and the growing log are given as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.backends.slurm import follow
from nodekit.errors import NodekitError

LINE = (
    "JobId={id} JobName=demo UserId=root(0) JobState={state} Reason={reason} Dependency=(null) "
    "ExitCode={code} NodeList={nodes} StdOut={log} StdErr={log}"
)


def info(state: str, *, code: str = "0:0", reason: str = "None", nodes: str = "h[0-1]", log: str = "") -> str:
    return LINE.format(id=7, state=state, code=code, reason=reason, nodes=nodes, log=log)


def test_parse_job() -> None:
    job = follow.parse_job(info("FAILED", code="19:0", log="/p/outputs/slurm-7.out"))
    assert job == follow.JobInfo("7", "FAILED", 19, 0, "/p/outputs/slurm-7.out", "h[0-1]", "None")
    assert follow.parse_job("slurm_load_jobs error: Invalid job id specified") is None
    # A project under a path with spaces (and a "#", and an "=" after no space): the log path stays whole.
    spaced = follow.parse_job(info("RUNNING", log="/p/my proj#2/a=b/outputs/slurm-7.out"))
    assert spaced is not None and spaced.log == "/p/my proj#2/a=b/outputs/slurm-7.out" and spaced.nodes == "h[0-1]"


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [("COMPLETED", "0:0", 0), ("FAILED", "17:0", 17), ("CANCELLED", "0:15", 143), ("NODE_FAIL", "0:0", 1)],
)
def test_exit_code(state: str, code: str, expected: int) -> None:
    job = follow.parse_job(info(state, code=code))
    assert job is not None and follow.exit_code(job) == expected


def test_follow_reports_each_state_once_and_streams_the_log(tmp_path: Path) -> None:
    log = tmp_path / "slurm-7.out"
    answers = iter(
        [
            (info("PENDING", reason="Resources", nodes="(null)"), None),
            (info("PENDING", reason="Resources", nodes="(null)"), None),
            (info("RUNNING", log=str(log)), "0: first\n0: par"),
            (info("RUNNING", log=str(log)), "tial\n"),
            (info("COMPLETED", log=str(log)), "1: last line without newline"),
        ]
    )

    def ask(job_id: str) -> follow.JobInfo | None:
        text, more = next(answers)
        if more is not None:
            with open(log, "a") as f:
                f.write(more)
        return follow.parse_job(text)

    states: list[str] = []
    lines: list[str] = []
    sleeps: list[float] = []
    end = follow.follow("7", lambda i: states.append(i.state), lines.append, ask=ask, sleep=sleeps.append)
    assert end.state == "COMPLETED"
    assert states == ["PENDING", "RUNNING", "COMPLETED"]
    assert lines == ["0: first", "0: partial", "1: last line without newline"]
    assert sleeps == [follow.POLL_S] * 4


def test_a_job_slurm_forgot_is_an_error() -> None:
    with pytest.raises(NodekitError, match="no longer knows job 7"):
        follow.follow("7", lambda i: None, lambda s: None, ask=lambda j: None, sleep=lambda s: None)


def test_the_cancel_wait_has_a_deadline() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    running = follow.parse_job(info("RUNNING"))
    end = follow.follow(
        "7", lambda i: None, lambda s: None, ask=lambda j: running, sleep=sleep, clock=lambda: now[0], deadline_s=5
    )
    assert end.state == "RUNNING" and 5 <= now[0] <= 7
