"""One run of a job split into phases, from what the run leaves behind. Pure: parsing and arithmetic only.

benchmarks/decide.py gathers the inputs (monotonic times around the command, the step-times file that
``examples/ddp/train.py --step-times`` writes, the container's cgroup CPU counters, its start time and its log);
this module turns them into numbers, and tests/unit/bench/test_phases.py pins it on sample text.

Every time is ``time.monotonic()`` seconds (CLOCK_MONOTONIC). Docker gives containers no time namespace, so a
process inside a container reads the same monotonic clock as the benchmark on the host: the training loop's
timestamps and the host's command and exit times are on one clock. :func:`split` refuses times that are out of
order, which is what a container with its own clock would produce.

Phases of one run:
    start-up   command -> first training step done (CLI, compose, container start, preflight, torchrun, torch
               import, rendezvous); with its parts: command -> train.py's main() (``to_main``), -> process group
               initialised (``to_init``)
    per step   median of the intervals between consecutive steps (robust to the epoch boundary's checkpoint)
    loop       first step -> last step
    teardown   last step -> the command (every process or container) exited
    whole job  command -> exited
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import PurePosixPath

from benchmarks.stats import median

STEP_TIMES_FILE = "step-times.txt"


class ParseError(ValueError):
    """Input that is not what the producer writes."""


@dataclass(frozen=True)
class StepTimes:
    """What ``train.py --step-times`` wrote: main() entered, process group initialised, each step, the end."""

    start: float
    init: float
    steps: tuple[float, ...]
    end: float


def parse_step_times(text: str) -> StepTimes:
    """The step-times file: ``start T``, ``init T``, one ``step T`` per step, ``end T``; ``#`` lines are comments."""
    marks: dict[str, float] = {}
    steps: list[float] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in ("start", "init", "step", "end"):
            raise ParseError(f"step times line {n}: expected '<start|init|step|end> <seconds>', got {line!r}")
        try:
            value = float(parts[1])
        except ValueError:
            raise ParseError(f"step times line {n}: {parts[1]!r} is not a number") from None
        if parts[0] == "step":
            steps.append(value)
        else:
            marks[parts[0]] = value
    missing = [k for k in ("start", "init", "end") if k not in marks]
    if missing:
        raise ParseError(f"step times: no {', '.join(missing)} line (was the run cut short?)")
    if not steps:
        raise ParseError("step times: no step line")
    if any(b < a for a, b in pairwise(steps)):
        raise ParseError("step times: steps are not in increasing order")
    return StepTimes(start=marks["start"], init=marks["init"], steps=tuple(steps), end=marks["end"])


@dataclass(frozen=True)
class Phases:
    """Seconds; ``per_step`` too (the median step interval)."""

    to_main: float
    to_init: float
    startup: float
    per_step: float
    loop: float
    teardown: float
    whole: float
    steps: int


def split(command_at: float, exited_at: float, t: StepTimes) -> Phases:
    """The phases of one run that started at ``command_at`` and whose last process exited at ``exited_at``."""
    order = [command_at, t.start, t.init, t.steps[0], t.steps[-1], t.end, exited_at]
    if any(b < a for a, b in pairwise(order)):
        raise ParseError(
            "times out of order (command, main, init, first step, last step, end, exit = "
            + ", ".join(f"{x:.3f}" for x in order)
            + "): not one monotonic clock?"
        )
    intervals = [b - a for a, b in pairwise(t.steps)]
    return Phases(
        to_main=t.start - command_at,
        to_init=t.init - command_at,
        startup=t.steps[0] - command_at,
        per_step=median(intervals) if intervals else float("nan"),
        loop=t.steps[-1] - t.steps[0],
        teardown=exited_at - t.steps[-1],
        whole=exited_at - command_at,
        steps=len(t.steps),
    )


_PREFLIGHT = re.compile(r"\(preflight ([0-9]+(?:\.[0-9]+)?) s[,)]")
_SETTLED = re.compile(r"\(preflight [0-9.]+ s, ([0-9]+) ms once every node was there\)")


def parse_preflight(log: str) -> float | None:
    """Seconds of the launcher's preflight from its ``(preflight X s...)`` line, or None when the log has none."""
    found = _PREFLIGHT.findall(log)
    return float(found[-1]) if found else None


def parse_preflight_settled(log: str) -> float | None:
    """Seconds main's preflight took once every node was there (``..., N ms once every node was there)``): its
    own cost, without the nodes' start-up and the wait for them. None when the log has no such line."""
    found = _SETTLED.findall(log)
    return int(found[-1]) / 1000 if found else None


def parse_cpuacct_usage(text: str) -> float:
    """cgroup v1 ``cpuacct.usage`` (nanoseconds, user + system) as seconds."""
    try:
        return int(text.strip()) / 1e9
    except ValueError:
        raise ParseError(f"cpuacct.usage: {text.strip()!r} is not an integer") from None


def parse_cpu_stat(text: str) -> float:
    """cgroup v2 ``cpu.stat``'s ``usage_usec`` (user + system) as seconds."""
    fields: Mapping[str, str] = dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) == 2)
    if "usage_usec" not in fields:
        raise ParseError("cpu.stat has no usage_usec line")
    return int(fields["usage_usec"]) / 1e6


def cgroup_cpu_files(container_id: str, root: str = "/sys/fs/cgroup") -> list[tuple[str, str]]:
    """Where a Docker container's CPU counter may be, most likely first: ``(path, kind)`` with kind "v1" (a
    ``cpuacct.usage`` file) or "v2" (a ``cpu.stat`` file). Covers the cgroupfs driver (``docker/<id>``) and the
    systemd driver (``system.slice/docker-<id>.scope``), with v1's cpuacct mounted alone or as ``cpu,cpuacct``."""
    r = PurePosixPath(root)
    out: list[tuple[str, str]] = []
    for controller in ("cpuacct", "cpu,cpuacct", "cpu"):
        for rel in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
            out.append((str(r / controller / rel / "cpuacct.usage"), "v1"))
    for base in (r, r / "unified"):
        for rel in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
            out.append((str(base / rel / "cpu.stat"), "v2"))
    return out


def parse_cpu(text: str, kind: str) -> float:
    """Seconds of CPU from the counter file of ``kind`` ("v1" or "v2")."""
    return parse_cpuacct_usage(text) if kind == "v1" else parse_cpu_stat(text)


def parse_docker_time(stamp: str) -> float:
    """Docker's RFC 3339 time (``2026-11-22T16:50:01.123456789Z``, nanoseconds) as Unix seconds."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp.strip())
    if not m:
        raise ParseError(f"not a Docker time: {stamp!r}")
    zone = "+00:00" if m.group(3) == "Z" else str(m.group(3))
    whole: float = datetime.fromisoformat(m.group(1) + zone).timestamp()
    frac = str(m.group(2) or "0")
    return whole + int(frac) / 10.0 ** len(frac)
