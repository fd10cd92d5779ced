"""Console output for the CLI: the rich-backed Reporter, errors, and the job's log (prefixed by node)."""

from __future__ import annotations

import contextlib
import sys
from collections import deque
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status

if TYPE_CHECKING:
    from nodekit.backends.shape import BackendPlan

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def show_plan(plan: BackendPlan[Any]) -> None:
    """The one print path of every backend's ``--dry-run`` (compose, up, run, slurm, k8s): the plan exactly as
    :meth:`~nodekit.backends.shape.BackendPlan.shown` writes it, the object the command would otherwise apply."""
    out.print(plan.shown(), markup=False, end="")


def _say(console: Console, text: str) -> None:
    """Print, unless the terminal is gone (SIGHUP: the SSH session closed): a line nobody can read must not stop
    the cleanup that follows it."""
    with contextlib.suppress(OSError):
        console.print(text, soft_wrap=True)


STEP_WIDTH = 110  # a step's line (a BuildKit RUN line is 700 characters) is cut to this
SLOW_S = 1.0  # the summary lists the steps that took this long or more


class RichReporter:
    """Steps as lines, tool output as a live spinner line; ``verbose``: every line of the tools' output too.

    ``verbose`` None (the default) shows every line where there is no terminal to spin on (CI logs). False is the
    summary a command asks for (``nodekit build`` without ``--verbose``): each step once, cut to one line, the tools'
    output kept back (shown by :meth:`fail`), and at :meth:`done` the steps that took a second or more, with their
    times."""

    def __init__(self, console: Console = err, *, verbose: bool | None = None, clock: Any = None) -> None:
        import time

        self.console = console
        self.verbose = (not console.is_terminal) if verbose is None else verbose
        self.summary = verbose is False
        self.recent: deque[str] = deque(maxlen=25)
        self._status: Status | None = None
        self._step = ""
        self._clock = clock or time.monotonic
        self._started = 0.0
        self._times: list[tuple[str, float]] = []

    def step(self, message: str) -> None:
        self._stop()
        self._end_step()
        self._step = message
        self._started = self._clock()
        shown = message if not self.summary or len(message) <= STEP_WIDTH else message[: STEP_WIDTH - 1] + "…"
        _say(self.console, f"[bold cyan]>[/] {escape(shown)}")
        if not self.verbose and self.console.is_terminal:
            self._status = self.console.status(escape(shown))
            self._status.start()

    def detail(self, line: str) -> None:
        self.recent.append(line)
        if self.verbose:
            _say(self.console, f"  [dim]{escape(line)}[/]")
        elif self._status is not None:
            self._status.update(f"{escape(self._step[:60])}  [dim]{escape(line[-100:])}[/]")

    def done(self, message: str) -> None:
        self._stop()
        self._end_step()
        _say(self.console, f"[bold green]ok[/] {escape(message)}")
        slow = [(m, t) for m, t in self._times if t >= SLOW_S]
        if self.summary and slow:
            for m, t in slow:
                cut = m if len(m) <= STEP_WIDTH - 12 else m[: STEP_WIDTH - 13] + "…"
                _say(self.console, f"  [dim]{t:7.1f} s  {escape(cut)}[/]")
        self._times = []

    def warn(self, message: str) -> None:
        self._stop()
        _say(self.console, f"[bold yellow]warning[/] {escape(message)}")

    def fail(self) -> None:
        """On error, show the last tool output that led to it (hidden behind the spinner or the summary until
        now)."""
        self._stop()
        if not self.verbose and self.recent:
            for line in self.recent:
                _say(self.console, f"  [dim]{escape(line)}[/]")

    def _end_step(self) -> None:
        if self._step:
            self._times.append((self._step, self._clock() - self._started))
            self._step = ""

    def _stop(self) -> None:
        if self._status is not None:
            with contextlib.suppress(OSError):
                self._status.stop()
            self._status = None


def error(message: str) -> None:
    _say(err, f"[bold red]nodekit: error:[/] {escape(message)}")


def warn(message: str) -> None:
    _say(err, f"[bold yellow]warning:[/] {escape(message)}")


def stopped(message: str) -> None:
    """A command ended by a signal: not an error of its own, but the user should know it did not finish."""
    _say(err, f"[bold yellow]nodekit: {escape(message)}[/]")


def detach_from_terminal() -> None:
    """After SIGHUP the terminal is gone: standard output and error go to /dev/null, so that flushing them at exit
    cannot turn the exit code into 120."""
    import os

    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)


class JobLog:
    """The job's lines on standard output, each tagged with its node (``[node 1] ...``); a progress bar is one line
    per node (nodekit.system.bars): redrawn in place on a terminal, at most one line a second elsewhere. ``only``:
    print that node's lines alone. Call :meth:`close` when the log ends (a bar's last state is printed then)."""

    def __init__(self, only: int | None = None, stream: Any = None, bars: Any = None) -> None:
        from nodekit.system.bars import Bars

        self.only = only
        self.stream = stream
        self.bars = bars or Bars()
        self._open: int | None = None  # the node whose redrawn bar is the terminal's last, unfinished line

    def __call__(self, rank: int, line: str) -> None:
        if self.only is not None and rank != self.only:
            return
        self._print(self.bars.feed(rank, line))

    def close(self) -> None:
        self._print(self.bars.flush())
        if self._open is not None:
            self._write("\n")
            self._open = None

    def _print(self, shown: Any) -> None:
        out = self.stream or sys.stdout
        terminal = out.isatty()
        for s in shown:
            text = f"[node {s.rank}] {s.text}"
            if not terminal:
                self._write(text + "\n")
                continue
            if self._open == s.rank:
                text = "\r\x1b[K" + text  # over the same node's bar
            elif self._open is not None:
                text = "\n" + text  # another node's bar stays as it was
            self._write(text if s.redraw else text + "\n")
            self._open = s.rank if s.redraw else None

    def _write(self, text: str) -> None:
        out = self.stream or sys.stdout
        with contextlib.suppress(OSError):
            out.write(text)
            out.flush()
