"""Where the head's CPU per host goes in ``nodekit run`` (issue 48): benchmarks/scale_bench.py's stand-in run under
``perf record -a`` (one sample per millisecond of CPU, every process of the machine), each sample charged to a
process, each process sorted into what it is for the head: ``nodekit run`` itself, its SSH connections' masters
(their key exchange and every session they carry), the ``ssh`` clients riding them, the docker CLI, the wrappers'
``sh``, and the stand-ins' side (sshd and its sessions' stand-in engines). A poller records every process's parent
and command line as it appears, so that even a process that lives a few milliseconds is sorted.

Not a test. Needs root, perf, iproute2 and Debian's openssh-server; uses scale_bench's own namespace (``nkscale``).

    .venv/bin/python benchmarks/head_cost.py [--hosts 16] [--keep DIR]

Prints one line per kind: CPU seconds, programs started (execs), and both per host; then the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


AGAIN = ("nkssh.", "scale_bench.py", "head_cost.py")
"""Command lines read again while their process lives: a connection's master takes a title of its own, and a child is
seen with its parent's command line (this one's, scale_bench's) until it execs its own."""


def _again(known: tuple[int, str, str]) -> bool:
    """A process seen before is read again while its command line is empty (caught between fork and exec) or one of
    :data:`AGAIN`'s."""
    return not known[2].strip() or any(m in known[2] for m in AGAIN)


def snapshot(seen: dict[int, tuple[int, str, str]], again: Callable[[tuple[int, str, str]], bool] = _again) -> None:
    """Every process now in /proc not yet in ``seen``, and those seen before that ``again`` says to read again: its
    parent, its name and its command line."""
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        known = seen.get(int(e.name))
        if known is not None and not again(known):
            continue
        try:
            stat = Path(f"/proc/{e.name}/stat").read_text()
            cmd = Path(f"/proc/{e.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        seen[int(e.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), comm, cmd)


def ancestry(pid: int, seen: dict[int, tuple[int, str, str]]) -> list[int]:
    """``pid`` and its recorded ancestors, nearest first, up to init (64 at most)."""
    chain, p = [], pid
    while p in seen and p not in (0, 1) and len(chain) < 64:
        chain.append(p)
        p = seen[p][0]
    return chain


def kind(pid: int, seen: dict[int, tuple[int, str, str]], head: int, bench: int, comm: str) -> str:
    """What ``pid`` is for: one of the head's kinds, ``standin`` (sshd's side), or ``other`` (the rest of the
    machine, the bench included)."""
    chain = ancestry(pid, seen)
    cmd = seen[pid][2] if pid in seen else ""
    name = comm
    if any(seen[q][1] == "sshd" for q in chain if q in seen):
        return "standin"
    if pid == head:
        return "nodekit"
    if head in chain or f"nkssh.{head}." in cmd:
        if name == "ssh":
            # The connection's key exchange and login run in the opening `ssh HOST true` before it forks the
            # master, which titles itself "ssh: <its socket> [mux]" and carries every later session.
            if cmd.rstrip().endswith("[mux]"):
                return "ssh master"
            return "ssh opening" if cmd.rstrip().endswith(" true") else "ssh client"
        if name in ("docker", "docker-compose"):
            return "docker CLI"
        if name in ("sh", "dash", "bash"):
            return "sh (wrappers)"
        return f"head: {name}"
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--keep", type=Path, help="keep perf.data and the process map here")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nodekit-headcost."))
    data = work / "perf.data"
    seen: dict[int, tuple[int, str, str]] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            snapshot(seen)
            time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    events = ["-e", "cpu-clock/period=1000000/", "-e", "sched:sched_process_exec"]
    perf = subprocess.Popen(["perf", "record", "-q", "-a", *events, "-o", str(data)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    bench = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale_bench.py"), "--hosts", str(opts.hosts)],
                           capture_output=True, text=True)  # fmt: skip
    perf.send_signal(2)
    perf.wait(60)
    stop.set()
    poller.join()
    if bench.returncode != 0:
        raise SystemExit(f"scale_bench failed:\n{bench.stdout[-3000:]}\n{bench.stderr[-3000:]}")
    # Ours: the `nodekit run` that scale_bench (this process's child) started, not another one on the machine.
    benches = {p for p, (pp, _, cmd) in seen.items() if pp == os.getpid() and "scale_bench.py" in cmd}
    heads = [p for p, (pp, _, cmd) in seen.items() if pp in benches and "-m nodekit run" in cmd]
    if not heads:
        raise SystemExit("no `nodekit run` process was seen")
    head = heads[0]
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,event"], capture_output=True,
                            text=True)  # fmt: skip
    ms: Counter[str] = Counter()
    started: Counter[str] = Counter()
    for line in script.stdout.splitlines():
        head_part, _, event = line.strip().rpartition(" ")
        comm, _, pid = head_part.strip().rpartition(" ")
        if not pid.isdigit():
            continue
        k = kind(int(pid), seen, head, os.getpid(), comm.strip())
        if event.startswith("cpu-clock"):
            ms[k] += 1
        elif "exec" in event:
            started[k] += 1
    n = opts.hosts
    out = {}
    for k in sorted(set(ms) | set(started), key=lambda k: -ms[k]):
        out[k] = {"cpu_s": ms[k] / 1000, "cpu_s_per_host": ms[k] / 1000 / n, "execs": started[k]}
        print(f"{k:16} {ms[k] / 1000:7.2f} CPU s  {ms[k] / 1000 / n:6.3f} per host  {started[k]:6} execs "
              f"({started[k] / n:.1f} per host)")  # fmt: skip
    print(bench.stdout.strip().splitlines()[-1])
    print(json.dumps({"hosts": n, "kinds": out}))
    if opts.keep:
        opts.keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(data, opts.keep / "perf.data")
        (opts.keep / "procs.json").write_text(json.dumps({str(k): v for k, v in seen.items()}))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
