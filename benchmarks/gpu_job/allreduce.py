"""The device check's job (benchmarks/gpu_device_run.sh): started by ``python -m nodekit.launcher allreduce.py``,
as the image's entrypoint starts a user's script, so the all-reduce goes through the launcher's code path (its
environment, the preflight where there is one, the GPU health check, torchrun in the launcher's process).

Each rank all-reduces float32 tensors of several sizes, checks the sum, and rank 0 prints one ``ALLREDUCE {json}``
line with the time per all-reduce, the algorithm bandwidth (bytes / time) and the bus bandwidth nccl-tests reports
(algbw x 2(n-1)/n), and writes it to $NODEKIT_OUTPUT_DIR. NCCL where there is a GPU, else gloo;
ALLREDUCE_BACKEND chooses (gloo for two "nodes" on a one-GPU machine: NCCL refuses two ranks on one GPU).
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    nnodes = world // local_world
    gpus = torch.cuda.device_count()
    backend = os.environ.get("ALLREDUCE_BACKEND") or ("nccl" if gpus else "gloo")
    device = torch.device(f"cuda:{local % gpus}") if gpus else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    t0 = time.monotonic()
    dist.init_process_group(backend, device_id=device if backend == "nccl" and device.type == "cuda" else None)
    x = torch.ones(1, device=device)
    dist.all_reduce(x)  # the first collective: NCCL's communicator is made here
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.monotonic() - t0
    first_at = time.time()  # wall clock: benchmarks/gpu_beside_bench.sh measures from the launchers' start
    sizes_mib = [1, 16, 256, 1024] if backend == "nccl" else [1, 16, 64]
    rows = []
    for mib in sizes_mib:
        n = mib * 1024 * 1024 // 4
        t = torch.ones(n, device=device)
        iters = 20 if backend == "nccl" else 5
        for _ in range(3):
            dist.all_reduce(t)
        t.fill_(1.0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = (time.perf_counter() - start) / iters
        want = float(world**iters)
        ok = bool(torch.allclose(t[:8].float().cpu(), torch.full((8,), want)))
        algbw = n * 4 / took / 1e9
        rows.append({"mib": mib, "us": round(took * 1e6, 1), "algbw_gbs": round(algbw, 2),
                     "busbw_gbs": round(algbw * 2 * (world - 1) / world, 2), "sum_ok": ok})  # fmt: skip
    facts = {
        "world": world, "nnodes": nnodes, "backend": backend, "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        "torch": torch.__version__, "cuda": torch.version.cuda or "",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else "",
        "init_and_first_allreduce_s": round(first_s, 3), "first_allreduce_at": first_at, "sizes": rows,
    }  # fmt: skip
    if rank == 0:
        line = json.dumps(facts)
        print("ALLREDUCE " + line, flush=True)
        out = os.environ.get("NODEKIT_OUTPUT_DIR", ".")
        with open(os.path.join(out, f"allreduce-{nnodes}node-{backend}.json"), "w") as f:
            f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
