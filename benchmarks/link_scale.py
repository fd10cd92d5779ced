"""The link check at 16, 64 and 512 nodes (issue 48): its plan and bound, and the real check measured with every
node on loopback. Prints a markdown table.

1. The plan, computed (``nodekit/launcher/linkcheck/rounds.py``): rounds, pairs measured, partners per node, and the
   bound, rounds x (2 x link_seconds + 0.1 s), beside what every pair would take.
2. Measured (unless ``--plan-only``): the launcher's real check, every node a thread with its own loopback address
   (127.1.x.y), its own listener and its own authenticated store connection, in ``--procs`` processes; this
   process hosts the store and is node 0. One node's link is paced to 20 Mbit/s (``tests.factories.shaper``) so that
   the narrowing runs and the verdict must name it. Reported: node 0's check (its ``took_s``), the rounds run,
   every node's calls on main's store, main's CPU seconds (store and node 0), and who was named. On one machine the
   transfers share its cores and its loopback: the seconds are an upper bound of a LAN's, the Gbit/s are not a LAN's.

    .venv/bin/python benchmarks/link_scale.py [--nodes 16,64,512] [--procs 4] [--seconds 0.2] [--plan-only]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodekit.launcher.linkcheck.rounds import ROUND_OVERHEAD_S, estimate_s, plan_rounds, rounds, sampled, survey
from nodekit.launcher.linkcheck.verdict import LinkVerdict, narrow
from nodekit.launcher.store.kv import Limits

SECRET = "link-scale-secret-0123456789"
RATE = 2.5e6  # the slow node's link: 20 Mbit/s


def addr(rank: int) -> str:
    return f"127.1.{rank // 250}.{rank % 250 + 1}"


class Counting:
    """A node's store, counting its calls (each one a request main's store serves)."""

    def __init__(self, store: Any) -> None:
        self.store, self.ops = store, 0

    def set(self, key: str, value: str) -> None:
        self.ops += 1
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        self.ops += 1
        return bytes(self.store.get(key))

    def add(self, key: str, amount: int) -> int:
        self.ops += 1
        return int(self.store.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        self.ops += 1
        return bool(self.store.check(keys))


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _node(store: Any, rank: int, n: int, run_id: bytes, seconds: float) -> tuple[LinkVerdict, int]:
    from nodekit.launcher.linkcheck.apart import Here
    from nodekit.launcher.linkcheck.run import LinkJob, run

    counted = Counting(store)
    job = LinkJob(rank, n, f"h{rank}", addr(rank), "lo", SECRET, seconds=seconds)
    v = run(counted, job, run_id, meters=Here)  # in this process, where the shaper is: not a process per node
    return v, counted.ops


def _workers(port: int, run_id: bytes, n: int, ranks: list[int], seconds: float, slow: int, out: Any) -> None:
    """A worker process: the nodes of ``ranks``, each in a thread with its own store connection."""
    from nodekit.launcher.store.client import Client
    from tests.factories import shaper

    _raise_fd_limit()
    socket.socket = shaper(addr(slow), RATE)  # type: ignore[misc]
    clients = {r: Client.connect("127.0.0.1", port, SECRET, timeout_s=120, connect_s=30) for r in ranks}
    got: dict[int, Any] = {}

    def one(r: int) -> None:
        try:
            v, ops = _node(clients[r], r, n, run_id, seconds)
            got[r] = (v.suspects, ops)
        except Exception as e:  # a node's failure is a row of the result, not a hung benchmark
            got[r] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    out.put(got)


def measure(n: int, seconds: float, procs: int) -> dict[str, Any]:
    """One real check among ``n`` loopback nodes, one of them slow."""
    from nodekit.launcher.store.server import host
    from tests.factories import shaper

    _raise_fd_limit()
    slow = n // 3
    plain = socket.socket
    socket.socket = shaper(addr(slow), RATE)  # type: ignore[misc]
    hosted = host(SECRET, 0, timeout_s=120, host="127.0.0.1", limits=Limits(max_sessions=max(64, 2 * n)))
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    ranks = list(range(1, n))
    parts = [ranks[i::procs] for i in range(procs)]
    workers = [ctx.Process(target=_workers, args=(hosted.port, hosted.run_id, n, p, seconds, slow, out)) for p in parts]
    for w in workers:
        w.start()
    while hosted.stats().sessions < n - 1:  # every node connected (the launcher is past that when it starts)
        time.sleep(0.1)
    cpu, start = time.process_time(), time.monotonic()
    v, ops0 = _node(hosted, 0, n, hosted.run_id, seconds)
    wall, cpu = time.monotonic() - start, time.process_time() - cpu
    results: dict[int, Any] = {0: (v.suspects, ops0)}
    for _ in workers:
        results.update(out.get(timeout=600))
    for w in workers:
        w.join(30)
    hosted.close()
    socket.socket = plain  # type: ignore[misc]
    failed = {r: x for r, x in results.items() if isinstance(x, str)}
    if failed:
        raise SystemExit(f"{len(failed)} node(s) failed, e.g. {sorted(failed.items())[:3]}")
    ops = sum(x[1] for x in results.values())
    agree = len({x[0] for x in results.values()}) == 1
    first = survey(n, hosted.run_id)
    surveyed = {p for r in first for p in r}
    ran = len(first) + len(narrow(v.endpoints, [p for p in v.pairs if (p.a, p.b) in surveyed])) if sampled(n) else 0
    return {"took_s": v.took_s, "wall_s": wall, "cpu_s": cpu, "ops": ops, "pairs": len(v.pairs), "slow": slow,
            "named": v.suspects, "agree": agree, "rounds": ran or len(first)}  # fmt: skip


def plan(n: int, seconds: float) -> dict[str, Any]:
    first = survey(n, b"a run id")
    met = Counter(x for r in first for p in r for x in p)
    every = len(rounds(n))
    return {"n": n, "rounds": plan_rounds(n), "survey_pairs": sum(len(r) for r in first), "all_pairs": n * (n - 1) // 2,
            "partners": (min(met.values()), max(met.values())), "bound_s": estimate_s(n, seconds),
            "every_pair_s": every * (2 * seconds + ROUND_OVERHEAD_S), "sampled": sampled(n)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="16,64,512")
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--plan-only", action="store_true")
    args = ap.parse_args()
    lines = [
        "| nodes | plan | rounds at most | pairs (of all) | partners per node | bound | every pair would take "
        "| measured: node 0's check | rounds run | store calls on main (per node) | main's CPU | named |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in (int(x) for x in args.nodes.split(",")):
        p = plan(n, args.seconds)
        how = "survey + narrowing" if p["sampled"] else "every pair"
        lo, hi = p["partners"]
        row = (f"| {n} | {how} | {p['rounds']} | {p['survey_pairs']:,} (of {p['all_pairs']:,}) | {lo} to {hi} "
               f"| {p['bound_s']:.1f} s | {p['every_pair_s']:.1f} s ")  # fmt: skip
        if args.plan_only:
            lines.append(row + "| | | | | |")
            continue
        m = measure(n, args.seconds, args.procs)
        named = ", ".join(f"node {r}" for r in m["named"]) or "nobody"
        named += f" (slow: node {m['slow']})" + ("" if m["agree"] else "; NODES DISAGREE")
        ran = f"{m['rounds']} ({m['pairs']:,} pairs)"
        calls = f"{m['ops']:,} ({m['ops'] / n:.0f})"
        lines.append(row + f"| {m['took_s']:.1f} s | {ran} | {calls} | {m['cpu_s']:.1f} s | {named} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
