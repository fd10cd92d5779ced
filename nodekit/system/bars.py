"""Progress bars in a job's log: one line per node, not one line per redraw.

A bar (tqdm, or any output that ends a line with a carriage return alone) redraws itself many times a second; read
line by line, every redraw would become its own ``[node 0]`` line (182 lines for 150 steps). The log streams keep
such a redraw's "\\r" (:func:`nodekit.system.docker.compose_logs`), and :class:`Bars` decides, on a clock it is
handed, which of them to show: at most one per node every :data:`EVERY_S` seconds, the state a bar ended in (its
last redraw, or the line that ended it) always. Pure: the printer (nodekit/cli/ui.py) only carries out what it is
told, in place on a terminal, as plain lines elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

EVERY_S = 1.0
"""At most one progress line per node this often; a log file or CI output stays short, a terminal still moves."""


@dataclass(frozen=True)
class Shown:
    """A line to print for node ``rank``. ``redraw``: a bar's state that the next line of the same node may
    overwrite in place (on a terminal); else a line that stays."""

    rank: int
    text: str
    redraw: bool = False


def is_redraw(line: str) -> bool:
    """Whether a log line is a progress redraw: the job ended it with a carriage return alone."""
    return line.endswith("\r")


class Bars:
    """What to show of each node's lines: :meth:`feed` each as it comes, :meth:`flush` at the end of the log."""

    def __init__(self, every: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._pending: dict[int, str] = {}
        self._shown_at: dict[int, float] = {}

    def feed(self, rank: int, line: str) -> list[Shown]:
        """The lines to print now for ``line`` of node ``rank`` (none while a bar redraws faster than ``every``)."""
        if is_redraw(line):
            text = line.rstrip("\r")
            now = self.clock()
            if now - self._shown_at.get(rank, -math.inf) >= self.every:
                self._shown_at[rank] = now
                self._pending.pop(rank, None)
                return [Shown(rank, text, redraw=True)]
            self._pending[rank] = text
            return []
        pending = self._pending.pop(rank, None)
        self._shown_at.pop(rank, None)  # a bar that starts after this line is shown at once
        if not line.strip() and pending is not None:
            return [Shown(rank, pending)]  # "bar\r" then "\n": the bar's last state stays
        return [Shown(rank, line)]

    def flush(self) -> list[Shown]:
        """The last state of every bar that was still redrawing, unshown, when its log ended."""
        out = [Shown(rank, text) for rank, text in sorted(self._pending.items())]
        self._pending.clear()
        return out
