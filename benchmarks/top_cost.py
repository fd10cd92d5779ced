"""`make bench` (part): what `nodekit top` costs the job it watches (issue 31: it must not slow it by more than 1 %).

A CPU-bound job in a container on this machine's engine (python3 of nodekit/base:bookworm, host network, the compose
project label nodekit gives a node) counts loop iterations and prints the count each second. The job and the sampler
are pinned to the same CPU (the job by --cpuset-cpus, the sampler by taskset), so every cycle the sampler takes is
a cycle the job loses: the worst case, a node whose cores the job keeps busy. Windows of --window seconds
alternate, --pairs times: without the sampler, then with the script `nodekit top` runs on each node (every
--interval seconds, the last line every 5 s). Reported:

- the job's slowdown (its median rate in bare windows over sampled ones) with a bootstrap 95 % interval, against
  1.01 (met only when the whole interval is below);
- the sampler's own CPU time in steady state (its sh and the children it reaped: sleep, tail, the docker CLI; from
  /proc, after a warm-up that ``nodekit top`` pays once per session) per second;
- dockerd's CPU time in sampled windows less in bare ones (what the sampler's docker calls cost the engine; noisy
  where other work shares the engine).

Usage: python benchmarks/top_cost.py [--pairs 6] [--window 20] [--interval 2] [--cpu 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import stats
from nodekit.backends.fleet.sampler import SCRIPT, samplers_args
from nodekit.launcher.contract import DOCKER_PIDFILES

JOB = (
    "import time\nwhile True:\n    t = time.time(); n = 0\n    while time.time() - t < 1.0:\n        n += 1\n"
    "    print(n, flush=True)\n"
)
PROJECT = "nodekit-topcost"
IMAGE = "nodekit/base:bookworm"


def cpu_of(pid: int, *, children: bool = False) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, with ``children`` those of its reaped children too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def dockerd_cpu() -> float:
    """The default engine's dockerd (not a test cluster's): its CPU seconds so far."""
    found = next(Path(f) for f in DOCKER_PIDFILES if Path(f).is_file())
    return cpu_of(int(found.read_text().split()[0]))


class Rates:
    """The job's per-second counts as they arrive, with the time each arrived."""

    def __init__(self, name: str) -> None:
        self.seen: list[tuple[float, int]] = []
        self.child = subprocess.Popen(["docker", "logs", "-f", name], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            if line.strip().isdigit():
                self.seen.append((time.monotonic(), int(line)))

    def between(self, a: float, b: float) -> list[int]:
        return [n for t, n in self.seen if a <= t <= b]


WARM_S = 3.0


def window(rates: Rates, seconds: float, sampler: list[str] | None) -> tuple[float, float, float]:
    """(the job's median rate, the sampler's CPU seconds, dockerd's CPU seconds) over one window. A sampler is
    started ``WARM_S`` before the window (its start-up, paid once per session by nodekit top, is not counted) and
    measured from /proc: its sh and every child it reaped (sleep, tail, the docker CLI)."""
    child = subprocess.Popen(sampler, stdout=subprocess.DEVNULL) if sampler else None
    time.sleep(WARM_S)
    own = cpu_of(child.pid, children=True) if child else 0.0
    engine = dockerd_cpu()
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    engine = dockerd_cpu() - engine
    if child is not None:
        own = cpu_of(child.pid, children=True) - own
        child.terminate()
        child.wait()
    got = rates.between(start + 1.5, end)  # the first count may straddle the switch
    return statistics.median(got), own, engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--cpu", type=int, default=0)
    a = ap.parse_args()
    name = f"{PROJECT}-job"
    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", "--cpuset-cpus", str(a.cpu), "--label",
                    f"com.docker.compose.project={PROJECT}", IMAGE, "python3", "-u", "-c", JOB],
                   check=True, capture_output=True)  # fmt: skip
    sampler = ["taskset", "-c", str(a.cpu), "sh", "-c", SCRIPT, "nodekit-top",
               *samplers_args(PROJECT, a.interval, 5.0, counters=True)]  # fmt: skip
    rates = Rates(name)
    bare: list[float] = []
    sampled: list[float] = []
    own_s = engine_bare = engine_sampled = 0.0
    try:
        time.sleep(3)
        for i in range(a.pairs):
            rate, _, eng = window(rates, a.window, None)
            bare.append(rate)
            engine_bare += eng
            rate, own, eng = window(rates, a.window, sampler)
            sampled.append(rate)
            own_s += own
            engine_sampled += eng
            share = own / a.window * 100
            print(f"pair {i + 1}: bare {bare[-1]:.0f}/s, sampled {sampled[-1]:.0f}/s, sampler {share:.3f} % of a CPU",
                  flush=True)  # fmt: skip
    finally:
        rates.child.kill()
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    wall = a.pairs * a.window
    slowdown = stats.ratio_of_medians(sampled, bare, seed=31)  # median(bare) / median(sampled): 1.01 is 1 % slower
    verdict = stats.verdict(slowdown, 1.01)
    print(f"job slowdown (bare rate / sampled rate): {slowdown} (95 % interval); under 1 %: {verdict.status}")
    print(f"sampler's own CPU: {own_s / wall * 100:.3f} % of one CPU (every {a.interval:g} s, logs every 5 s)")
    print(f"dockerd's extra CPU while sampled: {(engine_sampled - engine_bare) / wall * 100:.3f} % of one CPU")


if __name__ == "__main__":
    main()
