"""The peer watchdog at 64, 256 and 512 simulated nodes (issue 48): main's store operations per second, main's CPU,
and the time until every node names a node whose host vanished. Prints a markdown table.

This process is main: it hosts the real store on loopback and runs node 0's real :class:`Watchdog`, so its CPU
(``time.process_time``) is main's store and watchdog together. The other nodes are real watchdogs too, beating at
the real rate (1 s), in ``--procs`` worker processes, each node with its own authenticated connection. After a
warm-up, one node's host vanishes (its store calls hang, no FIN: the slowest case, named after the peer timeout);
the time to name it is from then until each other node's watchdog stopped its job, the last node counting.

    .venv/bin/python benchmarks/watchdog_scale.py [--nodes 64 256 512] [--timeout 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodekit.launcher.store.client import Client
from nodekit.launcher.store.kv import Limits
from nodekit.launcher.store.server import host
from nodekit.launcher.watchdog.run import Watchdog

SECRET = "watchdog-scale-secret-0123456789"
BEAT_S = 1.0
WARM_S = 4.0  # every node beat, main published, every worker read a record
WINDOW_S = 5.0  # the steady state measured


class Node:
    """A simulated node's store: its connection, which hangs once its host vanished."""

    def __init__(self, client: Client) -> None:
        self.client, self.vanished, self.forever = client, threading.Event(), threading.Event()

    def _call(self) -> None:
        if self.vanished.is_set():
            self.forever.wait()

    def set(self, key: str, value: str | bytes) -> None:
        self._call()
        self.client.set(key, value)

    def get(self, key: str) -> bytes:
        self._call()
        return self.client.get(key)

    def add(self, key: str, amount: int) -> int:
        self._call()
        return self.client.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        self._call()
        return self.client.check(keys)


def names(n: int) -> dict[int, str]:
    return {r: f"10.{r // 65536}.{r // 256 % 256}.{r % 256}, host h{r}" for r in range(n)}


def workers(port: int, n: int, ranks: list[int], conns: int, timeout: float, victim: int, vanish_at: float) -> None:
    """A worker process: the watchdogs of ``ranks``; prints ``{rank: when it stopped its job}`` (monotonic, which
    every process of this machine shares) once the deadline passed, then ends without waiting for its threads."""
    conns = conns or len(ranks)  # a connection shared by threads is a lock they can starve on: real nodes have one each
    clients = [Client.connect("127.0.0.1", port, SECRET, timeout_s=30, connect_s=10) for _ in range(conns)]
    alarms: dict[int, float] = {}
    lines: dict[int, str] = {}
    lock = threading.Lock()
    nodes = {r: Node(clients[i % conns]) for i, r in enumerate(ranks)}

    def stop(rank: int) -> None:
        with lock:
            alarms.setdefault(rank, time.monotonic())

    def err(rank: int, line: str) -> None:
        with lock:
            lines.setdefault(rank, line)

    dogs = [
        Watchdog(
            nodes[r],
            r,
            n,
            timeout,
            names(n),
            stop=functools.partial(stop, r),
            err=functools.partial(err, r),
            hard_exit=lambda c: None,
            beat_s=BEAT_S,
            judge_s=0.5,
        )
        for r in ranks
    ]
    time.sleep(max(0.0, vanish_at - WARM_S - WINDOW_S - time.monotonic()))  # every process starts its nodes at once
    for d in dogs:
        d.start()
    time.sleep(max(0.0, vanish_at - time.monotonic()))
    if victim in nodes:
        nodes[victim].vanished.set()
    time.sleep(max(0.0, vanish_at + timeout + 4 * BEAT_S + 5.0 - time.monotonic()))
    with lock:
        early = {r: lines.get(r, "") for r, at in alarms.items() if at < vanish_at}
        for r, line in sorted(early.items())[:3]:  # an alarm before the victim vanished: say why
            print(f"node {r} stopped before the victim vanished: {line}", file=sys.stderr, flush=True)
        print(json.dumps({str(r): at for r, at in alarms.items()}), flush=True)
    os._exit(0)


def measure(n: int, timeout: float, procs: int, conns: int) -> dict[str, float]:
    hosted = host(SECRET, 0, timeout_s=30, host="127.0.0.1", limits=Limits(max_sessions=max(64, 2 * n)))
    stopped: list[float] = []
    said: list[str] = []
    dog = Watchdog(
        hosted, 0, n, timeout, names(n), stop=lambda: stopped.append(time.monotonic()), err=said.append,
        hard_exit=lambda c: None, beat_s=BEAT_S, judge_s=0.5,
    )  # fmt: skip
    victim = n * 2 // 3
    start = time.monotonic() + 5.0  # the worker processes' imports and connections
    vanish_at = start + WARM_S + WINDOW_S
    ranks = list(range(1, n))
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                str(hosted.port),
                str(n),
                json.dumps(ranks[i::procs]),
                str(conns),
                str(timeout),
                str(victim),
                repr(vanish_at),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    time.sleep(max(0.0, start - time.monotonic()))
    dog.start()
    time.sleep(max(0.0, start + WARM_S - time.monotonic()))
    ops0, cpu0, t0 = hosted.table.ops, time.process_time(), time.monotonic()
    time.sleep(WINDOW_S)
    ops_s = (hosted.table.ops - ops0) / (time.monotonic() - t0)
    cpu = (time.process_time() - cpu0) / (time.monotonic() - t0)
    alarms: dict[int, float] = {}
    for c in children:
        out, _ = c.communicate(timeout=timeout + 60)
        alarms |= {int(r): at for r, at in json.loads(out.strip().splitlines()[-1]).items()}
    if stopped:
        alarms[0] = stopped[0]
        if stopped[0] < vanish_at:
            print(f"node 0 stopped before the victim vanished: {said[:1]}", file=sys.stderr, flush=True)
    hosted.close()
    named = [alarms[r] - vanish_at for r in range(n) if r != victim and r in alarms]
    return {
        "n": n,
        "ops_s": ops_s,
        "per_node": ops_s / n,
        "cpu": cpu,
        "named": len(named),
        "median": statistics.median(named) if named else float("nan"),
        "last": max(named) if named else float("nan"),
        "early": sum(1 for r, at in alarms.items() if r != victim and at < vanish_at),
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        port, nodes, ranks, conns, timeout, victim, vanish_at = sys.argv[2:9]
        workers(int(port), int(nodes), json.loads(ranks), int(conns), float(timeout), int(victim), float(vanish_at))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--timeout", type=float, default=3.0, help="the peer timeout, seconds")
    parser.add_argument("--procs", type=int, default=4, help="worker processes")
    parser.add_argument("--conns", type=int, default=0, help="store connections per worker process (0: one a node)")
    args = parser.parse_args()
    rows = [measure(n, args.timeout, args.procs, args.conns) for n in args.nodes]
    every_other = "every other node would read: N x (N - 1) x 3"
    print(f"peer timeout {args.timeout:g} s, beat {BEAT_S:g} s; {os.cpu_count()} cores")
    print()
    print("| nodes | store ops/s on main | per node | main's CPU (cores) | nodes that named it | median | last |"
          f" {every_other} |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        n = int(r["n"])
        print(
            f"| {n} | {r['ops_s']:,.0f} | {r['per_node']:.1f} | {r['cpu']:.3f} | {int(r['named'])} of {n - 1}"
            f"{' (' + str(int(r['early'])) + ' early)' if r['early'] else ''} | {r['median']:.1f} s | {r['last']:.1f} s"
            f" | {n * (n - 1) * 3:,} |"
        )


if __name__ == "__main__":
    main()
