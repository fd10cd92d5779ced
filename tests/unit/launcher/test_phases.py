"""The launcher's rendezvous line: printed when torchrun's agent logs its rendezvous (an INFO record its logger
would not show), while the agent's output is otherwise what it was."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from nodekit.launcher.contract import RENDEZVOUS_DONE
from nodekit.launcher.phases import AGENT_LOGGER, mark_rendezvous


@pytest.fixture
def agent() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO]]:
    logger = logging.getLogger(AGENT_LOGGER)
    logger.setLevel(logging.WARNING)  # what torch's get_logger sets without LOGLEVEL
    shown = io.StringIO()
    handler = logging.StreamHandler(shown)
    logger.addHandler(handler)
    out = io.StringIO()
    yield logger, out, shown
    logger.removeHandler(handler)
    logger.filters.clear()
    logger.setLevel(logging.NOTSET)


def test_the_rendezvous_is_marked_and_nothing_else_changes(
    agent: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    logger, out, shown = agent
    assert mark_rendezvous(out) is not None
    assert mark_rendezvous(out) is None, "installed once"
    # torch's own call: one mapping argument, so record.args is that dict
    logger.info("[%(role)s] Rendezvous complete for workers. Result:\n  restart_count=%(restart_count)s\n",
                {"role": "default", "restart_count": 0})  # fmt: skip
    logger.info("[%s] Starting worker group", "default")
    logger.warning("a warning stays visible")
    logger.info("[%(role)s] Rendezvous complete for workers. Result:\n  restart_count=%(restart_count)s\n",
                {"role": "default", "restart_count": 1})  # fmt: skip
    assert out.getvalue().splitlines() == [RENDEZVOUS_DONE, f"{RENDEZVOUS_DONE} (restart 1)"]
    assert shown.getvalue().splitlines() == ["a warning stays visible"]


def test_with_loglevel_info_torchruns_own_lines_stay(agent: tuple[logging.Logger, io.StringIO, io.StringIO]) -> None:
    logger, out, shown = agent
    logger.setLevel(logging.INFO)
    mark_rendezvous(out)
    logger.info("[%(role)s] Rendezvous complete for workers. Result:\n", {"role": "default"})
    assert out.getvalue() == f"{RENDEZVOUS_DONE}\n" and "Rendezvous complete" in shown.getvalue()
