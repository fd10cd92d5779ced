"""Where a fleet run's seconds go, from what the run leaves behind (benchmarks/fleet_bench.py gathers, this module
decides). Pure: parsing and arithmetic only; tests/unit/bench/test_fleet_phases.py pins it on sample text.

Every time is seconds since the command started:

- the head's own steps, from ``nodekit run``'s progress lines, each stamped when the benchmark read it from the
  command's output (:func:`head_phases`; the command runs with unbuffered output so a line is stamped when printed);
- each node's phases as the head recorded them in the run record (``.nodekit/runs/<id>/run.json``: image there,
  container started, preflight passed, torchrun's rendezvous done, first output; unix times, :func:`node_phases`),
  and when the head saw the node's first line (the launcher's start line, :func:`first_lines`);
- rank 0's training script (``train.py --step-times``: main() entered, process group initialised, first step;
  ``time.monotonic()``, the same clock in a container as on the host, :func:`train_marks`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks import stats
from benchmarks.stats import median

HEAD_MARKS: tuple[tuple[str, str], ...] = (
    ("first line", r"^> checking \d+ host"),
    ("hosts ready", r"^ok \d+ host\(s\) ready"),
    ("image there", r"^ok \S+ (is already on every host|is on every host)"),
    ("all started", r"^ok \d+ node\(s\) started"),
)
"""The head's steps, by the first line that marks each, in the order they happen."""
NODE_PHASES = ("started", "preflight", "rendezvous", "output")
TRAIN_MARKS = ("main()", "init")
_NODE_LINE = re.compile(r"^\[node (\d+)\] ")

Stamped = Sequence[tuple[float, str]]
"""Lines of a command's output, each with the seconds since the command when it was read."""


def head_phases(lines: Stamped) -> dict[str, float]:
    """The first time each of :data:`HEAD_MARKS` appears in ``lines`` (marks that never do are left out)."""
    found: dict[str, float] = {}
    for t, text in lines:
        for name, pattern in HEAD_MARKS:
            if name not in found and re.search(pattern, text):
                found[name] = t
    return found


def first_lines(lines: Stamped) -> dict[int, float]:
    """When the head printed each node's first line (``[node R] ...``: the launcher's start line)."""
    found: dict[int, float] = {}
    for t, text in lines:
        m = _NODE_LINE.match(text)
        if m is not None:
            found.setdefault(int(m.group(1)), t)
    return found


def node_phases(record: Mapping[str, Any], t0_wall: float) -> dict[int, dict[str, float]]:
    """Each node's phases from a run record (``nodekit runs show``'s JSON), in seconds since ``t0_wall`` (the
    command's start, unix time)."""
    return {
        int(n["rank"]): {p: float(at) - t0_wall for p, at in n.get("phases", {}).items() if p in NODE_PHASES}
        for n in record.get("nodes", [])
    }


def train_marks(step_times: str, t0_mono: float) -> dict[str, float]:
    """``train.py --step-times``' main() and init lines, in seconds since ``t0_mono`` (time.monotonic())."""
    found: dict[str, float] = {}
    for line in step_times.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("start", "init"):
            found.setdefault("main()" if parts[0] == "start" else "init", float(parts[1]) - t0_mono)
    return found


