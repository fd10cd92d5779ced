"""`make bench` (part): what the link check costs (issue 30), and its section of docs/benchmarks.md.

1. Its own cost at 2, 4, 8 and 16 nodes: that many processes on this machine, each a node on its own loopback
   address (127.0.0.N) with the launcher's real check (store, handshake, rounds, transfers, verdict), node 0 hosting
   the store; each node's listener and transfers in the node's own process (``apart.Here``), where the whole-bound
   side can set the bound. The rounds are time-bounded, so the seconds are those of a real cluster; the Gbit/s are
   not (16 processes share 2 cores and the loopback).
2. Its cost on the demo job: examples/ddp as two nodes on this machine (`nodekit up`, main at this machine's own
   non-loopback address, so that the check runs: with main 127.0.0.1 it is skipped), with [health] links = "off"
   and "warn" alternating, `--reps` times each: the check's own seconds from node 0's log, and the job's wall time.
3. Its verdict on busy cores: ``--busy-nodes`` nodes as in 1, every other node's process with a busy thread (the
   launcher's main thread importing and starting torchrun beside the check) and ``--busy-procs`` busy processes
   beside (workers importing torch), four ways alternating, ``--reps`` checks each: the listener and transfers in
   the node's process with a pair's round trip the median of its pings (before), the same with the least, and in a
   process of their own with the least (now, ``linkcheck/apart.py``), and the same with every node and one busy
   process in a cpu cgroup of its own, as containers are (needs root and cpu cgroups). Reported: the pairs named,
   by kind, the pairs' median round trip and the reference rate, and the pairs the same pings name late by their
   round trip as the two processes read them (before the kernels' times of receipt were taken). Every link is
   loopback: every pair named is a false alarm.

Needs a Docker engine and the demo image for part 2 (`--no-demo` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._project import DOCS, build, copy_demo, replace_section
from nodekit.launcher.linkcheck.probe import STEADY_MIN_S as SETTLE_MIN_S  # restored after a run of the whole bound
from nodekit.launcher.linkcheck.probe import path_rtt as PATH_RTT  # restored after a run of the median rule

TITLE = "## The link check: its cost at 2 to 16 nodes and on the demo job"
SECRET = "link-bench-secret"
PORT = 29730


def _fixed(fixed: bool, rule: str = "least") -> None:
    """With ``fixed``, every transfer runs for its whole bound, as before issue 33 (the figure never settles). With
    ``rule`` "median", a pair's round trip is the median of its pings, as before the least was taken. Both act on
    the transfers of this process only (``apart.Here``)."""
    from nodekit.launcher.linkcheck import probe

    probe.STEADY_MIN_S = math.inf if fixed else SETTLE_MIN_S
    probe.path_rtt = _median_rtt if rule == "median" else PATH_RTT


def _median_rtt(rtts_ms: list[float]) -> float | None:
    return round(statistics.median(rtts_ms), 4) if rtts_ms else None


def _busy(until: float) -> None:
    """Busy until ``until``: a core's worth of demand (a worker importing torch, in a process; the launcher's main
    thread importing and starting torchrun, in a node's own process)."""
    while time.monotonic() < until:
        pass


CGROUP_V1, CGROUP_V2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
CGROUP_NAME = "nodekit-link-bench-"


def _cgroups() -> Path | None:
    """Where this machine's cpu cgroups are made (v1's cpu hierarchy, or v2's with the cpu controller), or None."""
    if (CGROUP_V1 / "cgroup.procs").is_file():
        return CGROUP_V1
    control = CGROUP_V2 / "cgroup.subtree_control"
    if control.is_file() and "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")
        return CGROUP_V2
    return None


def _join(rank: int | None) -> None:
    """This process into node ``rank``'s cpu cgroup (made where missing), as a container's processes are; None:
    back to the root group."""
    root = _cgroups()
    if root is None:
        raise SystemExit("link_bench: no cpu cgroups on this machine for part 3's last side (--busy-nodes 0 skips it)")
    group = root if rank is None else root / f"{CGROUP_NAME}{rank}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))


def _busy_in(rank: int | None, until: float) -> None:
    if rank is not None:
        _join(rank)
    _busy(until)


@dataclass(frozen=True)
class How:
    """One check's conditions: ``fixed`` and ``rule`` as :func:`_fixed`; ``apart``: each node's listener and
    transfers in a process of their own (the launcher's way) instead of the node's process; ``spin``: a busy
    thread in the process of every odd-ranked node from before the first round; ``busy``: that many busy
    processes beside; ``cgroups``: every node, and the busy processes in turn, in a cpu cgroup of its own."""

    fixed: bool = False
    rule: str = "least"
    apart: bool = False
    spin: bool = False
    busy: int = 0
    cgroups: bool = False


