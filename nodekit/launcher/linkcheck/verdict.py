"""Pure: compare every pair's measured link with the others and with a declared floor, and render the matrix.

A pair's figure is the slower of its two directions. The reference is what the good pairs reach: the upper
quartile (nearest rank) of every pair's figure, so that one slow node (in ``n - 1`` of the ``n (n - 1) / 2`` pairs)
cannot drag it down while there are at least four nodes. A pair below ``SLOW_RATIO`` of the reference is *slow*; a
pair whose round trip is ``RTT_RATIO`` times the median and ``RTT_FLOOR_MS`` more is *late*. Both are warnings,
refusals with ``links = "refuse"``. A pair below the declared ``min_link_gbit`` and a pair that could not connect
refuse in either mode: the first is what the job declared it needs, the second is what gloo and NCCL need too.
A node that is in every flagged pair while other pairs are fine is named as the likely cause. Above
``rounds.ALL_PAIRS_MAX`` nodes the pairs are a sample (``rounds.py``), and :func:`narrow` plans the re-tests that
put a suspect node in a pair with a known-good one, so that the same rule tells a node from a pair.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from nodekit.launcher.contract import EXIT_LINK
from nodekit.launcher.linkcheck.rounds import Round, narrowing, sampled

SLOW_RATIO = 0.25
RTT_RATIO, RTT_FLOOR_MS = 4.0, 5.0  # a loaded 2-core machine stalls a ping by a millisecond or two
Kind = Literal["unreachable", "below_floor", "slow", "late"]
Mode = Literal["warn", "refuse", "off"]


@dataclass(frozen=True)
class Endpoint:
    """Where one node listens for the check: its address and interface toward main (the ones training uses)."""

    rank: int
    host: str
    addr: str
    iface: str
    port: int

    def describe(self) -> str:
        return f"node {self.rank} ({self.host}, {self.addr}, {self.iface or '?'})"


@dataclass(frozen=True)
class Transfer:
    """One direction of a pair, as its receiver counted it: bytes between the first and the last byte."""

    bytes: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def gbit(self) -> float | None:
        if self.error or self.seconds <= 0 or self.bytes <= 0:
            return None
        return self.bytes * 8 / self.seconds / 1e9


@dataclass(frozen=True)
class Pair:
    """One pair's measurement: ``a < b``; ``ab`` is a's traffic to b. ``error``: no connection at all."""

    a: int
    b: int
    ab: Transfer
    ba: Transfer
    rtt_ms: float | None = None  # the path's: the ends' hold taken out (probe.py)
    error: str = ""
    read_rtt_ms: float | None = None  # as the two processes read it, their waits for a core included

    @property
    def gbit(self) -> float | None:
        known = [g for g in (self.ab.gbit, self.ba.gbit) if g is not None]
        return min(known) if known and not self.error else None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> Pair:
        return cls(
            a=int(data["a"]),
            b=int(data["b"]),
            ab=Transfer(**data["ab"]),
            ba=Transfer(**data["ba"]),
            rtt_ms=None if data.get("rtt_ms") is None else float(data["rtt_ms"]),
            read_rtt_ms=None if data.get("read_rtt_ms") is None else float(data["read_rtt_ms"]),
            error=str(data.get("error", "")),
        )


@dataclass(frozen=True)
class Finding:
    kind: Kind
    a: int
    b: int
    refuse: bool
    text: str


@dataclass(frozen=True)
class LinkVerdict:
    """Main's decision, published to every node as JSON."""

    endpoints: tuple[Endpoint, ...]
    pairs: tuple[Pair, ...]
    findings: tuple[Finding, ...]
    suspects: tuple[int, ...]
    reference_gbit: float | None
    median_rtt_ms: float | None
    min_gbit: float | None
    mode: str
    seconds: float
    took_s: float = 0.0

    @property
    def refused(self) -> bool:
        return any(f.refuse for f in self.findings)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> LinkVerdict:
        d = json.loads(text)
        return cls(
            endpoints=tuple(Endpoint(**e) for e in d["endpoints"]),
            pairs=tuple(Pair.from_json_dict(p) for p in d["pairs"]),
            findings=tuple(Finding(**f) for f in d["findings"]),
            suspects=tuple(int(r) for r in d["suspects"]),
            reference_gbit=d["reference_gbit"],
            median_rtt_ms=d["median_rtt_ms"],
            min_gbit=d["min_gbit"],
            mode=str(d["mode"]),
            seconds=float(d["seconds"]),
            took_s=float(d.get("took_s", 0.0)),
        )


