"""Pure helpers of the shipping benchmarks (benchmarks/ship_bench.py, benchmarks/cuda_bench.py): link counters
from `ip -s -j link`, the `tc` commands that limit a link, the results table (one store column: Docker's classic
layer store or its containerd image store) and the verdicts against issue 27's targets, per store. No I/O here, so
tests/unit can check them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


STORES = ("classic", "containerd")
"""Docker's image stores, in the order the tables show them: the classic layer store (overlay2: what an upgraded
host keeps) and the containerd image store (the default of Engine 29 on fresh installs)."""


def parse_stores(text: str) -> list[str]:
    """``--stores classic,containerd`` as a list in the tables' order, each once. ValueError naming a bad one."""
    asked = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in asked if s not in STORES]
    if bad or not asked:
        raise ValueError(f"--stores takes {' and/or '.join(STORES)}, comma-separated, not {text!r}")
    return [s for s in STORES if s in asked]


@dataclass(frozen=True)
class Row:
    """One measured push: ``case`` a, b or c; ``how`` layers, direct, whole or registry; seconds from the command to
    the image on every target; bytes the head's link sent; bytes nodekit counted into the targets' loads (None for a
    registry pull); ``extra`` a note (the registry's own push time, the stream's codec); ``store`` the image store of
    the head and of every target (rows written before there were two say nothing: classic); ``samples`` every time
    measured where the case was repeated (``seconds`` is then their median; the other figures are the first's)."""

    case: str
    how: str
    targets: int
    mbit: int
    seconds: float
    link_bytes: int
    nodekit_bytes: int | None = None
    extra: str = ""
    store: str = "classic"
    samples: tuple[float, ...] = ()


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
    """Rows as the table shows them: the main link speed first, then by case, target count, store and how (the two
    stores' rows of one case side by side)."""
    how = list(HOWS)
    return sorted(rows, key=lambda r: (-r.mbit, r.case, r.targets, _store_index(r.store), how.index(r.how)))


def _store_index(store: str) -> int:
    return STORES.index(store) if store in STORES else len(STORES)


