"""Pure helpers of the shipping benchmark (benchmarks/ship_bench.py): link counters from `ip -s -j link`, the
`tc` commands that limit a link, and the results table. No I/O here, so tests/unit can check them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def tx_bytes(ip_json: str, iface: str) -> int:
    """Bytes sent so far by ``iface``, from the output of ``ip -s -j link``. ValueError when it is not there."""
    for link in json.loads(ip_json):
        if link.get("ifname") == iface:
            stats = link.get("stats64") or link.get("stats")
            if not stats or "tx" not in stats:
                raise ValueError(f"no tx counters for {iface} (was `ip` run with -s?)")
            return int(stats["tx"]["bytes"])
    raise ValueError(f"no interface {iface} in the `ip -s -j link` output")


def tbf_argv(dev: str, mbit: int) -> list[str]:
    """`tc` arguments that limit ``dev``'s sending to ``mbit`` Mbit/s with a token bucket. The bucket holds at least
    what the rate sends in 4 ms (and never less than 64 KiB), enough that the kernel's timer does not cap the rate
    below what is asked; 50 ms of queue before packets are dropped."""
    burst = max(64 * 1024, mbit * 1_000_000 // 8 // 250)
    return ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit", "burst", str(burst),
            "latency", "50ms"]  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One measured push: ``case`` a, b or c; ``how`` layers, whole or registry; seconds from the command to the
    image on every target; bytes the head's link sent; bytes nodekit counted into the targets' loads (None for a
    registry pull); ``extra`` a note (the registry's own push time)."""

    case: str
    how: str
    targets: int
    mbit: int
    seconds: float
    link_bytes: int
    nodekit_bytes: int | None = None
    extra: str = ""


CASES = {
    "a": "(a) whole demo image, empty nodes",
    "b": "(b) code-only change (one line of train.py)",
    "c": "(c) one package added",
}
HOWS = {
    "layers": "nodekit push, only missing layers (relayed when 64 MiB+ travel)",
    "direct": "nodekit push, no relay (--relay never)",
    "whole": "nodekit push, whole image, no relay (before)",
    "registry": "registry: docker push + pulls",
}


def ordered(rows: Sequence[Row]) -> list[Row]:
    """Rows as the table shows them: the main link speed first, then by case, target count and how."""
    how = list(HOWS)
    return sorted(rows, key=lambda r: (-r.mbit, r.case, r.targets, how.index(r.how)))


def mib(n: float) -> str:
    if n < 1024 * 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def table(rows: Sequence[Row], cases: Mapping[str, str] = CASES) -> list[str]:
    """The markdown table of ``rows``, in the order given; ``cases`` names the cases (the demo image's by default)."""
    lines = [
        "| case | how | targets | link | time | head's link sent | nodekit counted | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        counted = mib(r.nodekit_bytes) if r.nodekit_bytes is not None else "-"
        lines.append(
            f"| {cases[r.case]} | {HOWS[r.how]} | {r.targets} | {r.mbit} Mbit/s | {r.seconds:.1f} s | "
            f"{mib(r.link_bytes)} | {counted} | {r.extra} |"
        )
    return lines


def find(rows: Sequence[Row], case: str, how: str, targets: int, mbit: int) -> Row | None:
    for r in rows:
        if (r.case, r.how, r.targets, r.mbit) == (case, how, targets, mbit):
            return r
    return None


def verdicts(rows: Sequence[Row], *, mbit: int, image_wire: int | None, code_wire_s: float | None) -> list[str]:
    """The issue's three targets against the measured rows, one line each: met or not, with the numbers.
    ``image_wire``: the image's compressed size (bytes); ``code_wire_s``: the code layer's time on the wire."""
    out = []
    b4 = find(rows, "b", "layers", 4, mbit)
    if b4 is not None and code_wire_s is not None:
        limit = 2 + code_wire_s
        ok = "met" if b4.seconds <= limit else "NOT met"
        out.append(f"- (b) to 4 nodes within 2 s + the code layer's wire time ({limit:.2f} s): **{ok}**, "
                   f"{b4.seconds:.1f} s.")  # fmt: skip
    a1, a4 = find(rows, "a", "layers", 1, mbit), find(rows, "a", "layers", 4, mbit)
    if a1 is not None and a4 is not None:
        ratio = a4.seconds / a1.seconds
        ok = "met" if ratio <= 1.3 else "NOT met"
        out.append(f"- (a) to 4 nodes within 1.3x the time to 1 node: **{ok}**, {a4.seconds:.1f} s vs "
                   f"{a1.seconds:.1f} s ({ratio:.2f}x).")  # fmt: skip
    if a4 is not None and image_wire:
        ratio = a4.link_bytes / image_wire
        ok = "met" if ratio <= 1.2 else "NOT met"
        out.append(f"- head's bytes for (a) to 4 nodes within 1.2x the image's compressed size ({mib(image_wire)}): "
                   f"**{ok}**, {mib(a4.link_bytes)} ({ratio:.2f}x).")  # fmt: skip
    return out
