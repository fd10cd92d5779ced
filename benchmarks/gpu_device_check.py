"""The GPU health check on a real GPU machine (issue 30): the device check of docs/benchmarks.md.

Run from the repository root on a machine with NVIDIA GPUs (no virtual environment needed: the launcher's code is
standard library only):

    python3 benchmarks/gpu_device_check.py --out "$OUT"

It runs what each node's launcher runs before a job (``nvidia-smi -q``, the kernel log, ``dcgmi diag -r 1`` where
installed) through the launcher's own code, prints the report and each tool's time, and cross-checks the parser
against nvidia-smi's own CSV query of the same facts (GPU count and bus ids; uncorrectable volatile ECC, pending
page retirement and row remapping where the GPU reports them). Exit 0 when they agree. Every raw output is saved
under ``--out`` (a new fixture for tests/unit/launcher/fixtures/gpu, with the machine it came from).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodekit.launcher.gpuhealth.gather import DIAG_TIMEOUT_S, SMI_TIMEOUT_S, run_tool
from nodekit.launcher.gpuhealth.judge import judge, render
from nodekit.launcher.gpuhealth.parse import parse_dcgmi_diag, parse_smi_q, parse_xids

QUERY = "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending"


def timed(argv: list[str], timeout: float) -> tuple[tuple[int, str] | None, float]:
    t = time.monotonic()
    got = run_tool(argv, timeout)
    return got, time.monotonic() - t


def csv_facts(text: str) -> list[dict[str, str]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 5:
            rows.append(dict(zip(("index", "bus", "ecc", "retired", "remap"), cells, strict=True)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-device-check"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    smi, t_smi = timed(["nvidia-smi", "-q"], SMI_TIMEOUT_S)
    if smi is None:
        print("no nvidia-smi on this machine: nothing to check")
        return 2
    (args.out / "nvidia-smi-q.txt").write_text(smi[1])
    log, t_log = timed(["dmesg"], 10.0)
    if log is not None:
        (args.out / "dmesg-nvrm.txt").write_text("\n".join(ln for ln in log[1].splitlines() if "NVRM" in ln) + "\n")
    diag, t_diag = timed(["dcgmi", "diag", "-r", "1"], DIAG_TIMEOUT_S)
    if diag is not None:
        (args.out / "dcgmi-diag-r1.txt").write_text(diag[1])
    query, _ = timed(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"], SMI_TIMEOUT_S)
    if query is not None:
        (args.out / "nvidia-smi-query.csv").write_text(query[1])

    report = parse_smi_q(smi[1])
    xids = parse_xids(log[1]) if log is not None and log[0] == 0 else []
    rows = parse_dcgmi_diag(diag[1]) if diag is not None else []
    node = judge(0, platform.node(), report, xids=xids, diag=rows, checked=["nvidia-smi -q", "dmesg", "dcgmi"])
    print(render([node], refuse=False) or "no GPU found by nvidia-smi -q")
    print(f"times: nvidia-smi -q {t_smi:.2f} s, dmesg {t_log:.2f} s, dcgmi diag -r 1 {t_diag:.1f} s"
          + ("" if diag is not None else " (not installed)"))  # fmt: skip

    problems = []
    facts = csv_facts(query[1]) if query is not None and query[0] == 0 else []
    if facts:
        if len(facts) != len(report.gpus):
            problems.append(f"-q has {len(report.gpus)} GPU sections, the query {len(facts)} GPUs")
        for row, gpu in zip(facts, report.gpus, strict=False):
            if row["bus"].upper() != gpu.bus_id.upper():
                problems.append(f"GPU {row['index']}: bus {row['bus']} in the query, {gpu.bus_id} in -q")
            known = row["ecc"].isdigit() and gpu.volatile_uncorrectable is not None
            if known and int(row["ecc"]) != gpu.volatile_uncorrectable:
                problems.append(f"GPU {row['index']}: ECC {row['ecc']} vs {gpu.volatile_uncorrectable}")
            for key, mine in (("retired", gpu.retirement_pending), ("remap", gpu.remap_pending)):
                theirs = {"yes": True, "no": False}.get(row[key].lower())
                if theirs is not None and mine is not None and theirs != mine:
                    problems.append(f"GPU {row['index']}: {key} pending {row[key]} vs {mine}")
    else:
        problems.append("nvidia-smi --query-gpu gave nothing to compare with")
    summary = {
        "machine": platform.node(), "driver": report.driver, "gpus": len(report.gpus), "attached": report.attached,
        "xids": len(xids), "dcgmi_rows": len(rows), "findings": [f.what for f in node.findings],
        "seconds": {"nvidia_smi_q": round(t_smi, 2), "dmesg": round(t_log, 2), "dcgmi": round(t_diag, 1)},
        "problems": problems,
    }  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
