"""``nodekit build`` prints a summary (each step once, cut to a line, then the slow steps with their times);
``--verbose`` prints all of BuildKit's log (issue 32: every 700-character RUN line, twice)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from nodekit.cli.app import app
from nodekit.cli.ui import STEP_WIDTH, RichReporter

RUN = "[env 3/4] RUN --mount=type=bind,from=wheels,target=/w pip install --no-index " + "--find-links /w " * 40


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _build(rep: RichReporter, clock: Clock) -> None:
    rep.step("checking the Docker engine and the base image")
    clock.t += 0.2
    rep.step(RUN)
    rep.detail(f"#7 {RUN}")
    rep.detail("#7 12.3 Successfully installed torch-2.13.0")
    clock.t += 41.0
    rep.step("adding the code layer (12 files) and the labels")
    clock.t += 1.5
    rep.done("built nodekit/x:0123456789ab (1.1 GB) in 42.7 s")


def test_the_summary_shows_each_step_once_and_the_slow_ones_with_their_times() -> None:
    buf, clock = io.StringIO(), Clock()
    _build(RichReporter(Console(file=buf, width=200), verbose=False, clock=clock), clock)
    lines = buf.getvalue().splitlines()
    assert not any("Successfully installed" in line for line in lines)  # BuildKit's own lines stay back
    assert sum("pip install" in line for line in lines) == 2  # the step, and its time in the summary
    assert all(len(line) <= STEP_WIDTH + 2 for line in lines), lines
    assert lines[-3].startswith("ok built nodekit/x:0123456789ab")
    assert lines[-2].strip().startswith("41.0 s  [env 3/4] RUN --mount")
    assert lines[-1].strip() == "1.5 s  adding the code layer (12 files) and the labels"


def test_verbose_shows_every_line_and_a_failure_shows_what_was_kept_back() -> None:
    buf, clock = io.StringIO(), Clock()
    _build(RichReporter(Console(file=buf, width=1000), verbose=True, clock=clock), clock)
    assert "Successfully installed torch-2.13.0" in buf.getvalue()
    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, width=200), verbose=False, clock=clock)
    rep.step("building")
    rep.detail("ERROR: No matching distribution for torch==9")
    rep.fail()
    assert "No matching distribution" in buf.getvalue()


def test_build_takes_verbose() -> None:
    result = CliRunner().invoke(app, ["build", "--help"])
    assert "--verbose" in result.stdout and "--create-base" in result.stdout


def test_build_makes_nodekits_own_base_when_the_engine_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodekit.cli.images import base_when_missing
    from nodekit.config.settings import Settings
    from nodekit.image import debian
    from nodekit.system.progress import RecordingReporter

    made: list[str] = []
    monkeypatch.setattr(debian, "missing_base", lambda settings: True)
    monkeypatch.setattr(debian, "create_base", lambda tag, rep, **kw: made.append(tag))
    rep = RecordingReporter()
    base_when_missing(Settings(name="t"), rep)
    assert made == ["nodekit/base:bookworm"]
    assert "making it" in rep.said("step")[0]
    base_when_missing(Settings(name="t"), rep, create=False)  # --no-create-base
    base_when_missing(Settings(name="t", base_image="nvidia/cuda:12.4.1-runtime-ubuntu22.04"), rep)
    assert made == ["nodekit/base:bookworm"]  # a vendor base is never made: the build names it and the fix
