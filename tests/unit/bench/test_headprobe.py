"""benchmarks/_headprobe.py: one pass over /proc finds every root's tree and nodekit's masters outside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._headprobe import HeadProbe


def test_the_probe_counts_every_roots_tree_and_a_master_outside_them(tmp_path: Path) -> None:
    ssh = tmp_path / "ssh"  # a process named ssh, as a connection's master is, titled with the head's mark
    shutil.copy("/bin/sh", ssh)
    spin = [
        sys.executable,
        "-c",
        "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\ntime.sleep(30)",
    ]
    roots = [subprocess.Popen(["sh", "-c", 'sleep 30 & wait "$!"']) for _ in range(2)]
    busy = subprocess.Popen(spin)
    master = subprocess.Popen([str(ssh), "-c", "sleep 30", f"nkssh.{roots[0].pid}.0"])
    stranger = subprocess.Popen([str(ssh), "-c", "sleep 30", "nkssh.1.0"])  # another head's: not counted
    try:
        time.sleep(0.6)
        probe = HeadProbe([*(r.pid for r in roots), busy.pid])
        probe.sample()
        got = probe.figures()
        # two roots with a sleep each, the busy one, and the master (its sleep is under it, not counted)
        assert got["procs"] == 6, got
        assert got["rss_mb"] > 0 and got["fds"] >= 6 * 3, got
        assert got["cpu_s"] >= 0.25, got  # the busy root's own CPU second (near enough)
        alone = HeadProbe(roots[1].pid)
        alone.sample()
        assert alone.figures()["procs"] == 2
    finally:
        for p in [*roots, busy, master, stranger]:
            p.kill()
            p.wait()
