"""Where the machine's CPU goes from the command to rank 0's first step (issue 48), nodekit against bare torchrun at
``--hosts`` virtual hosts: benchmarks/scale16_bench.py's runs (the same cluster, image, job and sides: ``kit``,
``bare``, and ``lean``, nodekit without the link check and the peer watchdog), each under ``perf record -a`` (one
sample per millisecond of CPU, every process of the machine, stamped on CLOCK_MONOTONIC so that only the samples up
to the first step count). A poller records every process's parent and command line as it appears (as
benchmarks/head_cost.py does), so each sample is charged to what its process is for: the head (``nodekit run``,
its ``ssh``, the docker CLI it starts), the hosts' side (sshd and its sessions, the docker CLI and compose there, the
engine: dockerd, containerd, the shims and runc), and inside each container its first process (nodekit's launcher,
which runs torchrun in-process, or bare torchrun's agent), the training workers under it, and anything else.

On 2 shared cores every container's CPU second is the others' too; the point is the difference between the sides,
kind by kind, in the same run, which says what nodekit's extra start is made of. This benchmark's own process (its
poller, which reads again every process still named as before its exec: nodekit's sides keep more such shells) is a
kind of its own, to leave out of the comparison; the runs' first steps are slower than scale16_bench's for it.

Not a test. Needs root, perf, a dockerd and Debian's openssh-server (make engine sshd), and the heavy lock:

    flock /tmp/nodekit-heavy.lock .venv/bin/python benchmarks/start_cost.py [--hosts 8] [--rounds 2] [--mbit 1000]

Prints, per side, the median CPU seconds of each kind to the first step, and the difference from ``bare``; then
the same as JSON.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import head_cost, stats  # noqa: E402

Procs = dict[int, tuple[int, str, str]]
"""pid: (parent pid, name, command line), as :func:`benchmarks.head_cost.snapshot` records them."""

ENGINE = {"dockerd", "containerd", "docker-proxy", "docker-init", "exe"}
"""The engine's own programs (a shim's name starts with ``containerd-shim``; runc's init is ``runc:[...]``)."""


BEFORE_EXEC = ("runc", "docker-init", "sh", "bash", "dash", "ip", "timeout", "env")
"""Names a process may have between its fork and the exec that names it (a container's first process is runc's init
until it execs, and under compose's ``init`` docker-init's child until it execs; a host's docker CLI is its session's
shell until it execs): such a process is read again."""


def _again(known: tuple[int, str, str]) -> bool:
    return not known[2].strip() or known[1].startswith(BEFORE_EXEC)


def snapshot(procs: Procs) -> None:
    """Every process now in /proc not yet in ``procs``, and again those still named as before their exec
    (:data:`BEFORE_EXEC`, or no command line yet): its parent, its name and its command line."""
    head_cost.snapshot(procs, _again)


def _is_shim(name: str) -> bool:
    return name.startswith("containerd-shim")


def kind(pid: int, comm: str, procs: Procs, head: int, bench: int) -> str:
    """What ``pid`` (a sample's process, ``comm`` its thread's name) is for in a run from host 0 (``head``: the
    ``nodekit run`` process, 0 on bare torchrun's side; ``bench``: this process): see the module's docstring.
    ``other: <name>`` is the rest of the machine (the kernel's threads, perf)."""
    chain = head_cost.ancestry(pid, procs)
    names = [procs[p][1] for p in chain]
    name = names[0] if names else comm
    if pid == bench:
        return "this benchmark (its poller)"
    if comm.startswith("runc") or name.startswith("runc"):
        return "engine: runc"
    if _is_shim(name) or name in ENGINE:
        return f"engine: {'shim' if _is_shim(name) else name}"
    shim = next((i for i, n in enumerate(names) if _is_shim(n)), None)
    if shim is not None:  # inside a container, from its first process down (docker-init, compose's init, is not)
        inner = [n for n in reversed(names[:shim]) if n != "docker-init"]
        if len(inner) == 1:
            return f"container: first process ({comm})"
        return "container: workers" if names[0].startswith(("python", "pt_")) else f"container: {name}"
    if head and (pid == head or head in chain):
        if pid == head:
            return "head: nodekit run"
        return "head: ssh" if name == "ssh" else f"head: {name}"
    if "sshd" in names:
        return "hosts: docker CLI" if name in ("docker", "docker-compose") else "hosts: sshd and shells"
    if name == "ssh":
        # A connection's master goes to the background (its parent is init); the bare side's ssh are the bench's.
        return "head: ssh"
    if name in ("docker", "docker-compose"):
        return "docker CLI (unsorted)"
    return f"other: {comm}"