def upper_quartile(values: Sequence[float]) -> float:
    """The nearest-rank 75th percentile: the smallest value at least three quarters of ``values`` do not exceed."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.75 * len(ordered)) - 1)]


def _figures(p: Pair) -> str:
    ab, ba = p.ab.gbit, p.ba.gbit
    rtt = f", rtt {p.rtt_ms:.2f} ms" if p.rtt_ms is not None else ""
    if p.rtt_ms is not None and p.read_rtt_ms is not None and p.read_rtt_ms - p.rtt_ms >= RTT_FLOOR_MS:
        rtt += f" ({p.read_rtt_ms:.2f} ms as its ends read it: they waited for a core)"
    return f"{_g(ab)} Gbit/s {p.a}->{p.b}, {_g(ba)} Gbit/s {p.b}->{p.a}{rtt}"


def _g(gbit: float | None) -> str:
    if gbit is None:
        return "-"
    return f"{gbit:.2f}" if gbit < 10 else f"{gbit:.1f}"


def decide(
    endpoints: Sequence[Endpoint],
    pairs: Sequence[Pair],
    *,
    mode: Mode = "warn",
    min_gbit: float | None = None,
    seconds: float = 0.0,
    took_s: float = 0.0,
) -> LinkVerdict:
    """The verdict over every measured pair (see the module docstring for the rules)."""
    ends = {e.rank: e for e in endpoints}
    ordered = sorted(pairs, key=lambda p: (p.a, p.b))
    gbits = [g for p in ordered if (g := p.gbit) is not None]
    rtts = [p.rtt_ms for p in ordered if p.rtt_ms is not None and not p.error]
    ref = upper_quartile(gbits) if len(gbits) >= 3 else None
    med_rtt = statistics.median(rtts) if len(rtts) >= 3 else None
    findings: list[Finding] = []
    for p in ordered:
        where = f"{ends[p.a].describe()} <-> {ends[p.b].describe()}" if p.a in ends and p.b in ends else f"{p.a}-{p.b}"
        g = p.gbit
        if p.error or g is None:
            why = p.error or p.ab.error or p.ba.error or "nothing measured"
            findings.append(Finding("unreachable", p.a, p.b, True, f"{where}: no transfer ({why})"))
            continue
        if min_gbit is not None and g < min_gbit:
            text = f"{where}: {_figures(p)}, below min_link_gbit = {min_gbit:g}"
            findings.append(Finding("below_floor", p.a, p.b, True, text))
        elif ref is not None and g < SLOW_RATIO * ref:
            text = f"{where}: {_figures(p)}, under {SLOW_RATIO:g} x the others' {_g(ref)} Gbit/s"
            findings.append(Finding("slow", p.a, p.b, mode == "refuse", text))
        elif med_rtt is not None and (p.rtt_ms or 0) > max(RTT_RATIO * med_rtt, med_rtt + RTT_FLOOR_MS):
            text = f"{where}: {_figures(p)}, round trip over {RTT_RATIO:g} x the others' {med_rtt:.2f} ms"
            findings.append(Finding("late", p.a, p.b, mode == "refuse", text))
    return LinkVerdict(
        endpoints=tuple(sorted(endpoints, key=lambda e: e.rank)),
        pairs=tuple(ordered),
        findings=tuple(findings),
        suspects=suspects(len(endpoints), ordered, findings),
        reference_gbit=ref,
        median_rtt_ms=med_rtt,
        min_gbit=min_gbit,
        mode=mode,
        seconds=seconds,
        took_s=took_s,
    )


def suspects(n: int, pairs: Sequence[Pair], findings: Sequence[Finding]) -> tuple[int, ...]:
    """Nodes in every flagged pair of theirs, while some pair without them is fine: the likely causes. Needs three
    nodes (with two, the one pair cannot tell its ends apart)."""
    flagged = {(f.a, f.b) for f in findings}
    if n < 3 or not flagged or len(flagged) == len(pairs):
        return ()
    mine: dict[int, list[tuple[int, int]]] = {}
    for p in pairs:
        mine.setdefault(p.a, []).append((p.a, p.b))
        mine.setdefault(p.b, []).append((p.a, p.b))
    return tuple(r for r in range(n) if mine.get(r) and all(pair in flagged for pair in mine[r]))


def narrow(
    endpoints: Sequence[Endpoint], pairs: Sequence[Pair], *, mode: Mode = "warn", min_gbit: float | None = None
) -> list[Round]:
    """The narrowing rounds after a sampled survey: every node of a pair the survey's verdict names (by the same
    rules as the final one) against a known-good node it has not met (``rounds.narrowing``)."""
    flagged = {(f.a, f.b) for f in decide(endpoints, pairs, mode=mode, min_gbit=min_gbit).findings}
    return narrowing(len(endpoints), [(p.a, p.b) for p in pairs], flagged)


# A pair named slow or late can also be a host whose cores are all taken: its processes wait for the scheduler at
# each wake-up and get a share of a core. 8 nodes on loopback, each with one busy process in a cpu cgroup of its own
# (as containers sharing cores are), named 5 or 6 pairs a check (late and slow) where the same load without the
# cgroups named none (benchmarks/link_bench.py part 3, docs/benchmarks.md).
BUSY_HOST = "; a slow or late pair can also be a host whose cores are all taken: `top` on both ends"


def fix_for(verdict: LinkVerdict) -> str:
    """What to do, in one line, for the verdict's findings."""
    kinds = {f.kind for f in verdict.findings}
    return _fix(verdict, kinds) + (BUSY_HOST if kinds & {"slow", "late"} else "")