# Part 3's sides: where a node's listener and transfers run (as the table says it), and the check's conditions
# (``busy`` is set from --busy-procs).
SIDES = {
    "before": ("in the node's process", How(rule="median", spin=True)),
    "least": ("in the node's process", How(spin=True)),
    "now": ("in a process of their own", How(apart=True, spin=True)),
    "cgroups": (
        "in a process of their own, each node with one busy process in a cpu cgroup of its own",
        How(apart=True, spin=True, cgroups=True),
    ),
}


def _meters(how: How) -> Any:
    from nodekit.launcher.linkcheck.apart import Apart, Here

    return Apart if how.apart else Here


def _node(rank: int, n: int, port: int, run_id: bytes, seconds: float, out: Any, how: How) -> None:
    from nodekit.launcher.linkcheck.run import LinkJob, run
    from nodekit.launcher.store.client import Client

    _fixed(how.fixed, how.rule)
    if how.cgroups:
        _join(rank)
    if how.spin and rank % 2:  # half the nodes (odd ranks), as launchers start torchrun at their own moments
        threading.Thread(target=_busy, args=(time.monotonic() + 120,), daemon=True).start()
    store = Client.connect("127.0.0.1", port, SECRET, timeout_s=120, connect_s=30)
    job = LinkJob(rank, n, f"n{rank}", f"127.0.0.{rank + 1}", "lo", SECRET, seconds=seconds)
    v = run(store, job, run_id, meters=_meters(how))
    out.put((rank, v.took_s))


def scaling(n: int, seconds: float, how: How | None = None) -> dict[str, Any]:
    """One check among ``n`` local nodes under ``how``: main's measured duration and the wall time from the first
    process's start to the last verdict (processes already running, as a launcher is when its preflight passed);
    the pairs named, by kind; the median of the pairs' round trips and the reference rate."""
    from nodekit.launcher.linkcheck.rounds import estimate_s
    from nodekit.launcher.linkcheck.run import LinkJob, run
    from nodekit.launcher.linkcheck.verdict import decide
    from nodekit.launcher.store.server import host

    how = how or How()
    hosted = host(SECRET, 0, timeout_s=120, host="127.0.0.1")
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_node, args=(r, n, hosted.port, hosted.run_id, seconds, out, how)) for r in range(1, n)]
    _fixed(how.fixed, how.rule)
    for p in procs:
        p.start()
    time.sleep(1.0 + 0.1 * n)  # let every process import and connect: the launcher is past that when it starts
    until = time.monotonic() + 120
    hogs = [ctx.Process(target=_busy_in, args=(i % n if how.cgroups else None, until)) for i in range(how.busy)]
    for h in hogs:
        h.start()
    if how.cgroups:
        _join(0)
    start = time.monotonic()
    try:
        job = LinkJob(0, n, "n0", "127.0.0.1", "lo", SECRET, seconds=seconds)
        v = run(hosted, job, hosted.run_id, meters=_meters(how))  # node 0 (even) without a busy thread
    finally:
        if how.cgroups:
            _join(None)
    wall = time.monotonic() - start
    for h in hogs:
        h.terminate()
        h.join(10)
    for p in procs:
        p.join(60)
    hosted.close()
    if how.cgroups and (root := _cgroups()) is not None:
        for group in root.glob(f"{CGROUP_NAME}*"):
            with contextlib.suppress(OSError):
                group.rmdir()
    _fixed(False)
    kinds = Counter(f.kind for f in v.findings)
    # The same pings judged by their round trip as the two processes read it, their waits for a core included (a
    # pair's figure before the kernel's times of receipt were taken, linkcheck/probe.py): same run, same pairs.
    as_read = decide(v.endpoints, [replace(p, rtt_ms=p.read_rtt_ms) for p in v.pairs])
    return {"n": n, "took_s": v.took_s, "wall_s": wall, "estimate_s": estimate_s(n, seconds), "pairs": len(v.pairs),
            "late": kinds["late"], "slow": kinds["slow"], "named": len(v.findings),
            "late_read": sum(f.kind == "late" for f in as_read.findings),
            "median_rtt_ms": v.median_rtt_ms or 0.0, "reference_gbit": v.reference_gbit or 0.0,
            "median_read_rtt_ms": as_read.median_rtt_ms or 0.0}  # fmt: skip


