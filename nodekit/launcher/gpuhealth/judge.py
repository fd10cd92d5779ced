"""Pure: what the GPU tools said, judged per GPU into findings with the fix, and the report every node prints.

A finding is *sick* (the GPU would fail or slow the job: lost, missing, uncorrectable memory errors, a memory
repair waiting for a reset, clocks slowed by heat or a power brake, a serious Xid, a failed DCGM test) or a *note*
(worth knowing, not a reason to stop: an application Xid, a software power cap, a DCGM warning). With ``gpus =
"refuse"`` a sick GPU on any node stops every node before a worker starts (exit 21); with ``"warn"`` the report is
printed and training starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from nodekit.launcher.contract import EXIT_GPU
from nodekit.launcher.gpuhealth.parse import HOT_REASONS, NOTE_REASONS, DiagRow, SmiReport, Xid, same_gpu

# Xid codes (NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors) that mean the hardware, not the program.
XID_SICK = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "row remapper or page retirement failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
_RESET = "reset the GPU (`nvidia-smi -r -i {i}` with nothing running on it) or reboot the node"
_REPLACE = "; if it comes back after that, drain the node and have the GPU replaced"
_XID_FIX = {
    79: "reboot the node and reseat the GPU and its power" + _REPLACE,
    74: "`nvidia-smi nvlink -s -i {i}` for the link's state; " + _RESET + _REPLACE,
    119: "reboot the node (the GPU's firmware stopped answering); update the driver if it recurs",
    120: "reboot the node (the GPU's firmware stopped answering); update the driver if it recurs",
}


@dataclass(frozen=True)
class GpuFinding:
    gpu: str  # "GPU 3 (00000000:10:1C.0)", or "" for the node as a whole
    what: str
    fix: str
    sick: bool


@dataclass(frozen=True)
class NodeHealth:
    """One node's findings, shared through the preflight store. ``checked``: what ran (and what could not)."""

    rank: int
    host: str
    gpus: int
    checked: tuple[str, ...] = ()
    findings: tuple[GpuFinding, ...] = ()

    @property
    def sick(self) -> bool:
        return any(f.sick for f in self.findings)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeHealth:
        d = json.loads(text)
        return cls(
            rank=int(d["rank"]),
            host=str(d["host"]),
            gpus=int(d["gpus"]),
            checked=tuple(d["checked"]),
            findings=tuple(GpuFinding(**f) for f in d["findings"]),
        )


def _label(index: int, bus_id: str, product: str = "") -> str:
    inside = ", ".join(p for p in (bus_id, product) if p)
    return f"GPU {index} ({inside})" if inside else f"GPU {index}"


def _smi(report: SmiReport, expected: tuple[int, str] | None) -> list[GpuFinding]:
    out: list[GpuFinding] = []
    for bus, reason in report.unreachable:
        out.append(
            GpuFinding(
                f"GPU at {bus}",
                f"nvidia-smi cannot reach it ({reason}): the GPU is lost",
                "reboot the node (a lost GPU rarely comes back with a reset)" + _REPLACE,
                True,
            )
        )
    seen = max(len(report.gpus), report.attached or 0)
    if expected is not None and seen < expected[0]:
        count, source = expected
        out.append(
            GpuFinding(
                "",
                f"{seen} GPU(s) visible, {count} {source}",
                f"`nvidia-smi -L` on the node: a GPU missing from the bus needs a reboot{_REPLACE}; if the node has "
                f"{seen}, declare that",
                True,
            )
        )
    for g in report.gpus:
        label = _label(g.index, g.bus_id, g.product)
        reset = _RESET.format(i=g.index)
        if g.volatile_uncorrectable:
            out.append(
                GpuFinding(
                    label,
                    f"{g.volatile_uncorrectable} uncorrectable ECC error(s) since the driver loaded",
                    reset + _REPLACE,
                    True,
                )
            )
        if g.remap_failure:
            out.append(
                GpuFinding(
                    label,
                    "row remapping failed: the memory can no longer repair itself",
                    "drain the node: the GPU meets NVIDIA's replacement criterion (confirm with the field diagnostic)",
                    True,
                )
            )
        elif g.remap_pending:
            rows = f" ({g.remap_uncorrectable} uncorrectable row(s))" if g.remap_uncorrectable else ""
            out.append(
                GpuFinding(
                    label, f"row remapping pending{rows}: the repair takes effect at the next reset", reset, True
                )
            )
        if g.retirement_pending:
            out.append(
                GpuFinding(label, "page retirement pending: the bad pages are retired at the next reset", reset, True)
            )
        if g.reset_required and not (g.remap_pending or g.retirement_pending):
            out.append(GpuFinding(label, "the driver asks for a GPU reset", reset, True))
        hot = [r for r in g.throttle if r in HOT_REASONS]
        if hot:
            out.append(
                GpuFinding(
                    label,
                    f"clocks slowed now by {', '.join(hot)}",
                    "heat: fans, airflow, inlet temperature; power brake: the power supply, its cabling, or a BMC that "
                    f"does not know this GPU; `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {g.index}`",
                    True,
                )
            )
        capped = [r for r in g.throttle if r in NOTE_REASONS]
        if capped:
            out.append(
                GpuFinding(
                    label,
                    f"clocks held by {', '.join(capped)} while idle",
                    f"`nvidia-smi -q -d POWER -i {g.index}`: is the power limit lowered?",
                    False,
                )
            )
    return out


