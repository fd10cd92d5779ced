"""Pure helpers of benchmarks/data_bench.py: the dataset's shape (scaled down by a factor where the disk or the
time does not allow the full one), the disk it needs, the results tables and the verdicts against issue 45's
targets. No I/O here, so tests/unit can check them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TITLE = "## Datasets: `nodekit data push` against parallel rsync"
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Shape:
    """A dataset of ``files`` small files (``small_kib`` KiB on average, from half to one and a half times that) in
    directories of 1,000, and ``large`` files of ``large_mib`` MiB each (webdataset tars, Parquet shards)."""

    files: int
    small_kib: int
    large: int
    large_mib: int

    @staticmethod
    def of(scale: float) -> Shape:
        """The issue's dataset (about 2 GB: 20,000 files of 50 KiB on average, and four of 256 MiB) times ``scale``:
        fewer small files of the same sizes (what costs per file stays per file) and smaller large ones."""
        return Shape(max(1, round(20_000 * scale)), 50, 4, max(1, round(256 * scale)))

    @property
    def small_bytes(self) -> int:
        return self.files * self.small_kib * 1024

    @property
    def large_bytes(self) -> int:
        return self.large * self.large_mib * MIB

    @property
    def total(self) -> int:
        return self.small_bytes + self.large_bytes

    def small_size(self, i: int) -> int:
        """File ``i``'s size: spread evenly from half to one and a half times the average, same total."""
        avg = self.small_kib * 1024
        return avg // 2 + (i * 7919) % (avg + 1)

    def small_name(self, i: int) -> str:
        return f"shards/d{i // 1000:03d}/{i:06d}.jpg"

    def large_name(self, i: int) -> str:
        return f"train-{i:02d}.parquet"


def disk_need(shape: Shape, hosts: int, scan_files: int) -> int:
    """Bytes this machine's disk must have free: the source, one large file of the small files' size (small
    against large), ``hosts`` copies of it (one tool's at a time, 10 % over), the scan's tiny files twice (the source
    and one host's copy), and 8 GiB left to the machine's other users."""
    return int(shape.total * (1 + 1.1 * hosts)) + 2 * shape.small_bytes + 2 * scan_files * 4096 + 8 * GIB


def size(n: float) -> str:
    if n < MIB:
        return f"{n / 1024:.0f} KiB"
    if n < GIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / GIB:.2f} GiB"


def _cell(r: Mapping[str, Any] | None) -> str:
    """Seconds and the head's link bytes; then, where measured, how busy this machine's cores were and how many
    hosts took it from another host (a relay tree)."""
    if r is None:
        return "-"
    out = f"{r['seconds']:.1f} s, {size(r['link_bytes'])}"
    out += f", cores {r['busy']:.0%} busy" if "busy" in r else ""
    return out + (f", relayed to {r['relayed']}" if r.get("relayed") else "")


STEPS = {
    "first": "first push",
    "nochange": "no change",
    "change": "one file changed",
    "rename": "one large file renamed",
}


def table(results: Mapping[str, Any]) -> list[str]:
    """One row per host count and step: each tool's time and the bytes the head's link carried."""
    lines = [
        "| hosts | step | nodekit data push | parallel rsync over SSH | nodekit's time / rsync's |",
        "| ---: | --- | --- | --- | ---: |",
    ]
    for n in sorted(results["runs"], key=int):
        run = results["runs"][n]
        for step, what in STEPS.items():
            ours, theirs = run.get("nodekit", {}).get(step), run.get("rsync", {}).get(step)
            if ours is None and theirs is None:
                continue
            ratio = f"{ours['seconds'] / theirs['seconds']:.2f}" if ours and theirs and theirs["seconds"] else "-"
            lines.append(f"| {n} | {what} | {_cell(ours)} | {_cell(theirs)} | {ratio} |")
    return lines


