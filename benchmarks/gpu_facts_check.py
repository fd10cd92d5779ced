"""The preflight's GPU facts on a real GPU machine (part of benchmarks/gpu_device_run.sh).

``nodekit.launcher.preflight.stack.gather`` is what every node publishes in the preflight: GPU model, count and
driver from ``nvidia-smi --query-gpu`` (no CUDA context), else from /dev/nvidiaN and the driver's /proc entries; CUDA,
cuDNN and NCCL as torch reports them. This runs both ways of reading the GPUs and checks them against torch's own
CUDA view (which does create a context: the launcher never asks it), prints one JSON object, and exits 1 on any
disagreement.

    python3 benchmarks/gpu_facts_check.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodekit.launcher.config import parse_env
from nodekit.launcher.preflight import stack


def main() -> int:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611", "NODE_RANK": "0", "NNODES": "2", "NPROC_PER_NODE": "1"}
    cfg = parse_env(env)
    t = time.monotonic()
    facts = stack.gather(cfg, "127.0.0.1", env)  # imports torch: the first import is most of this
    gather_s = time.monotonic() - t
    t = time.monotonic()
    facts = stack.gather(cfg, "127.0.0.1", env)
    again_s = time.monotonic() - t
    proc_model, proc_count = stack._gpus_from_proc()
    proc_driver = stack._driver_from_proc()

    import torch

    n = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(n)})
    truth = {"gpu_model": " + ".join(names), "gpu_count": n, "cuda": torch.version.cuda or "",
             "cudnn": str(torch.backends.cudnn.version() or ""),
             "nccl": ".".join(map(str, torch.cuda.nccl.version())) if n else ""}  # fmt: skip
    problems = [f"{k}: gather says {getattr(facts, k)!r}, torch {v!r}" for k, v in truth.items()
                if getattr(facts, k) != v]  # fmt: skip
    if (proc_model, proc_count) != (facts.gpu_model, facts.gpu_count):
        problems.append(f"/proc and /dev say {proc_model!r} x {proc_count}, "
                        f"nvidia-smi {facts.gpu_model!r} x {facts.gpu_count}")  # fmt: skip
    if proc_driver != facts.driver:
        problems.append(f"/proc/driver/nvidia/version says driver {proc_driver!r}, nvidia-smi {facts.driver!r}")
    out = {"facts": facts.to_json_dict(), "from_proc": {"gpu_model": proc_model, "gpu_count": proc_count,
           "driver": proc_driver}, "torch": truth, "gather_s": round(gather_s, 3), "gather_again_s": round(again_s, 3),
           "problems": problems}  # fmt: skip
    print(json.dumps(out, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