def _xids(xids: Sequence[Xid], report: SmiReport | None) -> list[GpuFinding]:
    counted: dict[tuple[str, int], tuple[Xid, int]] = {}
    for x in xids:
        first, n = counted.get((x.pci, x.code), (x, 0))
        counted[(x.pci, x.code)] = (first, n + 1)
    out = []
    for (pci, code), (x, n) in counted.items():
        gpu = next((g for g in (report.gpus if report else []) if same_gpu(pci, g.bus_id)), None)
        label = _label(gpu.index, gpu.bus_id, gpu.product) if gpu else f"GPU at PCI {pci}"
        index = str(gpu.index) if gpu else "<index>"
        times = f" ({n} times)" if n > 1 else ""
        what = f"Xid {code}{times} in the kernel log since boot: {XID_SICK.get(code, x.text)}"
        if code in XID_SICK:
            fix = _XID_FIX.get(code, _RESET + _REPLACE).format(i=index)
            out.append(GpuFinding(label, what, fix, True))
        else:
            out.append(
                GpuFinding(label, what, "usually the program that ran, not the GPU (NVIDIA's Xid catalog)", False)
            )
    return out


def _diag(rows: Sequence[DiagRow], level: int) -> list[GpuFinding]:
    out = []
    for row in rows:
        result = row.result.lower()
        failed = row.name == "Error" or result.startswith("fail")
        warned = row.name == "Warning" or result.startswith("warn")
        if not (failed or warned):
            continue
        m = re.search(r"GPU:?\s*(\d+)", row.result)
        label = f"GPU {m.group(1)}" if m else ""
        what = (
            f"dcgmi diag -r {level}: {row.result}"
            if row.name in ("Error", "Warning")
            else (f"dcgmi diag -r {level}: {row.name}: {row.result}")
        )
        fix = "`dcgmi diag -r 3` on the node for detail; drain it until the test passes"
        out.append(GpuFinding(label, what, fix if failed else "see DCGM's message", failed))
    return out


def judge(
    rank: int,
    host: str,
    smi: SmiReport | None,
    *,
    xids: Sequence[Xid] = (),
    diag: Sequence[DiagRow] = (),
    diag_level: int = 1,
    expected: tuple[int, str] | None = None,
    checked: Sequence[str] = (),
) -> NodeHealth:
    """One node's findings from what its tools printed (None: no nvidia-smi). ``expected``: the GPU count the node
    should have and where that comes from ("declared in [nodes.1] gpus", "allocated by Slurm")."""
    findings: list[GpuFinding] = []
    if smi is None and expected is not None and expected[0] > 0:
        findings.append(
            GpuFinding(
                "",
                f"no nvidia-smi in the container, {expected[0]} GPU(s) {expected[1]}",
                "run the image with the NVIDIA container toolkit (`nodekit doctor`)",
                True,
            )
        )
    if smi is not None:
        findings += _smi(smi, expected)
    findings += _xids(xids, smi)
    findings += _diag(diag, diag_level)
    gpus = max(len(smi.gpus), smi.attached or 0) if smi is not None else 0
    return NodeHealth(rank=rank, host=host, gpus=gpus, checked=tuple(checked), findings=tuple(findings))


def render(nodes: Sequence[NodeHealth], *, refuse: bool) -> str:
    """The report every node prints ("" when no node has a GPU or a finding)."""
    ordered = sorted(nodes, key=lambda n: n.rank)
    total = sum(n.gpus for n in ordered)
    findings = [(n, f) for n in ordered for f in n.findings]
    if total == 0 and not findings:
        return ""
    checked = sorted({c for n in ordered for c in n.checked})
    how = f"{len(ordered)} node(s), {total} GPU(s); {', '.join(checked) or 'nothing could run'}"
    sick = sorted({n.rank for n, f in findings if f.sick})
    if not sick:
        head = f"nodekit gpu health: ok, {how}" + (f", {len(findings)} note(s)" if findings else "")
    elif refuse:
        head = (
            f"nodekit gpu health: SICK GPU on node(s) {', '.join(map(str, sick))}: no node starts training "
            f"(exit {EXIT_GPU})"
        )
    else:
        head = f"nodekit gpu health: WARNING, sick GPU on node(s) {', '.join(map(str, sick))} ({how}); training starts"
    lines = [head]
    for n, f in findings:
        where = f"node {n.rank} ({n.host})" + (f" {f.gpu}" if f.gpu else "")
        lines.append(f"  {'sick' if f.sick else 'note'}  {where}: {f.what}")
        if f.sick:
            lines.append(f"        fix: {f.fix}")
    return "\n".join(lines)
