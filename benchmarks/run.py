"""`make bench`: build times and image size of the demo project, written into docs/benchmarks.md between its
markers (the rest of the page is other benchmarks' own).

The 2-node comparison against bare torchrun is benchmarks/decide.py's (interleaved runs, phases, intervals and
verdicts); this script keeps the host virtual environment it uses (:func:`bare_venv`).
Targets (issue 2): no-op rebuild < 2 s; code-only rebuild < 10 s; image <= 1.10 x (base + installed packages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp"
BENCH_VENV = ROOT / ".nodekit" / "bench-venv"
PORT = 29710
BEGIN = "<!-- run:begin -->"
END = "<!-- run:end -->"


def bare_venv() -> Path:
    """A host virtual environment with the same torch and numpy the image pins (train.py's broadcast_object_list
    needs numpy; a venv made before that is completed)."""
    py = BENCH_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    if subprocess.run([str(py), "-c", "import numpy, torch"], capture_output=True).returncode != 0:
        pins = ["torch==2.13.0", "numpy==2.4.6"]  # as examples/ddp/nodekit.lock
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", *pins], check=True)
    return py


def cli_noop_build(config: Path, reps: int = 3) -> list[float]:
    """The whole `nodekit build` command with nothing changed, Python start-up included: what a user waits."""
    times = []
    for _ in range(reps):
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "nodekit", "build", "--config", str(config)], check=True,
                       capture_output=True)  # fmt: skip
        times.append(time.monotonic() - start)
    return times


def report(results: dict[str, Any], build_table: str) -> str:
    """The builds section of docs/benchmarks.md."""
    r = results
    noop_ok = "ok" if r["cli_noop_build_median_s"] < 2 else "MISSED"
    lines = [
        "## Builds and image size",
        "",
        f"Written by `make bench` (`benchmarks/run.py`, {r['date']}, {r['cpus']} CPUs, load average at start "
        f"{r['load']}).",
        "",
        "```",
        build_table,
        f"`nodekit build` no-op, whole command (median of {len(r['cli_noop_build_s'])}): "
        f"{r['cli_noop_build_median_s']:.2f} s  (< 2 s {noop_ok})",
        "```",
        "",
        "Raw numbers: `.nodekit/bench.json` after a run.",
    ]
    return "\n".join(lines)


def write_section(doc: Path, text: str) -> None:
    """Replace what lies between BEGIN and END in ``doc`` with ``text``; SystemExit when the markers are missing
    (never the whole page: the other sections are other benchmarks' own)."""
    old = doc.read_text()
    if BEGIN not in old or END not in old:
        raise SystemExit(f"{doc} lacks the markers {BEGIN} and {END}: put them around the builds section")
    head, rest = old.split(BEGIN, 1)
    doc.write_text(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-build", action="store_true", help="skip the build benchmark")
    opts = parser.parse_args()
    load_at_start = " ".join(Path("/proc/loadavg").read_text().split()[:3])

    sys.path.insert(0, str(ROOT))
    from benchmarks import build_bench

    build: dict[str, Any] = {} if opts.skip_build else build_bench.run()
    config = EXAMPLE / "nodekit.toml"
    subprocess.run([sys.executable, "-m", "nodekit", "build", "--config", str(config)], check=True)
    noop = cli_noop_build(config)
    bare_venv()  # benchmarks/decide.py, run next, compares against torchrun in it
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load": load_at_start,
        "cli_noop_build_s": noop,
        "cli_noop_build_median_s": statistics.median(noop),
        "build": build,
    }
    (ROOT / ".nodekit").mkdir(exist_ok=True)
    (ROOT / ".nodekit" / "bench.json").write_text(json.dumps(results, indent=2))
    build_table = build_bench.table(build) if build else "(build benchmark skipped)"
    text = report(results, build_table)
    write_section(ROOT / "docs" / "benchmarks.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