def medians(runs: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per key, the median over the runs that have it."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for k, v in run.items():
            values.setdefault(k, []).append(v)
    return {k: median(v) for k, v in values.items()}


def node_medians(runs: Iterable[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Per node (JSON keys are strings) and phase, the median over the runs."""
    per: dict[str, list[Mapping[str, float]]] = {}
    for run in runs:
        for rank, phases in run.items():
            per.setdefault(str(rank), []).append(phases)
    return {rank: medians(ps) for rank, ps in sorted(per.items(), key=lambda kv: int(kv[0]))}


def span(values: Iterable[float]) -> str:
    """``a`` for one value, ``a to b`` (earliest to latest node) for several; "-" for none."""
    xs = sorted(values)
    if not xs:
        return "-"
    return f"{xs[0]:.1f}" if len(xs) == 1 or xs[-1] - xs[0] < 0.05 else f"{xs[0]:.1f} to {xs[-1]:.1f}"


def breakdown_row(n: int, kit_runs: Sequence[Mapping[str, Any]], bare_runs: Sequence[Mapping[str, Any]]) -> str:
    """One table row: at ``n`` hosts, the median second of each of nodekit's phases (the head's steps, then every
    node's, earliest to latest node), rank 0's training marks, and bare torchrun's."""
    head = medians(r["head"] for r in kit_runs)
    nodes = node_medians(r["nodes"] for r in kit_runs)
    lines = node_medians({str(k): {"line": v} for k, v in r["lines"].items()} for r in kit_runs)
    train = medians(r["train"] for r in kit_runs)
    bare = medians(r["train"] for r in bare_runs)
    cells = [str(n)]
    cells += [_s(head.get(name)) for name, _ in HEAD_MARKS]
    cells.append(span(p["line"] for p in lines.values() if "line" in p))
    cells += [span(p[ph] for p in nodes.values() if ph in p) for ph in NODE_PHASES]
    cells += [_s(train.get(m)) for m in TRAIN_MARKS]
    cells.append(_s(median([r["first"] for r in kit_runs])))
    cells += [_s(bare.get(m)) for m in TRAIN_MARKS]
    cells.append(_s(median([r["first"] for r in bare_runs])))
    return "| " + " | ".join(cells) + " |"


BREAKDOWN_HEADER = (
    "| hosts | first line | hosts ready | image there | all started | node's first line | container started | "
    "preflight passed | rendezvous done | first output | rank 0 main() | rank 0 init | **first step** | bare: rank 0 "
    "main() | bare: rank 0 init | **bare: first step** |\n" + "| --- " * 16 + "|"
)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def cpu_median(runs: Sequence[Mapping[str, Any]]) -> str:
    """The median of the runs' busy CPU seconds (every process on the machine, from the command to rank 0's first
    step), or "not measured" for runs recorded before it was."""
    got = [x["cpu"] for x in runs if not math.isnan(x.get("cpu", math.nan))]
    return f"{median(got):.1f}" if got else "not measured"


def first_step_row(key: str, r: Mapping[str, Any], target_s: float, *, seed: int = 1) -> str:
    """One host count's row: bare and nodekit to the first step (median, then each run), their difference with its
    interval, the verdict against ``target_s``, and the machine's CPU seconds of each side."""
    kit, bare = [x["first"] for x in r["kit"]], [x["first"] for x in r["bare"]]
    d = stats.difference_of_medians(bare, kit, seed=seed)
    return (f"| {key} | {median(bare):.2f} s ({', '.join(f'{x:.1f}' for x in bare)}) | "
            f"{median(kit):.2f} s ({', '.join(f'{x:.1f}' for x in kit)}) | {d.estimate:+.2f} s "
            f"[{d.low:+.2f}, {d.high:+.2f}] | {stats.verdict(d, target_s).text} | "
            f"{cpu_median(r['bare'])} / {cpu_median(r['kit'])} |")  # fmt: skip


FINDING_KINDS = {"round trip over": "late", "under 0.25 x": "slow", "below min_link_gbit": "below_floor",
                 "no transfer": "unreachable"}  # fmt: skip


def finding_lines(lines: Iterable[str]) -> list[str]:
    """The link check's finding lines (every node prints them), each pair's once, in order."""
    found: dict[str, str] = {}
    for ln in lines:
        text = ln.split("] ", 1)[-1]
        if text.startswith(("  warn ", "  refuse ")) and "<->" in text:
            found.setdefault(text.split(":", 1)[0], text.strip())
    return list(found.values())


def finding_kinds(lines: Iterable[str]) -> dict[str, int]:
    """The link check's named pairs by kind, each pair counted once."""
    kinds = (next((k for cue, k in FINDING_KINDS.items() if cue in text), "other") for text in finding_lines(lines))
    return dict(Counter(kinds))
