"""Pure: compare every node's facts, decide, and render the report every node prints.

Node 0 calls :func:`decide`, publishes ``Verdict.to_json()``, and every node (node 0 included) renders the report
from the published JSON with :func:`render`, which is why every node prints exactly the same text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nodekit.launcher.contract import PREFLIGHT_OK
from nodekit.launcher.preflight.stack import StackReport

Severity = Literal["error", "note"]
Status = Literal["ok", "mismatch", "missing"]

# What must be identical, with the fix a user needs when it is not. Order is the report's column order.
_STACK_FIX = "build once and ship that image to every node: `nodekit build`, then `nodekit push`"
_LAUNCH_FIX = "write every node's compose file from the same nodekit.toml: `nodekit compose` on each node"
STACK_FIELDS: dict[str, str] = {
    "fingerprint": _STACK_FIX,
    "image_id": _STACK_FIX,
    "nodekit": _STACK_FIX,
    "python": _STACK_FIX,
    "torch": _STACK_FIX,
    "cuda": _STACK_FIX,
    "cudnn": _STACK_FIX,
    "nccl": _STACK_FIX,
    "driver": "install the same NVIDIA driver version on every node",
    "name": _LAUNCH_FIX,
    "mode": _LAUNCH_FIX,
    "nnodes": _LAUNCH_FIX,
    "world_size": _LAUNCH_FIX,
    "master_port": _LAUNCH_FIX,
}
# Legitimately different on heterogeneous nodes; notes instead of errors when the job says so.
HARDWARE_FIELDS: dict[str, str] = {
    "gpu_model": "set NODEKIT_ALLOW_HETEROGENEOUS_GPUS=1 if mixed GPUs are intended",
    "gpu_count": 'declare each node\'s GPUs in nodekit.toml: [nodes.<rank>] gpus = N (or nproc_per_node = "auto")',
    "nproc_per_node": "declare each node's count in nodekit.toml: [nodes.<rank>] nproc_per_node = N",
}
# Compared only among nodes that know it: an image id is absent when the container was started by hand.
_ONLY_WHERE_KNOWN = {"image_id"}


@dataclass(frozen=True)
class Difference:
    """One field that is not the same on every node, with each node's value."""

    field: str
    severity: Severity
    values: tuple[tuple[int, str], ...]  # (node rank, value), by rank
    fix: str

    def describe(self) -> str:
        """``torch: 2.13.0 on nodes 0, 2; 2.12.0 on node 1``"""
        groups: dict[str, list[int]] = {}
        for rank, value in self.values:
            groups.setdefault(value, []).append(rank)
        parts = []
        for value, ranks in groups.items():
            which = "node" if len(ranks) == 1 else "nodes"
            parts.append(f"{value or '-'} on {which} {', '.join(str(r) for r in ranks)}")
        return f"{self.field}: {'; '.join(parts)}"


@dataclass(frozen=True)
class Verdict:
    """Main's decision, as published to every node."""

    status: Status
    nnodes: int
    timeout_s: float
    main: str  # "addr:port" of the preflight store
    facts: tuple[StackReport, ...]
    missing: tuple[int, ...]
    duplicates: tuple[StackReport, ...]
    differences: tuple[Difference, ...]
    stopped_early: bool = False  # main stopped waiting at a mismatch, before the timeout
    run_id: str = ""  # chosen by main, new for every run: torchrun's c10d rendezvous id (launcher/plan.py)

    @property
    def arrived(self) -> tuple[int, ...]:
        return tuple(f.rank for f in self.facts)

    @property
    def errors(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.severity == "error")

    @property
    def notes(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.severity == "note")

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "status": self.status,
            "nnodes": self.nnodes,
            "timeout_s": self.timeout_s,
            "main": self.main,
            "facts": [f.to_json_dict() for f in self.facts],
            "missing": list(self.missing),
            "duplicates": [f.to_json_dict() for f in self.duplicates],
            "differences": [
                {"field": d.field, "severity": d.severity, "values": [list(v) for v in d.values], "fix": d.fix}
                for d in self.differences
            ],
            "stopped_early": self.stopped_early,
            "run_id": self.run_id,
        }
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Verdict:
        data = json.loads(text)
        return cls(
            status=data["status"],
            nnodes=int(data["nnodes"]),
            timeout_s=float(data["timeout_s"]),
            main=str(data["main"]),
            facts=tuple(StackReport.from_json_dict(f) for f in data["facts"]),
            missing=tuple(int(r) for r in data["missing"]),
            duplicates=tuple(StackReport.from_json_dict(f) for f in data["duplicates"]),
            differences=tuple(
                Difference(
                    field=d["field"],
                    severity=d["severity"],
                    values=tuple((int(r), str(v)) for r, v in d["values"]),
                    fix=d["fix"],
                )
                for d in data["differences"]
            ),
            stopped_early=bool(data.get("stopped_early", False)),
            run_id=str(data.get("run_id", "")),
        )