class Recorder:
    """``perf record -a`` and the process poller, from :meth:`start` to :meth:`stop`."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.procs: Procs = {}
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._perf: subprocess.Popen[bytes] | None = None

    def _poll(self) -> None:
        while not self._stop.is_set():
            snapshot(self.procs)
            time.sleep(0.01)

    def start(self) -> None:
        self._poller.start()
        self._perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-e", "cpu-clock/period=1000000/",
             "-o", str(self.data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)  # perf's own start, before the run's clock

    def stop(self) -> None:
        assert self._perf is not None
        self._perf.send_signal(signal.SIGINT)
        self._perf.wait(120)
        self._stop.set()
        self._poller.join()

    def samples(self) -> list[tuple[float, int, str]]:
        """(monotonic seconds, pid, thread name) of every sample."""
        out = subprocess.run(["perf", "script", "-i", str(self.data), "-F", "comm,pid,time"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        got = []
        for line in out.splitlines():
            left, _, t = line.strip().rstrip(":").rpartition(" ")
            comm, _, pid = left.strip().rpartition(" ")
            if pid.isdigit() and int(pid) != 0:
                got.append((float(t), int(pid), comm.strip()))
        return got


def charge(samples: list[tuple[float, int, str]], procs: Procs, head: int, t0: float, t1: float) -> dict[str, float]:
    """CPU seconds per kind between ``t0`` and ``t1`` (monotonic)."""
    ms: Counter[str] = Counter()
    for t, pid, comm in samples:
        if t0 <= t <= t1:
            ms[kind(pid, comm, procs, head, os.getpid())] += 1
    return {k: v / 1000 for k, v in ms.items()}


def profiled(side: str, run: Any, work: Path, i: int) -> dict[str, Any]:
    """One run of ``side`` (``run`` returns fleet_bench's result: ``t0``, the monotonic second its clock started,
    after its own set-up, and ``first``, seconds since then) under the recorder: CPU seconds per kind from ``t0``
    to its first step."""
    rec = Recorder(work / f"perf-{side}-{i}.data")
    rec.start()
    me = os.getpid()
    try:
        got = run()
    finally:
        rec.stop()
    heads = [p for p, (pp, _, cmd) in rec.procs.items() if pp == me and "-m nodekit run" in cmd]
    kinds = charge(rec.samples(), rec.procs, heads[0] if heads else 0, got["t0"], got["t0"] + got["first"])
    rec.data.unlink(missing_ok=True)
    return {"first": got["first"], "cpu": got["cpu"], "kinds": kinds}


SMALL_S = 0.1
"""A kind under this many CPU seconds in a run is counted with the rest of its group ("other: ..." or "container:
first process (...)")."""


def lumped(kinds: Mapping[str, float]) -> dict[str, float]:
    out: Counter[str] = Counter()
    for k, v in kinds.items():
        if v < SMALL_S and k.startswith("other: "):
            k = "other: the rest"
        elif v < SMALL_S and k.startswith("container: first process ("):
            k = "container: first process (the rest)"
        out[k] += v
    return dict(out)


def render(runs: Mapping[str, list[dict[str, Any]]]) -> str:
    sides = list(runs)
    runs = {s: [{**r, "kinds": lumped(r["kinds"])} for r in rs] for s, rs in runs.items()}
    kinds = sorted({k for rs in runs.values() for r in rs for k in r["kinds"]})

    def med(side: str, k: str) -> float:
        return stats.median([r["kinds"].get(k, 0.0) for r in runs[side]])

    rows = [f"{'kind':28}" + "".join(f"{s:>10}" for s in sides) + "".join(f"{s + '-bare':>12}" for s in sides[1:])]
    total = {s: 0.0 for s in sides}
    for k in sorted(kinds, key=lambda k: -med(sides[0], k)):
        vals = {s: med(s, k) for s in sides}
        for s in sides:
            total[s] += vals[s]
        rows.append(f"{k:28}" + "".join(f"{vals[s]:10.2f}" for s in sides)
                    + "".join(f"{vals[s] - vals['bare']:+12.2f}" for s in sides[1:]))  # fmt: skip
    rows.append(f"{'sum of the medians':28}" + "".join(f"{total[s]:10.2f}" for s in sides)
                + "".join(f"{total[s] - total['bare']:+12.2f}" for s in sides[1:]))  # fmt: skip
    firsts = {s: stats.median([r["first"] for r in runs[s]]) for s in sides}
    rows.append(f"{'first step (s), median':28}" + "".join(f"{firsts[s]:10.2f}" for s in sides))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="counted rounds, each side once (default 2)")
    parser.add_argument("--mbit", type=int, default=1000, help="every host's link rate, as scale16_bench's --mbit")
    parser.add_argument("--out", type=Path, default=Path("/tmp/nodekit-start-cost.json"))
    opts = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("no perf on this machine (apt-get install linux-perf)")
    from benchmarks._project import build, copy_demo, exit_on_signals
    from benchmarks._shipcluster import ShipCluster
    from benchmarks.fleet_bench import bare_run, configure, kit_run
    from benchmarks.scale16_bench import LEAN, distribute

    exit_on_signals()
    compileall.compile_dir(ROOT / "nodekit", quiet=1)
    n = opts.hosts
    project = copy_demo("nodekit-startcost-")
    work = project.parent
    ref = build(project, quiet=True)
    base = (project / "nodekit.toml").read_text()
    cfg = project / "nodekit.toml"
    sides = ["bare", "lean", "kit"]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    try:
        with ShipCluster("nk16", n, "classic", work) as c:
            env = {"PATH": f"{c.bin_dir}:{os.environ.get('PATH', '')}", "SSH_AUTH_SOCK": "",
                   "PYTHONUNBUFFERED": "1", "COLUMNS": "400"}  # fmt: skip
            if opts.mbit:
                c.shape(opts.mbit)
            hosts = [f"ssh://root@{h.addr}" for h in c.cluster.hosts[:n]]
            print(f"start_cost: the image on {n} host(s) ({distribute(c, ref, n):.0f} s)", flush=True)

            def one(side: str, i: int) -> dict[str, Any]:
                port = 29700 + 2 * ((i * 3 + sides.index(side)) % 30)
                if side == "bare":
                    return bare_run(c.cluster, n, ref, project, port, c.bin_dir, env, work / f"bare-{n}")
                configure(cfg, base, [*hosts], LEAN if side == "lean" else "")
                return kit_run(c.cluster, n, ref, project, port, env, work / f"{side}-{n}-{i}.log")

            for i in range(-1, opts.rounds):  # one round first, not counted
                for side in sides[i % 3 :] + sides[: i % 3]:
                    got = profiled(side, lambda side=side, i=i: one(side, i), work, i)
                    sampled = sum(got["kinds"].values())
                    print(f"start_cost: round {i + 1} {side}: first step {got['first']:.2f} s, {sampled:.1f} CPU s "
                          f"sampled ({got['cpu']:.1f} busy)", flush=True)  # fmt: skip
                    if i >= 0:
                        runs[side].append(got)
                        opts.out.write_text(json.dumps({"hosts": n, "mbit": opts.mbit, "runs": runs}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(runs))
    print(json.dumps({"hosts": n, "mbit": opts.mbit, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