def mib(n: float) -> str:
    if n < 1024 * 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def table(rows: Sequence[Row], cases: Mapping[str, str] = CASES) -> list[str]:
    """The markdown table of ``rows``, in the order given; ``cases`` names the cases (the demo image's by default)."""
    lines = [
        "| case | targets | store | how | link | time | head's link sent | nodekit counted | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        counted = mib(r.nodekit_bytes) if r.nodekit_bytes is not None else "-"
        time = f"{r.seconds:.1f} s" + (f" (median of {len(r.samples)})" if len(r.samples) > 1 else "")
        lines.append(
            f"| {cases[r.case]} | {r.targets} | {r.store} | {HOWS[r.how]} | {r.mbit} Mbit/s | {time} | "
            f"{mib(r.link_bytes)} | {counted} | {r.extra} |"
        )
    return lines


def find(rows: Sequence[Row], case: str, how: str, targets: int, mbit: int, store: str = "classic") -> Row | None:
    for r in rows:
        if (r.case, r.how, r.targets, r.mbit, r.store) == (case, how, targets, mbit, store):
            return r
    return None


def wire_seconds(n_bytes: int, mbit: int) -> float:
    """How long ``n_bytes`` take on a link of ``mbit`` Mbit/s, nothing else counted."""
    return n_bytes * 8 / (mbit * 1e6)


def verdicts(
    rows: Sequence[Row],
    *,
    store: str,
    mbit: int,
    image_wire: int | None = None,
    against_registry: bool = False,
    missing: bool = False,
) -> list[str]:
    """Issue 27's targets for the rows of one ``store``, one line each: met or not, with the numbers; a target whose
    rows were not measured is left out, or with ``missing`` said to be undecided. The code change's wire time is its
    bytes on the head's link to 4 nodes at ``mbit``. ``against_registry``: the package change (c) to 1 and 4 nodes
    against the registry anchor of the same run (the CUDA image's target). ``image_wire``: the image's compressed
    size, for issue 10's bound on the head's bytes."""
    out = []

    def absent(target: str, needs: str) -> None:
        if missing:
            out.append(f"- {store}: {target}: not decided, this run has no {needs}.")

    b4 = find(rows, "b", "layers", 4, mbit, store)
    if b4 is None:
        absent("a one-line code change (b) to 4 nodes within 2 s + its wire time", "(b) to 4 nodes")
    else:
        limit = 2 + wire_seconds(b4.link_bytes, mbit)
        ok = "met" if b4.seconds <= limit else "NOT met"
        out.append(f"- {store}: a one-line code change (b) to 4 nodes within 2 s + its wire time ({limit:.2f} s): "
                   f"**{ok}**, {b4.seconds:.1f} s.")  # fmt: skip
    for n in (1, 4) if against_registry else ():
        c, reg = find(rows, "c", "layers", n, mbit, store), find(rows, "c", "registry", n, mbit, store)
        if c is None or reg is None:
            absent(f"the package change (c) to {n} node(s) faster than the registry anchor", f"(c) to {n} node(s) "
                   "with its registry row")  # fmt: skip
        elif min(len(c.samples), len(reg.samples)) >= MIN_SAMPLES:
            out.append(f"- {store}: the package change (c) to {n} node{'s' if n > 1 else ''} faster than the registry "
                       f"anchor: {_decided(c.samples, reg.samples)}")  # fmt: skip
        else:
            ok = "met" if c.seconds < reg.seconds else "NOT met"
            out.append(f"- {store}: the package change (c) to {n} node{'s' if n > 1 else ''} faster than the registry "
                       f"anchor: **{ok}**, {c.seconds:.1f} s vs {reg.seconds:.1f} s.")  # fmt: skip
    a1, a4 = find(rows, "a", "layers", 1, mbit, store), find(rows, "a", "layers", 4, mbit, store)
    if a1 is None or a4 is None:
        absent("the whole image (a) to 4 nodes within 1.3x the time to 1 node", "(a) to both 1 and 4 nodes")
    else:
        ratio = a4.seconds / a1.seconds
        ok = "met" if ratio <= 1.3 else "NOT met"
        out.append(f"- {store}: the whole image (a) to 4 nodes within 1.3x the time to 1 node (relayed): **{ok}**, "
                   f"{a4.seconds:.1f} s vs {a1.seconds:.1f} s ({ratio:.2f}x).")  # fmt: skip
    if a4 is not None and image_wire:
        ratio = a4.link_bytes / image_wire
        ok = "met" if ratio <= 1.2 else "NOT met"
        out.append(f"- {store}: the head's bytes for (a) to 4 nodes within 1.2x the image's compressed size "
                   f"({mib(image_wire)}): **{ok}**, {mib(a4.link_bytes)} ({ratio:.2f}x).")  # fmt: skip
    return out


def relay_verdicts(rows: Sequence[Row], *, image: str, targets: int | None = None) -> list[str]:
    """Issue 27's 1.3x where the link sets the pace, one line per store and link rate of the relay phase's ``rows``:
    the whole ``image`` (a) to ``targets`` nodes against 1 node, or, with ``targets`` None, to the most nodes
    measured at that store and rate; undecided where a side is missing."""
    out = []
    for st in [s for s in STORES if any(r.store == s for r in rows)]:
        for mbit in sorted({r.mbit for r in rows if r.store == st}):
            one = find(rows, "a", "layers", 1, mbit, st)
            if targets is None:
                most = max((r for r in rows if (r.store, r.mbit) == (st, mbit)), key=lambda r: r.targets)
                many = None if most.targets == 1 else most
            else:
                many = find(rows, "a", "layers", targets, mbit, st)
            if one is None or many is None:
                more = "more" if targets is None else targets
                out.append(f"- {st}, {mbit} Mbit/s: not decided, this run lacks (a) to 1 node or to {more}.")
                continue
            ratio = many.seconds / one.seconds
            ok = "met" if ratio <= 1.3 else "NOT met"
            out.append(f"- {st}: the whole {image} (a) to {many.targets} nodes within 1.3x the time to 1 node, every "
                       f"link at {mbit} Mbit/s: **{ok}**, {many.seconds:.1f} s vs {one.seconds:.1f} s "
                       f"({ratio:.2f}x); the head's link carried {mib(many.link_bytes)} for {many.targets} nodes, "
                       f"{mib(one.link_bytes)} for one.")  # fmt: skip
    return out


MIN_SAMPLES = 3
"""Repeated rows with at least this many samples on both sides are decided on an interval, not on one sample."""


def _decided(ours: Sequence[float], anchor: Sequence[float]) -> str:
    """Whether ours is faster than the anchor, decided on the 95% bootstrap interval of median(ours) minus
    median(anchor): met when the whole interval is below 0 s, NOT met when it is wholly at or above, else undecided;
    with every sample."""
    from benchmarks.stats import difference_of_medians, median

    iv = difference_of_medians(anchor, ours, seed=27)
    status = "met" if iv.high < 0 else "NOT met" if iv.low >= 0 else "undecided"
    return (f"**{status}**, median {median(ours):.1f} s vs {median(anchor):.1f} s, difference {iv.estimate:+.1f} s "
            f"[{iv.low:+.1f}, {iv.high:+.1f}] (95% interval; nodekit {', '.join(f'{x:.1f}' for x in ours)}; "
            f"registry {', '.join(f'{x:.1f}' for x in anchor)}).")  # fmt: skip


def by_store(rows: Sequence[Row], fmt: Callable[[Row], str], *, case: str, how: str, targets: int, mbit: int) -> str:
    """One figure per store that has the row, as "classic 1.2 s, containerd 1.4 s" ("" when neither has it)."""
    found = [(st, r) for st in STORES if (r := find(rows, case, how, targets, mbit, st)) is not None]
    return ", ".join(f"{st} {fmt(r)}" for st, r in found)


GIB = 1 << 30
DISK_HEADROOM = 8 * GIB
"""Left free for the machine's other users while a benchmark's copies are on the disk."""


def disk_need(image_bytes: int, targets: int, *, staging: bool = False, registry: bool = False,
              factor: float = 2.2) -> int:  # fmt: skip
    """Free disk a shipping phase needs on this machine, where every virtual host's data root lives: each target
    about ``factor`` times the image while it loads (nodekit's plan asks a node for 2.2x, nodekit.ship.DISK_FACTOR:
    the archive, then the unpacked layers), twice the image to put it on the containerd-store engine first
    (``staging``: that store keeps the layer blobs beside the unpacked snapshots), once more for a registry's copy,
    and :data:`DISK_HEADROOM`."""
    extra = (2 * image_bytes if staging else 0) + (image_bytes if registry else 0)
    return int(targets * image_bytes * factor) + extra + DISK_HEADROOM


def when(run: Mapping[str, Any]) -> str:
    """One run in a few words: when, the load at its start and end, how long."""
    took = f", {run['run_minutes']} minutes" if "run_minutes" in run else ""
    return (f"measured {run.get('measured', '?')}, load {run.get('load_start', '?')} at the start and "
            f"{run.get('load_end', '?')} at the end{took}")  # fmt: skip


def store_runs(facts: Mapping[str, Mapping[str, Any]], store: str) -> str:
    """Every run of ``store`` (one per ``--counts``), as "classic store: 1, 2 targets measured ..., 4 targets ..."."""
    f = facts.get(store, {})
    runs = f.get("runs") or [f]
    parts = [(f"{', '.join(map(str, r['counts']))} target(s) " if r.get("counts") else "") + when(r) for r in runs]
    return f"{store} store: " + "; ".join(parts)