def _fix(verdict: LinkVerdict, kinds: set[Kind]) -> str:
    ends = {e.rank: e for e in verdict.endpoints}
    if verdict.suspects:
        parts = []
        for r in verdict.suspects:
            e = ends.get(r)
            iface = e.iface if e and e.iface else "<iface>"
            host = e.host if e else f"node {r}"
            parts.append(
                f"on {host}: `ethtool {iface}` (speed, duplex), `ip -s link show {iface}` (errors, drops), "
                f"`tc qdisc show dev {iface}` (a shaper), its cable and switch port"
            )
        return "; ".join(parts) + "; or leave the node out (hosts, min_nodes); `nodekit doctor --fleet` measures again"
    if kinds == {"unreachable"}:
        return (
            "allow TCP between the nodes on the training interface (gloo and NCCL connect on ports other than "
            "master_port too); `nodekit doctor --fleet` measures again"
        )
    floor = " or lower [health] min_link_gbit;" if "below_floor" in kinds else ""
    return (
        "check both ends of each named pair (`ethtool`, `ip -s link`) and the switch path between them;"
        f"{floor} `nodekit doctor --fleet` measures again"
    )


def render(verdict: LinkVerdict, *, matrix: bool, started: bool = False) -> str:
    """The report: a headline, the findings with the fix, and (``matrix``) every pair's figures. No trailing
    newline. Every node prints the headline and findings; node 0 (and ``nodekit doctor --fleet``) the matrix.
    ``started``: the check ran beside the job's start, which a refusal now stops."""
    n = len(verdict.endpoints)
    ref = f", pairs reach {_g(verdict.reference_gbit)} Gbit/s" if verdict.reference_gbit is not None else ""
    how = f"{len(verdict.pairs)} pair(s), up to {verdict.seconds:g} s each way, {verdict.took_s:.1f} s"
    if not verdict.findings:
        head = f"nodekit link check: ok, {n} nodes, {how}{ref}"
        if len(verdict.pairs) == 1:
            head += f" ({_figures(verdict.pairs[0])})"
    elif verdict.refused:
        named = len(verdict.findings)
        then = "every node stops its job" if started else "no node starts training"
        head = f"nodekit link check: REFUSED, {named} pair(s) named: {then} (exit {EXIT_LINK})"
    else:
        then = "training goes on" if started else "training starts"
        head = f"nodekit link check: WARNING, {len(verdict.findings)} pair(s) named ({how}{ref}); {then}"
    lines = [head]
    ends = {e.rank: e for e in verdict.endpoints}
    for r in verdict.suspects:
        lines.append(f"  likely cause: {ends[r].describe()} is in every named pair of its own")
    for f in verdict.findings:
        label = "refuse" if f.refuse else "warn  "
        lines.append(f"  {label} {f.text}")
    if verdict.findings:
        lines.append(f"  fix: {fix_for(verdict)}")
    if matrix and n > 1:
        lines += _sample(verdict) if sampled(n) else _matrix(verdict)
    return "\n".join(lines)


