"""How long-running operations report progress without importing rich: they call a Reporter.

The CLI passes a rich-backed reporter; tests pass a RecordingReporter and assert on what was said.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


def command_started() -> float:
    """When this process started, on ``time.monotonic``'s clock: "N s since the command" counts from here, the
    interpreter's start and the CLI's imports included (Linux: /proc/self/stat's start time, in clock ticks since
    boot, against CLOCK_BOOTTIME). Now, where that cannot be read."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - max(0.0, age)


class Reporter(Protocol):
    def step(self, message: str) -> None:
        """A new phase starts ("resolving packages", "building image")."""

    def detail(self, line: str) -> None:
        """One line of tool output inside the current phase (build log, pull progress)."""

    def done(self, message: str) -> None:
        """The current phase finished; ``message`` is its result ("built nodekit/x:ab12 in 41 s")."""

    def warn(self, message: str) -> None:
        """Something the user should know, that does not stop the operation."""


class NullReporter:
    def step(self, message: str) -> None: ...

    def detail(self, line: str) -> None: ...

    def done(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


class RecordingReporter:
    """Keeps every call, for tests."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def step(self, message: str) -> None:
        self.events.append(("step", message))

    def detail(self, line: str) -> None:
        self.events.append(("detail", line))

    def done(self, message: str) -> None:
        self.events.append(("done", message))

    def warn(self, message: str) -> None:
        self.events.append(("warn", message))

    def said(self, kind: str) -> list[str]:
        return [m for k, m in self.events if k == kind]


@contextmanager
def phase(reporter: Reporter, message: str) -> Iterator[None]:
    reporter.step(message)
    yield
