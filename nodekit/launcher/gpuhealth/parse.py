"""Pure parsers for what the GPU tools print: ``nvidia-smi -q``, the kernel log's Xid lines, ``dcgmi diag``.

``nvidia-smi -q`` is read rather than ``--query-gpu``: a query naming one field the installed driver does not know
fails as a whole ("Field ... is not a valid field to query"), while ``-q`` prints what the driver has, under names
that changed only slightly between drivers (``Clocks Throttle Reasons`` became ``Clocks Event Reasons``, ``Pending
Page Blacklist`` became ``Pending Page Retirement``). Every parser here accepts partial text (an excerpt, a tool
that died half-way) and returns what it could read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_KV = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
_BUS = r"[0-9A-Fa-f]{3,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]"
_GPU_HEADER = re.compile(rf"^GPU ({_BUS})\s*$")
_UNREACHABLE = re.compile(rf"Unable to determine the device handle for (?:GPU\s*)?({_BUS}):\s*(.*)")
# Reasons that slow the clocks because something is wrong now: heat, an external power brake, the HW slowdown
# they cause. SW Power Cap is a note: under load it is normal operation.
HOT_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")
NOTE_REASONS = ("SW Power Cap",)


@dataclass
class SmiGpu:
    """One GPU section of ``nvidia-smi -q``; None where the output did not say (N/A, an excerpt)."""

    index: int
    bus_id: str
    product: str = ""
    volatile_uncorrectable: int | None = None
    aggregate_uncorrectable: int | None = None
    retirement_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_uncorrectable: int | None = None
    reset_required: bool | None = None
    throttle: list[str] = field(default_factory=list)


@dataclass
class SmiReport:
    attached: int | None = None
    driver: str = ""
    gpus: list[SmiGpu] = field(default_factory=list)
    unreachable: list[tuple[str, str]] = field(default_factory=list)  # (bus id, nvidia-smi's reason)
    no_devices: bool = False


def _number(value: str) -> int | None:
    return int(value) if value.strip().isdigit() else None


def _yes(value: str) -> bool | None:
    v = value.strip().lower()
    return True if v == "yes" else False if v == "no" else None


def _add(old: int | None, value: str) -> int | None:
    n = _number(value)
    if n is None:
        return old
    return n + (old or 0)


def _apply(gpu: SmiGpu, path: tuple[str, ...], key: str, value: str) -> None:
    """One ``key : value`` of a GPU section, ``path`` being the sections above it (lowercase)."""
    k = key.lower()
    where = set(path)
    if not path and k == "product name":
        gpu.product = value
    elif "ecc errors" in where and ("uncorrectable" in k or "double bit" in where):
        # Ampere and later: "DRAM Uncorrectable", "SRAM Uncorrectable ..."; before: a "Double Bit" block whose
        # "Total" is the sum of its lines (count only that, not the lines and their total).
        if "double bit" in where and k != "total":
            return
        if "volatile" in where:
            gpu.volatile_uncorrectable = _add(gpu.volatile_uncorrectable, value)
        elif "aggregate" in where:
            gpu.aggregate_uncorrectable = _add(gpu.aggregate_uncorrectable, value)
    elif "retired pages" in where and k.startswith("pending"):
        gpu.retirement_pending = _yes(value)
    elif "remapped rows" in where and "histogram" not in " ".join(path):
        if k == "pending":
            gpu.remap_pending = _yes(value)
        elif k.startswith("remapping failure"):
            gpu.remap_failure = _yes(value)
        elif k == "uncorrectable error":
            gpu.remap_uncorrectable = _number(value)
    elif "gpu reset status" in where and k in ("reset required", "drain and reset recommended"):
        if _yes(value):
            gpu.reset_required = True
        elif gpu.reset_required is None:
            gpu.reset_required = _yes(value)
    elif path and path[0] in ("clocks throttle reasons", "clocks event reasons") and value.lower() == "active":
        gpu.throttle.append(key)


def parse_smi_q(text: str) -> SmiReport:
    """``nvidia-smi -q`` (whole, or any ``-d`` selection, or an excerpt) into a report.

    GPU sections start with ``GPU <bus id>``; their index is their order, as nvidia-smi numbers them. An excerpt
    of one GPU without the log's head or a GPU header is read as one GPU of index 0 and unknown bus.
    """
    report = SmiReport()
    gpu: SmiGpu | None = None
    stack: list[tuple[int, str]] = []
    preamble = False  # the log's head was read: what precedes the first GPU header is not a GPU's
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith(("=", "[...]")):
            continue
        head = _GPU_HEADER.match(line.strip()) if not line.startswith(" ") else None
        if head:
            gpu = SmiGpu(index=len(report.gpus), bus_id=head.group(1))
            report.gpus.append(gpu)
            stack = []
            continue
        lost = _UNREACHABLE.search(line)
        if lost:
            report.unreachable.append((lost.group(1), lost.group(2).strip()))
            continue
        if "No devices were found" in line:
            report.no_devices = True
            continue
        indent = len(line) - len(line.lstrip())
        m = _KV.match(line)
        if gpu is None and indent == 0 and m:
            key, value = m.group(2).strip(), m.group(3)
            if key == "Attached GPUs":
                report.attached = _number(value)
            elif key == "Driver Version":
                report.driver = value
            preamble = True
            continue
        if gpu is None and preamble:
            continue  # a section of the log's head (vGPU Driver Capability), before the first GPU
        if gpu is None:
            gpu = SmiGpu(index=0, bus_id="")
            report.gpus.append(gpu)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if m:
            _apply(gpu, tuple(name for _, name in stack), m.group(2).strip(), m.group(3))
        else:
            stack.append((indent, line.strip().lower()))
    return report


@dataclass(frozen=True)
class Xid:
    """One Xid event from the kernel log: the GPU's PCI address as the driver writes it, the code, the text."""

    pci: str
    code: int
    text: str


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")
_FELL = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+)")


