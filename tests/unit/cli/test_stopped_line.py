"""The closing line after a stop signal says what may be left running instead of claiming everything was ended."""

from __future__ import annotations

import os
import signal
import time

import pytest
import typer

from nodekit.cli.common import handled
from nodekit.system import proc


def _stopped_while(note: str | None) -> None:
    if note is not None:
        proc.left_behind(note)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this ends


def test_a_start_that_could_not_be_settled_is_named_in_the_closing_line(capsys: pytest.CaptureFixture[str]) -> None:
    command = handled(_stopped_while)
    with pytest.raises(typer.Exit) as e:
        command("node 1's container on me@10.0.0.6 (then: nodekit down --node 1 once 10.0.0.6 answers)")
    err = capsys.readouterr().err
    assert e.value.exit_code == 143
    assert "may be left running: node 1's container on me@10.0.0.6" in err
    assert "everything it had started was ended" not in err


def test_what_an_earlier_command_left_is_not_carried_into_the_next(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit):
        handled(_stopped_while)("node 1's container on me@10.0.0.6")
    capsys.readouterr()
    with pytest.raises(typer.Exit):
        handled(_stopped_while)(None)
    assert "everything it had started was ended" in capsys.readouterr().err