def _value(facts: StackReport, field: str) -> str:
    return str(getattr(facts, field))


@dataclass(frozen=True)
class Declared:
    """Per-node counts the shared nodekit.toml declares (``[nodes.R] nproc_per_node``, ``gpus``): a difference
    between nodes that every node's declaration explains is the job as configured, not a mismatch."""

    nproc: tuple[tuple[int, str], ...] = ()  # (rank, "2" or "auto") for every node
    gpus: tuple[tuple[int, int], ...] = ()  # (rank, count) where [nodes.R] gpus is set

    def unexplained(self, field: str, facts: Sequence[StackReport]) -> list[int]:
        """The ranks whose ``field`` (nproc_per_node or gpu_count) no declaration accounts for."""
        nproc, gpus = dict(self.nproc), dict(self.gpus)
        out = []
        for f in facts:
            if field == "nproc_per_node":
                ok = nproc.get(f.rank) in ("auto", str(f.nproc_per_node))
            else:
                # A node's GPU count is accounted for by its declared gpus, or by processes that follow its GPUs.
                ok = gpus.get(f.rank) == f.gpu_count if f.rank in gpus else nproc.get(f.rank) == "auto"
            if not ok:
                out.append(f.rank)
        return out


_DECLARABLE = {f: HARDWARE_FIELDS[f] for f in ("nproc_per_node", "gpu_count")}


def compare(
    facts: Sequence[StackReport], *, allow_heterogeneous_gpus: bool = False, declared: Declared | None = None
) -> list[Difference]:
    """Every field that differs between the nodes in ``facts``; an empty list means identical stacks.

    Stack and launch fields are always errors. GPU model, GPU count and processes per node are notes when
    ``allow_heterogeneous_gpus``, errors otherwise. With ``declared``, a differing process or GPU count that every
    node's declaration explains is a note, and one that some node's does not is an error naming those nodes.
    Identity fields (rank, hostname, address) are never compared.
    """
    ordered = sorted(facts, key=lambda f: f.rank)
    out: list[Difference] = []
    policies = [(f, "error", fix) for f, fix in STACK_FIELDS.items()]
    hw_severity = "note" if allow_heterogeneous_gpus else "error"
    policies += [(f, hw_severity, fix) for f, fix in HARDWARE_FIELDS.items()]
    for field, severity, fix in policies:
        values = tuple((f.rank, _value(f, field)) for f in ordered)
        known = [v for _, v in values if v] if field in _ONLY_WHERE_KNOWN else [v for _, v in values]
        if len(set(known)) > 1 and declared is not None and field in _DECLARABLE and not allow_heterogeneous_gpus:
            loose = declared.unexplained(field, ordered)
            severity = "error" if loose else "note"
            if loose:
                fix = f"not declared for node(s) {', '.join(map(str, loose))}: {_DECLARABLE[field]}"
            else:
                fix = "declared in nodekit.toml"
        if len(set(known)) > 1:
            out.append(
                Difference(field=field, severity="note" if severity == "note" else "error", values=values, fix=fix)
            )
    return out


def decide(
    facts: Sequence[StackReport],
    *,
    nnodes: int,
    timeout_s: float,
    main: str,
    duplicates: Sequence[StackReport] = (),
    allow_heterogeneous_gpus: bool = False,
    declared: Declared | None = None,
    stopped_early: bool = False,
    run_id: str = "",
) -> Verdict:
    """Main's verdict over the nodes that arrived. A stack/launch error or a rank claimed twice is ``mismatch``
    (it would fail even with every node present, so it wins); otherwise a node that never arrived is ``missing``."""
    ordered = tuple(sorted(facts, key=lambda f: f.rank))
    differences = tuple(compare(ordered, allow_heterogeneous_gpus=allow_heterogeneous_gpus, declared=declared))
    arrived = {f.rank for f in ordered}
    missing = tuple(r for r in range(nnodes) if r not in arrived)
    status: Status
    if duplicates or any(d.severity == "error" for d in differences):
        status = "mismatch"
    elif missing:
        status = "missing"
    else:
        status = "ok"
    return Verdict(
        status=status,
        nnodes=nnodes,
        timeout_s=timeout_s,
        main=main,
        facts=ordered,
        missing=missing,
        duplicates=tuple(duplicates),
        differences=differences,
        stopped_early=stopped_early,
        run_id=run_id,
    )