def parse_xids(log: str) -> list[Xid]:
    """The Xid events in ``dmesg`` or journal text, plus the driver's "fallen off the bus" notice as Xid 79 (it is
    printed without an Xid when the GPU falls off during the driver's probe)."""
    out: list[Xid] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = _XID.search(line)
        if m:
            text = re.sub(r"^pid=[^,]*,\s*(name=[^,]*,\s*)?", "", m.group(3)).strip()
            out.append(Xid(m.group(1).lower(), int(m.group(2)), text))
            continue
        fell = _FELL.search(line)
        if fell and "fallen off the bus" in " ".join(lines[i : i + 3]):
            pci = fell.group(1).lower()
            if not any(x.code == 79 and same_gpu(x.pci, pci) for x in out):
                out.append(Xid(pci, 79, "GPU has fallen off the bus"))
    return out


def same_gpu(pci: str, bus_id: str) -> bool:
    """Whether a kernel log's PCI address (``0000:10:1c``, or ``0000:b3:00.0``) and an nvidia-smi bus id
    (``00000000:10:1C.0``) name the same GPU: bus and device compared, domain width and function ignored."""

    def bus_dev(s: str) -> tuple[str, str]:
        parts = s.lower().split(".")[0].split(":")
        return (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")

    return bool(pci and bus_id) and bus_dev(pci) == bus_dev(bus_id)


@dataclass(frozen=True)
class DiagRow:
    """One row of ``dcgmi diag``'s table: a test and its result, or an ``Error``/``Warning`` row's text."""

    name: str
    result: str


def parse_dcgmi_diag(text: str) -> list[DiagRow]:
    """The rows of ``dcgmi diag -r N``'s table (``| name | result |``), continuation lines joined to their row.
    Section rows (``|----- Deployment ---...``) are skipped."""
    rows: list[DiagRow] = []
    for line in text.splitlines():
        s = line.strip()
        if not (s.startswith("|") and s.endswith("|")) or set(s) <= set("|-=+ "):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if len(cells) < 2 or cells[0].startswith("-"):
            continue
        name, result = cells[0], " ".join(cells[1:]).strip()
        if name in ("Diagnostic", "Diagnostic Result"):  # the header
            continue
        if not name and rows:
            last = rows[-1]
            rows[-1] = DiagRow(last.name, f"{last.result} {result}".strip())
        elif name:
            rows.append(DiagRow(name, result))
    return rows
