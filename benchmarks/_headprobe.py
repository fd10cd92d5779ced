"""The head's own footprint while ``nodekit run`` runs: its process, every process under it, and its connections'
ControlMaster masters (they leave its tree when they go to the background; found by their control directory,
``nkssh.<its PID>.``: nodekit/ship/mux.py). Sampled from /proc; :meth:`HeadProbe.sample` every fraction of a second.
CPU: the head's own with its waited children, plus each master's own, at their last sample."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks._standin import pids_under


class HeadProbe:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = self.peak_fds = self.peak_procs = 0
        self.head_fds = self.head_threads = 0
        self._cpu: dict[int, float] = {}
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _masters(self) -> list[int]:
        mark = f"nkssh.{self.pid}.".encode()
        found = []
        for e in os.scandir("/proc"):
            if e.name.isdigit():
                try:
                    if mark in Path(f"/proc/{e.name}/cmdline").read_bytes():
                        found.append(int(e.name))
                except OSError:
                    continue
        return found

    def sample(self) -> None:
        rss = fds = procs = 0
        tree = set(pids_under(self.pid))
        masters = set(self._masters()) - tree
        for pid in tree | masters:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * self._page
                fds += len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, ValueError, IndexError):
                continue
            procs += 1
            own = (int(stat[11]) + int(stat[12])) / self._tick
            if pid == self.pid:
                own += (int(stat[13]) + int(stat[14])) / self._tick  # its waited children
                self.head_fds = max(self.head_fds, len(os.listdir(f"/proc/{pid}/fd")))
            if pid == self.pid or pid in masters:
                self._cpu[pid] = own
        self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
        self.peak_procs = max(self.peak_procs, procs)

    def figures(self) -> dict[str, float]:
        """Peak resident MB and descriptors of the whole head, its peak processes, the head process's own peak
        descriptors, and its CPU seconds (with its children and masters) as last sampled."""
        return {"rss_mb": self.peak_rss / 2**20, "fds": self.peak_fds, "procs": self.peak_procs,
                "head_fds": self.head_fds, "cpu_s": sum(self._cpu.values())}  # fmt: skip
