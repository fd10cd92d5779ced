"""The head's own footprint while a run runs: its processes (``nodekit run``; or, for bare torchrun, the ``ssh``
clients that start it), every process under them, and nodekit's ControlMaster masters (they leave its tree when they
go to the background; found by their control directory, ``nkssh.<its PID>.``: nodekit/ship/mux.py). Sampled from
/proc; :meth:`HeadProbe.sample` every fraction of a second. CPU: each root's own with its waited children, plus each
master's own, at their last sample.

A sample reads /proc once (every process's stat; the command line only of an ``ssh``, which a master is), so that
probing costs little, and the same on both sides of a comparison: benchmarks/fleet_bench.py probes bare torchrun's
side as it probes nodekit's (issue 48: probing nodekit's side alone charged it about 2.5 CPU s at 8 hosts on this
machine's 2 cores, which bare torchrun did not pay)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from benchmarks._standin import descendants


class HeadProbe:
    def __init__(self, pid: int | Sequence[int]) -> None:
        self.roots = [pid] if isinstance(pid, int) else list(pid)
        self.peak_rss = self.peak_fds = self.peak_procs = 0
        self.head_fds = 0
        self._cpu: dict[int, float] = {}
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _scan(self) -> tuple[set[int], set[int]]:
        """The roots' trees and the masters outside them, from one pass over /proc."""
        marks = [f"nkssh.{r}.".encode() for r in self.roots]
        children: dict[int, list[int]] = {}
        masters = set()
        for e in os.scandir("/proc"):
            if not e.name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{e.name}/stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                if comm == "ssh" and any(m in Path(f"/proc/{e.name}/cmdline").read_bytes() for m in marks):
                    masters.add(int(e.name))
            except (OSError, ValueError):
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(e.name))
        tree = set(descendants(children, self.roots))
        return tree, masters - tree

    def sample(self) -> None:
        rss = fds = procs = 0
        tree, masters = self._scan()
        for pid in tree | masters:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * self._page
                n_fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, ValueError, IndexError):
                continue
            fds += n_fds
            procs += 1
            own = (int(stat[11]) + int(stat[12])) / self._tick
            if pid in self.roots:
                own += (int(stat[13]) + int(stat[14])) / self._tick  # its waited children
                self.head_fds = max(self.head_fds, n_fds)
            if pid in self.roots or pid in masters:
                self._cpu[pid] = own
        self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
        self.peak_procs = max(self.peak_procs, procs)

    def figures(self) -> dict[str, float]:
        """Peak resident MB and descriptors of the whole head, its peak processes, a root process's own peak
        descriptors, and its CPU seconds (with its children and masters) as last sampled."""
        return {"rss_mb": self.peak_rss / 2**20, "fds": self.peak_fds, "procs": self.peak_procs,
                "head_fds": self.head_fds, "cpu_s": sum(self._cpu.values())}  # fmt: skip
