"""`make bench` (part): what the kernel's times of receipt cost the link check (issue 48), and its section of
docs/benchmarks.md.

The link check asks each end's kernel when each frame arrived (``SO_TIMESTAMPNS``, linkcheck/probe.py) so that a
pair's round trip is the path's, without the ends' waits for a core. Once one socket asks, the kernel stamps every
frame it receives, and each stamped read carries a control message. This measures that cost apart, on loopback
between two processes, with the check's own code (a sealed :class:`~nodekit.launcher.linkcheck.probe.Channel`,
``_ping`` and ``answer_pings``; ``send_for`` and ``sink`` for bulk data), with the times of receipt asked for and
not, alternating, ``--reps`` times each:

1. Pings: ``--pings`` round trips one after the other; per ping, the wall time and the connecting process's CPU
   time, and the median of the round trips as the check takes them (the path's; as read where not asked for).
2. Bulk data: ``--seconds`` of zeros from one process to the other, counted by the receiver as the check counts a
   transfer (its rate from the first to the last byte).

Not a test: every figure is loopback on this 2-core machine. Reproduce:

    .venv/bin/python benchmarks/stamp_cost.py [--reps 7] [--pings 4000] [--seconds 1] [--no-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._project import DOCS, replace_section

TITLE = "## The link check's times of receipt: their own cost"
KEY = bytes(range(32))  # any session key: both ends of this benchmark hold it


def _listening(stamps: bool) -> socket.socket:
    from nodekit.launcher.linkcheck.probe import stamp_arrivals

    srv = socket.create_server(("127.0.0.1", 0))
    if stamps:
        stamp_arrivals(srv)  # as the listener does: every accepted connection inherits it
    return srv


def _answer(srv: socket.socket, pings: int) -> None:
    """The listener's side: the pings on one connection, answered by the check's own code."""
    from nodekit.launcher.linkcheck.probe import PINGS, Channel, answer_pings
    from nodekit.launcher.store.auth import TO_CLIENT, TO_SERVER

    conn, _ = srv.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel = Channel(conn, KEY, TO_CLIENT, TO_SERVER)
        for _ in range(pings // PINGS):
            answer_pings(channel)


def _send(srv: socket.socket, seconds: float) -> None:
    from nodekit.launcher.linkcheck.probe import send_for

    conn, _ = srv.accept()
    with conn:
        send_for(conn, seconds)


def _connect(port: int, stamps: bool) -> socket.socket:
    from nodekit.launcher.linkcheck.probe import stamp_arrivals

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if stamps:
        stamp_arrivals(sock)
    return sock


@contextlib.contextmanager
def _peer(target: Callable[[socket.socket, Any], None], arg: Any, stamps: bool) -> Iterator[socket.socket]:
    """A connection to another process on loopback that runs ``target(listening socket, arg)``; both ends asking
    their kernel for the times of receipt with ``stamps``."""
    srv = _listening(stamps)
    peer = mp.get_context("fork").Process(target=target, args=(srv, arg))
    peer.start()
    try:
        with _connect(srv.getsockname()[1], stamps) as sock:
            yield sock
    finally:
        peer.join(30)
        srv.close()


def pings(n: int, stamps: bool) -> dict[str, float]:
    """``n`` pings, answered by another process: per ping, wall and CPU microseconds here; the median round trip."""
    from nodekit.launcher.linkcheck.probe import PINGS, Channel, _ping
    from nodekit.launcher.store.auth import TO_CLIENT, TO_SERVER

    n -= n % PINGS
    with _peer(_answer, n, stamps) as sock:
        channel = Channel(sock, KEY, TO_SERVER, TO_CLIENT)
        _ping(channel, 0)  # the first: the answering process's start is not the ping's
        rtts: list[float] = []
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(1, n):
            rtts.append(_ping(channel, i)[0])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    count = n - 1
    return {"wall_us": wall / count * 1e6, "cpu_us": cpu / count * 1e6, "rtt_ms": statistics.median(rtts)}


def bulk(seconds: float, stamps: bool) -> float:
    """Gbit/s of ``seconds`` of zeros from another process, counted here as the check counts a transfer."""
    from nodekit.launcher.linkcheck.probe import sink

    with _peer(_send, seconds, stamps) as sock:
        got = sink(sock, time.monotonic() + seconds + 10)
    if got.error or not got.seconds:
        raise SystemExit(f"stamp_cost: the transfer failed: {got.error or 'no time'}")
    return got.bytes * 8 / got.seconds / 1e9


def _fmt(values: list[float], f: str) -> str:
    return ", ".join(format(v, f) for v in values)


def section(runs: dict[bool, list[dict[str, float]]], reps: int, n: int, seconds: float) -> str:
    def med(stamps: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs[stamps])

    rows = []
    for stamps, label in ((False, "not asked for (before)"), (True, "asked for (now)")):
        rs = runs[stamps]
        rows.append(
            f"| {label} | {med(stamps, 'wall_us'):.1f} ({_fmt([r['wall_us'] for r in rs], '.1f')}) "
            f"| {med(stamps, 'cpu_us'):.1f} ({_fmt([r['cpu_us'] for r in rs], '.1f')}) "
            f"| {med(stamps, 'rtt_ms'):.4f} | {med(stamps, 'gbit'):.1f} ({_fmt([r['gbit'] for r in rs], '.1f')}) |"
        )
    wall = med(True, "wall_us") - med(False, "wall_us")
    cpu = med(True, "cpu_us") - med(False, "cpu_us")
    gbit = med(True, "gbit") / med(False, "gbit") - 1
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    handling = 1000 * (med(False, "rtt_ms") - med(True, "rtt_ms"))
    return "\n".join(
        [
            TITLE,
            "",
            "`benchmarks/stamp_cost.py` (issue 48). The link check asks each end's kernel for the time each frame "
            "arrived (`SO_TIMESTAMPNS`), so that a pair's round trip is the path's without either end's wait for a "
            "core (docs/guides/health.md). Its own cost, measured apart: two processes on loopback on this 2-core "
            f"machine ({when}), the check's own code, the times asked for and not, alternating, {reps} runs each: "
            f"{n} pings one "
            f"after the other (per ping, the wall time and the connecting process's CPU time), and {seconds:g} s of "
            "bulk data counted as the check counts a transfer. Medians, each run's figure in brackets:",
            "",
            "| times of receipt | µs a ping, wall | µs a ping, CPU of the connecting end | the median round trip, ms "
            "| bulk data, Gbit/s |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            "The round trip is the check's figure: the path's where the times are asked for, as the two processes "
            f"read it where not, their handling of each frame included ({handling:.0f} "
            "µs here, idle: what a busy host makes milliseconds). "
            f"The difference of the medians: {wall:+.1f} µs a ping in wall time, {cpu:+.1f} µs of CPU, {gbit:+.1%} in "
            f"bulk rate{_within(runs, 'gbit')}. A check sends five pings a pair: the times cost it "
            f"{5 * max(wall, 0.0):.0f} µs of wall time a pair at most. Its transfers read without control messages "
            "(`recv_into`): what they pay is the kernel's clock read for each frame it receives.",
            "",
        ]
    )


def _within(runs: dict[bool, list[dict[str, float]]], key: str) -> str:
    """Whether the two sides' runs of ``key`` overlap (the difference then within the runs' spread)."""
    on, off = [r[key] for r in runs[True]], [r[key] for r in runs[False]]
    overlap = min(max(on), max(off)) >= max(min(on), min(off))
    return " (the two sides' runs overlap: within their spread)" if overlap else " (the two sides' runs do not overlap)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--pings", type=int, default=4000)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--no-docs", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = ap.parse_args()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for rep in range(args.reps):
        for stamps in (False, True) if rep % 2 == 0 else (True, False):
            run: dict[str, Any] = {**pings(args.pings, stamps), "gbit": bulk(args.seconds, stamps)}
            runs[stamps].append(run)
            print(f"stamps {'on ' if stamps else 'off'}: {run['wall_us']:.1f} µs wall, {run['cpu_us']:.1f} µs CPU, "
                  f"rtt {run['rtt_ms']:.4f} ms, {run['gbit']:.1f} Gbit/s", flush=True)  # fmt: skip
    text = section(runs, args.reps, args.pings, args.seconds)
    print(text)
    if not args.no_docs:
        DOCS.write_text(replace_section(DOCS.read_text(), TITLE, text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
