"""The run's log file: where torchrun's and the launcher's own tracebacks go, so that a job's last lines say what
failed, where, and the fix.

A worker that raises prints its own traceback (the user's code: that stays in the job's output). torchrun then
raised ChildFailedError up through the launcher (30 lines of torch.distributed frames and a boxed report), and a
successful run printed a 40-frame C++ stack trace from torchrun's exit barrier when another node's agent left first.
Both now go to ``$NODEKIT_OUTPUT_DIR/nodekit/node-<rank>.log`` (``outputs/nodekit/`` on the host), and the job's
output gets one line pointing there. Where that file cannot be written, the traceback goes to stderr as before:
nothing is lost. Standard library only (this runs in the image).
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path

EXIT_BARRIER_LOGGER = "torch.distributed.elastic.agent.server.api"
_EXIT_BARRIER_MESSAGE = "Error waiting on exit barrier"

# The causes a user fixes, recognised in the first line of what torchrun raised: (words, what it means, the fix).
_CAUSES = (
    ("EADDRINUSE", "the rendezvous port is taken on this machine",
     "stop what holds it (`nodekit down`; `ss -ltnp` names it), or choose another: --master-port"),
    ("address already in use", "the rendezvous port is taken on this machine",
     "stop what holds it (`nodekit down`; `ss -ltnp` names it), or choose another: --master-port"),
    ("Connection refused", "main's rendezvous refused the connection",
     "start node 0 first, or check --main and master_port on every node"),
    ("timed out", "the rendezvous timed out", "check that every node started (nodekit ps) and can reach main"),
)  # fmt: skip


def err(line: str) -> None:
    """One ``nodekit: error:`` line on stderr, after whatever the job printed on stdout."""
    sys.stdout.flush()
    print(f"nodekit: error: {line}", file=sys.stderr, flush=True)


def log_path(output_dir: str, node_rank: int) -> Path:
    """This node's run log: ``<output_dir>/nodekit/node-<rank>.log``."""
    return Path(output_dir) / "nodekit" / f"node-{node_rank}.log"


def keep(path: Path, title: str, text: str) -> bool:
    """Append ``text`` under a dated ``title`` to the run log at ``path``; False when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {title}\n{text.rstrip()}\n\n")
        return True
    except OSError:
        return False


def first_line(error: BaseException) -> str:
    """What an exception says, in one line: its first non-empty line (C++ frames and torchrun's box left out)."""
    for line in str(error).splitlines():
        text = line.strip().strip("=").strip()
        if text:
            return f"{type(error).__name__}: {text}"
    return type(error).__name__


def cause_and_fix(line: str) -> tuple[str, str] | None:
    """The cause a user fixes, and its fix, when ``line`` (from :func:`first_line`) names a known one."""
    lowered = line.lower()
    return next(((why, fix) for words, why, fix in _CAUSES if words.lower() in lowered), None)


def torchrun_failed(error: BaseException, path: Path, *, worker_failed: bool) -> str:
    """Keep ``error``'s traceback in the run log at ``path``; the one line for the job's output. A failed worker
    (``worker_failed``: torchrun's ChildFailedError) has said why in its own output above, and the watchdog names
    it next: the line only points at torchrun's report. Anything else is torchrun's own failure: its cause, and the
    fix where it is a known one."""
    text = "".join(traceback.format_exception(error))
    kept = keep(path, "torchrun raised", text)
    where = f"torchrun's report: {path}" if kept else "torchrun's report follows"
    if not kept:
        sys.stderr.write(text)
    if worker_failed:
        return f"a worker failed: its own output above says why ({where})"
    line = first_line(error)
    known = cause_and_fix(line)
    if known is None:
        return f"torchrun stopped: {line} ({where})"
    why, fix = known
    return f"torchrun stopped: {why} ({line}). Fix: {fix} ({where})"


class ExitBarrierFilter(logging.Filter):
    """torchrun's exit barrier, after this node's workers all succeeded, logs a full traceback (C++ frames
    included) when another node's agent left first and took the store with it. The job succeeded: the record goes
    to the run log, not the job's output."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_EXIT_BARRIER_MESSAGE):
            return True
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        # Nowhere to keep it: torchrun prints it, as before.
        return not keep(self.path, "torchrun's exit barrier (this node's workers had all succeeded)", text)


def quiet_exit_barrier(path: Path) -> None:
    """Install :class:`ExitBarrierFilter` on torchrun's agent logger (in this process, before torchrun runs)."""
    logger = logging.getLogger(EXIT_BARRIER_LOGGER)
    if not any(isinstance(f, ExitBarrierFilter) for f in logger.filters):
        logger.addFilter(ExitBarrierFilter(path))