def _short(field: str, value: str) -> str:
    if field in ("fingerprint", "image_id") and len(value) > 12:
        return value.removeprefix("sha256:")[:12]
    return value or "-"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def missing_message(verdict: Verdict) -> str:
    """Which nodes arrived and which did not, and where to look. One line."""
    arrived = ", ".join(str(r) for r in verdict.arrived) or "none"
    missing = ", ".join(str(r) for r in verdict.missing)
    addr = verdict.main.rsplit(":", 1)[0]
    if verdict.stopped_early:
        return (
            f"{len(verdict.arrived)} of {verdict.nnodes} nodes had arrived when the mismatch above stopped the wait: "
            f"arrived {arrived}; not yet arrived {missing}"
        )
    return (
        f"only {len(verdict.arrived)} of {verdict.nnodes} nodes arrived within {verdict.timeout_s:g} s: "
        f"arrived {arrived}; missing {missing}. On each missing node: is its container running (`nodekit ps`), "
        f"and can it reach main {verdict.main} (`nodekit doctor --main {addr} --node-rank <rank>`)?"
    )


def render(verdict: Verdict) -> str:
    """The report, identical on every node: a headline, a table naming every node with every differing field,
    one line per difference with its fix, and the missing nodes. Pure; no trailing newline."""
    errors, notes = verdict.errors, verdict.notes
    n_arrived = len(verdict.facts)
    if verdict.status == "ok":
        head = f"{PREFLIGHT_OK}, {n_arrived}/{verdict.nnodes} nodes, identical stacks"
        if not notes:
            f0 = verdict.facts[0]
            cuda = f"cuda {f0.cuda}" if f0.cuda else "cpu"
            return (
                f"{head} (image {_short('fingerprint', f0.fingerprint)}, torch {f0.torch}, {cuda}, python {f0.python})"
            )
        head += f", {len(notes)} note(s)"
    elif verdict.status == "mismatch":
        head = (
            f"nodekit preflight: STACK MISMATCH, {len(errors) + len(verdict.duplicates)} error(s): "
            f"no node starts training (exit 17)"
        )
    else:
        head = (
            f"nodekit preflight: NODES MISSING, {n_arrived}/{verdict.nnodes} arrived: no node starts training (exit 18)"
        )
    shown = ["fingerprint"] + [d.field for d in verdict.differences if d.field != "fingerprint"]
    rows = [["node", "host", "address", *shown]]
    for f in verdict.facts:
        rows.append([str(f.rank), f.hostname, f.address, *(_short(c, _value(f, c)) for c in shown)])
    for f in verdict.duplicates:
        rows.append([f"{f.rank} (dup)", f.hostname, f.address, *(_short(c, _value(f, c)) for c in shown)])
    for r in verdict.missing:
        absent = "(not yet arrived)" if verdict.stopped_early else "(did not arrive)"
        rows.append([str(r), absent, "-", *("-" for _ in shown)])
    lines = [head, *_table(rows)]
    for d in verdict.differences:
        label = "error" if d.severity == "error" else "note "
        lines.append(f"  {label}  {d.describe()}")
        if d.severity == "error":
            lines.append(f"         fix: {d.fix}")
    for f in verdict.duplicates:
        first = next((g for g in verdict.facts if g.rank == f.rank), None)
        holder = f"{first.hostname} {first.address}" if first else "another node"
        lines.append(f"  error  node rank {f.rank} claimed twice: {holder} and {f.hostname} {f.address}")
        lines.append("         fix: give every node its own --node-rank (0..nnodes-1) in `nodekit compose`")
    if verdict.missing:
        lines.append(f"  missing  {missing_message(verdict)}")
    return "\n".join(lines)