def verdicts(results: Mapping[str, Any]) -> list[str]:
    """Issue 45's targets, one line each, met or not with the numbers; undecided where this run lacks a side."""
    runs = results["runs"]

    def first(n: int, tool: str) -> Mapping[str, Any] | None:
        got: Mapping[str, Any] | None = runs.get(str(n), {}).get(tool, {}).get("first")
        return got

    out = []
    one, most = first(1, "nodekit"), max((int(n) for n in runs), default=1)
    many = first(most, "nodekit") if most > 1 else None
    if one is None or many is None:
        out.append("- nodekit to the most hosts within 1.3x its time to 1 host: not decided, this run lacks a side.")
    else:
        ratio = many["seconds"] / one["seconds"]
        ok = "met" if ratio <= 1.3 else "NOT met"
        busy = (f"; this machine's cores were {many['busy']:.0%} busy during it, {one['busy']:.0%} during the push "
                "to 1 host (every virtual host runs on them)") if "busy" in many and "busy" in one else ""  # fmt: skip
        out.append(f"- nodekit to {most} hosts within 1.3x its own time to 1 host: **{ok}**, "
                   f"{many['seconds']:.1f} s vs {one['seconds']:.1f} s ({ratio:.2f}x); the head's link carried "
                   f"{size(many['link_bytes'])} for {most} hosts, {size(one['link_bytes'])} for one"
                   f"{busy}.")  # fmt: skip
    for n in (4, 8):
        ours, theirs = first(n, "nodekit"), first(n, "rsync")
        if ours is None or theirs is None:
            out.append(f"- nodekit beats parallel rsync at {n} hosts: not decided, this run has no {n}-host pair.")
            continue
        ok = "met" if ours["seconds"] < theirs["seconds"] else "NOT met"
        out.append(f"- nodekit beats parallel rsync at {n} hosts: **{ok}**, {ours['seconds']:.1f} s vs "
                   f"{theirs['seconds']:.1f} s.")  # fmt: skip
    sl = results.get("small_large")
    if sl:
        share = sl["small_rate"] / sl["large_rate"]
        out.append(f"- {sl['files']} small files at 80 % or more of the rate of one file of the same size "
                   f"({size(sl['bytes'])}): **{'met' if share >= 0.8 else 'NOT met'}**, "
                   f"{sl['small_rate'] / MIB:.1f} MiB/s vs {sl['large_rate'] / MIB:.1f} MiB/s "
                   f"({share:.0%}){_settled(sl)}.")  # fmt: skip
    sc = results.get("scan")
    if sc:
        ok = "met" if sc["seconds"] <= 5 else "NOT met"
        out.append(f"- a no-change push of {sc['files']} files in about 5 s: **{ok}**, {sc['seconds']:.1f} s "
                   f"(the head's link carried {size(sc['link_bytes'])}).")  # fmt: skip
    return out


def _settled(sl: Mapping[str, Any]) -> str:
    """How small against large met the file system (data_bench.settle); a run from before it says nothing."""
    if "settle_s" not in sl:
        return ""
    if not sl["settle_s"]:
        return "; the small files pushed right after a sync"
    return f"; the small files pushed after a sync and {sl['settle_s']:g} s for earlier deletions to age out"


def steps_of(seq: Sequence[str]) -> list[str]:
    bad = [s for s in seq if s not in STEPS]
    if bad:
        raise ValueError(f"unknown step(s) {', '.join(bad)}; known: {', '.join(STEPS)}")
    return list(seq)


def section(results: Mapping[str, Any]) -> str:
    """The docs section of a run's results (or a --local run's lines)."""
    shape = Shape(**results["shape"])
    scaled = "" if results["scale"] == 1 else (f" (the issue's 2 GB scaled by {results['scale']:g}: this run's disk "
                                               "and time allowed no more)")  # fmt: skip
    if results.get("mode") == "local":
        said = [v for v in verdicts(results) if not v.startswith("- nodekit")]  # no hosts, no anchor here
        return "\n".join([
            f"`benchmarks/data_bench.py --local` (issue 45), {results['measured']}, load {results['load_start']} at "
            f"the start and {results['load_end']} at the end: this machine alone, no link (`--to unix://`, the "
            f"receiver run here), {size(results['disk_free'])} free on the disk.", "", *said, ""])  # fmt: skip
    lines = [
        TITLE,
        "",
        f"`{results.get('command', 'benchmarks/data_bench.py')}` (issue 45), {results['measured']}, load "
        f"{results['load_start']} at the start and "
        f"{results['load_end']} at the end, {results['run_minutes']} minutes. The virtual cluster (a head and a host "
        "per target, each its own network namespace with Debian's sshd, all on this machine's one disk and "
        f"{os.cpu_count()} cores), every link at {results['mbit']} Mbit/s, the head's own included (tc tbf on both "
        f"ends of every veth). The dataset: {shape.files} files of "
        f"{shape.small_kib} KiB on average in directories of 1,000 and {shape.large} of {shape.large_mib} MiB, "
        f"{size(shape.total)} of random bytes{scaled}; {size(results['disk_free'])} were free on the disk, of which "
        f"this run needed about {size(results.get('disk_need', 0))} (the source, a copy per host, 8 GiB left to "
        "others). nodekit: "
        "`nodekit data push` run on the head (its hash of the source made once before, "
        f"{results.get('head_hash_s', '?')} s); the anchor: SkyPilot's way, `rsync -az --delete` from the head to "
        "every host at once over the same SSH. Each step's wall time and the bytes the head's veth sent:",
        "",
        *table(results),
        "",
        *verdicts(results),
        "",
    ]
    return "\n".join(lines) + "\n"