def own_address() -> str:
    """This machine's first non-loopback IPv4 address (the demo's main, so that the check is not skipped)."""
    for _i, name in socket.if_nameindex():
        from nodekit.launcher.preflight.network import iface_addr

        addr = iface_addr(name)
        if addr and not addr.startswith("127."):
            return addr
    raise SystemExit("no non-loopback IPv4 address on this machine: the demo part needs one")


def demo_run(config: Path, main: str, links: str) -> tuple[float, float | None]:
    """Two nodes of the demo at once; (wall seconds, the link check's own seconds from node 0's log)."""
    from nodekit.backends.compose.node import compose_path, project_for
    from nodekit.config.settings import load
    from nodekit.system import docker

    settings = load(config)
    env = os.environ | {"NODEKIT_HEALTH": json.dumps({"links": links}), "NODEKIT_ARGS": '["--epochs", "1"]'}
    argv = [sys.executable, "-m", "nodekit", "up", "--main", main, "--master-port", str(PORT), "--detach"]
    start = time.monotonic()
    ups = [
        subprocess.Popen([*argv, "--node-rank", str(r), "--config", str(config)], env=env, stdout=subprocess.DEVNULL)
        for r in (1, 0)
    ]
    if any(p.wait(timeout=120) for p in ups):
        raise SystemExit("nodekit up failed")
    codes = [docker.compose_wait(compose_path(settings, r), project_for(settings, r)) for r in (0, 1)]
    wall = time.monotonic() - start
    logs = subprocess.run(
        [sys.executable, "-m", "nodekit", "logs", "--node-rank", "0", "--config", str(config)],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    for r in (0, 1):
        subprocess.run([sys.executable, "-m", "nodekit", "down", "--node-rank", str(r), "--config", str(config)],
                       capture_output=True, check=False)  # fmt: skip
    if any(codes):
        raise SystemExit(f"the demo failed: exit codes {codes}\n{logs[-3000:]}")
    m = re.search(r"nodekit link check: \w+, 2 nodes, 1 pair\(s\), (?:up to )?[\d.]+ s each way, ([\d.]+) s", logs)
    if links != "off" and m is None:
        raise SystemExit(f"no link check line in node 0's log:\n{logs[-3000:]}")
    return wall, float(m.group(1)) if m else None


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def section(
    scale: list[dict[str, Any]],
    demo: dict[str, Any] | None,
    seconds: float,
    reps: int,
    busy: dict[str, list[dict[str, Any]]] | None = None,
    procs: int = 0,
) -> str:
    lines = [
        TITLE,
        "",
        "`benchmarks/link_bench.py` (issues 30 and 33). Each pair of nodes sends bulk data each way after five round "
        f"trips, in rounds of disjoint pairs (n - 1 rounds for an even n), for {seconds:g} s at most: the receiver "
        "ends a transfer once its figure has settled (within 10 % over its last three 20 ms readings, after 60 ms at "
        "least), which a LAN link does within a few readings. The node count sets the check's bound; how soon the "
        "figures settle sets its duration. Measured with every node a process on this 2-core machine (its own "
        "127.0.0.N address, the launcher's real store, handshake and verdict), the median of "
        f"{reps} check(s) each way, alternating: until the figures settle, and each transfer for its whole "
        f"{seconds:g} s as before issue 33:",
        "",
        "| nodes | pairs | bound: rounds x (2 x transfer + 0.1 s) | until settled: node 0 (wall) | whole bound, as "
        "before: node 0 (wall) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for s in scale:
        f = s["fixed"]
        lines.append(
            f"| {s['n']:.0f} | {s['pairs']:.0f} | {s['estimate_s']:.2f} s | {s['took_s']:.2f} s ({s['wall_s']:.2f} s) "
            f"| {f['took_s']:.2f} s ({f['wall_s']:.2f} s) |"
        )
    lines.append("")
    if demo is not None:
        off, on, took = demo["off_s"], demo["on_s"], demo["check_s"]
        spread = max(*off, *on) - min(*off, *on)
        lines += [
            f"On the demo job (examples/ddp, 2 nodes on this machine, main {demo['main']}, `--epochs 1`, "
            f"{demo['reps']} runs each way, alternating): the check itself took a median "
            f"{statistics.median(took):.2f} s ({', '.join(f'{t:.2f}' for t in took)}, from node 0's log). The whole "
            f'job took a median {statistics.median(off):.1f} s with `links = "off"` ({_list(off)}) '
            f"and {statistics.median(on):.1f} s with the check ({_list(on)}); single runs "
            f"spread over {spread:.1f} s on this shared machine, so only the check's own figure is exact.",
            "",
        ]
    if busy and busy["now"]:
        n = busy["now"][0]["n"]

        def each(side: str, key: str, fmt: str) -> str:
            return ", ".join(format(r[key], fmt) for r in busy[side])

        lines += [
            f"On busy cores ({n} nodes as above; in the process of every other node a busy thread, as the "
            "launcher's main thread is while it imports and starts torchrun beside the check; "
            f"{procs} busy processes beside, as workers importing torch are; {len(busy['now'])} checks each way, "
            "alternating). Every link is loopback, so every pair named is a false alarm:",
            "",
            "| the node's listener and transfers | a pair's round trip | pairs named late | the same pings as the "
            "processes read them: late | pairs named slow | the pairs' median round trip, ms (as read) | the "
            "reference, Gbit/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for side, (where, how) in SIDES.items():
            label = {"before": " (before)", "now": " (now)", "cgroups": " (now, as containers)"}.get(side, "")
            lines.append(
                f"| {where}{label} | the {how.rule} of its five pings | {each(side, 'late', 'd')} | "
                f"{each(side, 'late_read', 'd')} | {each(side, 'slow', 'd')} | {each(side, 'median_rtt_ms', '.2f')} "
                f"({each(side, 'median_read_rtt_ms', '.2f')}) | {each(side, 'reference_gbit', '.1f')} |"
            )
        lines += [
            "",
            "The last row is the same load with every node (its process and its check's process) and one busy "
            "process in a cpu cgroup of its own, as a container's processes are: the scheduler then runs the "
            "groups in turn, and a woken listener waits for its group's turn at every answer. The column of pairs "
            "named late judges each pair by the path's round trip, each end's wait for a core taken out by the "
            "kernels' times of receipt (linkcheck/probe.py); the next column judges the same pings by the round "
            "trip as the two processes read them, as every check did before: the pairs named there are the hosts' "
            "CPU, not their links. The first row's as-read column is the check as it was before issue 48's fifth "
            "stop.",
            "",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4,8,16")
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--busy-nodes", type=int, default=8, help="part 3 at this many nodes (0: not run)")
    ap.add_argument("--busy-procs", type=int, default=8, help="part 3: busy processes beside the nodes")
    ap.add_argument("--no-demo", action="store_true")
    ap.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = ap.parse_args()
    scale: list[dict[str, Any]] = []
    for n in (int(x) for x in args.nodes.split(",") if x):
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.reps):
            for fixed in (False, True):
                runs[fixed].append(scaling(n, args.seconds, How(fixed=fixed)))
        best, before = (sorted(runs[f], key=lambda r: r["took_s"])[len(runs[f]) // 2] for f in (False, True))
        took = ", ".join(f"{r['took_s']:.2f}" for r in runs[False])
        was = ", ".join(f"{r['took_s']:.2f}" for r in runs[True])
        print(f"{n} nodes: {took} s until settled, {was} s for the whole bound ({best['estimate_s']:.2f} s)")
        scale.append({**best, "fixed": before})
    busy: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    if args.busy_nodes:
        for _ in range(args.reps):
            for side, (_where, how) in SIDES.items():
                busy[side].append(scaling(args.busy_nodes, args.seconds, replace(how, busy=args.busy_procs)))
        for side, got in busy.items():
            print(f"busy, {side}: late {[r['late'] for r in got]} (as read {[r['late_read'] for r in got]}), "
                  f"slow {[r['slow'] for r in got]}, "
                  f"rtt {[round(r['median_rtt_ms'], 2) for r in got]}, "
                  f"Gbit/s {[round(r['reference_gbit'], 1) for r in got]}")  # fmt: skip
    demo = None
    if not args.no_demo:
        project = copy_demo("nodekit-link-bench-")
        build(project, quiet=True)
        main_addr = own_address()
        off: list[float] = []
        on: list[float] = []
        checks: list[float] = []
        for _ in range(args.reps):
            off.append(demo_run(project / "nodekit.toml", main_addr, "off")[0])
            wall, check = demo_run(project / "nodekit.toml", main_addr, "warn")
            on.append(wall)
            checks.append(check or 0.0)
        demo = {"main": main_addr, "reps": args.reps, "off_s": off, "on_s": on, "check_s": checks}
        print(f"demo: off {off}, on {on}, check {checks}")
    text = section(scale, demo, args.seconds, args.reps, busy, args.busy_procs)
    print(text)
    if not args.no_docs:
        DOCS.write_text(replace_section(DOCS.read_text(), TITLE, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