def _sample(verdict: LinkVerdict) -> list[str]:
    """In place of a matrix of ``n`` x ``n`` cells for a sampled check: what was measured, and the spread."""
    n = len(verdict.endpoints)
    met: dict[int, int] = dict.fromkeys((e.rank for e in verdict.endpoints), 0)
    for p in verdict.pairs:
        met[p.a] = met.get(p.a, 0) + 1
        met[p.b] = met.get(p.b, 0) + 1
    gbits = sorted(g for p in verdict.pairs if (g := p.gbit) is not None)
    spread = f"; pairs {_g(gbits[0])} to {_g(gbits[-1])} Gbit/s, median {_g(statistics.median(gbits))}" if gbits else ""
    again = ", the nodes of named pairs again against a good node" if verdict.findings else ""
    return [
        f"  a sample of {len(verdict.pairs):,} of the {n * (n - 1) // 2:,} pairs: every node against "
        f"{min(met.values())} to {max(met.values())} others{again}{spread}"
    ]


def _matrix(verdict: LinkVerdict) -> list[str]:
    """Gbit/s from row to column, then each pair's round trip, then who is who."""
    ranks = [e.rank for e in verdict.endpoints]
    gbit: dict[tuple[int, int], float | None] = {}
    rtt: dict[tuple[int, int], float | None] = {}
    for p in verdict.pairs:
        gbit[(p.a, p.b)], gbit[(p.b, p.a)] = p.ab.gbit, p.ba.gbit
        rtt[(p.a, p.b)] = rtt[(p.b, p.a)] = p.rtt_ms
    flagged = {(f.a, f.b) for f in verdict.findings} | {(f.b, f.a) for f in verdict.findings}

    def cell(src: int, dst: int, table: dict[tuple[int, int], float | None], fmt: str) -> str:
        if src == dst:
            return "."
        value = table.get((src, dst))
        text = "-" if value is None else format(value, fmt)
        return text + ("*" if (src, dst) in flagged else "")

    width = max(6, *(len(cell(a, b, gbit, ".2f")) for a in ranks for b in ranks))
    head = "  " + "Gbit/s".ljust(10) + "".join(f"to {r}".rjust(width + 1) for r in ranks)
    out = [head]
    for a in ranks:
        out.append("  " + f"from {a}".ljust(10) + "".join(cell(a, b, gbit, ".2f").rjust(width + 1) for b in ranks))
    out.append("  " + "rtt ms".ljust(10) + "".join(f"{r}".rjust(width + 1) for r in ranks))
    for a in ranks:
        out.append("  " + f"{a}".ljust(10) + "".join(cell(a, b, rtt, ".3f").rjust(width + 1) for b in ranks))
    out += [f"  {e.describe()} port {e.port}" for e in verdict.endpoints]
    if verdict.findings:
        out.append("  * a named pair")
    return out
