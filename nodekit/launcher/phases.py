"""One line when torchrun's agent has finished its rendezvous on this node (``contract.RENDEZVOUS_DONE``), so the
head can record when each node got there (nodekit/runs/).

torchrun says so only in an INFO record of its agent's logger ("[default] Rendezvous complete for workers",
torch/distributed/elastic/agent/server/api.py, since torch 1.9), and that logger stays at WARNING unless LOGLEVEL
says otherwise. :func:`mark_rendezvous` lowers that one logger to INFO and adds a filter that prints our line for
that record and lets through only what the logger showed before, so torchrun's output is otherwise unchanged. A
torch without that logger or message simply prints no line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from nodekit.launcher.contract import RENDEZVOUS_DONE

AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
MESSAGE = "Rendezvous complete for workers"


class RendezvousMark(logging.Filter):
    """Prints the rendezvous line once per rendezvous (a torchrun restart is another); passes records at or above
    ``shown``, the level the logger had before."""

    def __init__(self, shown: int, out: TextIO | None = None) -> None:
        super().__init__()
        self.shown = shown
        self.out = out

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and MESSAGE in record.msg:
            restart = record.args.get("restart_count") if isinstance(record.args, dict) else None
            again = f" (restart {restart})" if restart else ""
            sys.stdout.flush()
            print(f"{RENDEZVOUS_DONE}{again}", file=self.out or sys.stdout, flush=True)
        return record.levelno >= self.shown


def mark_rendezvous(out: TextIO | None = None) -> RendezvousMark | None:
    """Install the mark on torchrun's agent logger (call after torch.distributed.run is imported: importing the
    agent's module sets its logger's level). None when it is already there."""
    logger = logging.getLogger(AGENT_LOGGER)
    if any(isinstance(f, RendezvousMark) for f in logger.filters):
        return None
    shown = logger.getEffectiveLevel()
    mark = RendezvousMark(shown, out)
    logger.addFilter(mark)
    logger.setLevel(min(shown, logging.INFO))
    return mark
