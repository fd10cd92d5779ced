"""A small but real DDP job: synthetic regression, an MLP, DistributedSampler, DDP, a checkpoint, and proof that
every rank ends with bit-identical parameters.

Run under torchrun (nodekit's launcher does that), e.g. on one machine as two "nodes"::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29600 train.py
    torchrun --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29600 train.py

Rank 0 writes ``checkpoint.pt`` and ``result.json`` to $NODEKIT_OUTPUT_DIR (default ./outputs) and prints one
summary line. ``--fail-rank R`` makes rank R exit with code 3 at its first step (for failure-path tests).

Resume contract (``nodekit run`` with ``restarts = N``): rank 0 writes ``checkpoint.pt`` to $NODEKIT_OUTPUT_DIR after
every epoch; when the job is restarted (NODEKIT_RESTART_COUNT > 0) or ``--resume`` is given and a checkpoint exists,
rank 0 loads it and broadcasts it, so every rank continues from the same epoch with the same weights and optimizer
state (momentum included: restoring it on rank 0 alone would make the ranks' parameters drift apart).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FAIL_EXIT_CODE = 3
STEP_TIMES = "step-times.txt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic data set")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument(
        "--pg-timeout",
        type=float,
        default=300.0,
        help="seconds a collective may wait for a peer; torch's default (10-30 min) hides a dead peer",
    )
    p.add_argument("--output-dir", default=os.environ.get("NODEKIT_OUTPUT_DIR", "outputs"))
    p.add_argument("--fail-rank", type=int, default=-1, help="this global rank exits with code 3 at its first step")
    p.add_argument("--resume", action="store_true", help="continue from outputs/checkpoint.pt when it exists")
    p.add_argument("--epoch-delay", type=float, default=0.0, help="seconds to pause after each epoch (tests)")
    p.add_argument("--progress", action="store_true", help="a progress bar per epoch, redrawn with \\r as tqdm does")
    p.add_argument(
        "--step-times",
        action="store_true",
        help=f"rank 0 writes each step's time.monotonic() to <output-dir>/{STEP_TIMES} (benchmarks/phases.py)",
    )
    return p.parse_args(argv)


def synthetic_data(n: int, d: int, seed: int) -> TensorDataset:
    """y = sin(x . w) + 0.5 * (x . v) + noise; the same on every rank because the generator is seeded."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d**0.5
    v = torch.randn(d, generator=g) / d**0.5
    y = torch.sin(x @ w) + 0.5 * (x @ v) + 0.05 * torch.randn(n, generator=g)
    return TensorDataset(x, y.unsqueeze(1))


def param_checksum(model: nn.Module) -> int:
    """The first 8 bytes of a sha256 over every parameter's bytes, as a signed int64 so it travels in a tensor:
    equal values mean bit-identical parameters. (all_gather_object would need numpy, which the image may lack.)"""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        flat = p.detach().to("cpu").contiguous().view(-1)
        h.update(bytes(flat.view(torch.uint8).tolist()))
    return int.from_bytes(h.digest()[:8], "big", signed=True)


def save_checkpoint(out_dir: Path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int, steps: int) -> None:
    """Rank 0: the state after ``epoch`` (0-based), written atomically so a kill mid-write leaves the last one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "steps": steps}, tmp)
    os.replace(tmp, out_dir / "checkpoint.pt")


def resume(out_dir: Path, model: nn.Module, opt: torch.optim.Optimizer, rank: int, wanted: bool) -> tuple[int, int]:
    """Every rank: (first epoch to run, steps so far), from rank 0's checkpoint when ``wanted`` and one exists."""
    box: list[object] = [None]
    path = out_dir / "checkpoint.pt"
    if rank == 0 and wanted and path.is_file():
        box[0] = torch.load(path, map_location="cpu", weights_only=True)
    dist.broadcast_object_list(box, src=0)
    ckpt = box[0]
    if not isinstance(ckpt, dict) or "epoch" not in ckpt:
        return 0, 0
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if rank == 0:
        print(f"ddp-demo: resumed from {path} after epoch {ckpt['epoch']} ({ckpt['steps']} steps)", flush=True)
    return int(ckpt["epoch"]) + 1, int(ckpt["steps"])


def progress(epoch: int, done: int, total: int) -> None:
    """A bar the way tqdm draws one: each redraw starts with a carriage return, a new line only at the end."""
    filled = 20 * done // total
    sys.stderr.write(f"\repoch {epoch} |{'#' * filled:<20}| {done}/{total}" + ("\n" if done == total else ""))
    sys.stderr.flush()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main() -> int:
    args = parse_args()
    t0 = time.perf_counter()
    marks = [f"start {time.monotonic():.6f}"] if args.step_times else None  # in memory: no I/O inside the loop
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = args.backend if args.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if use_cuda:
        # Before init: NCCL binds each process to the current device, and every rank defaulting to cuda:0 is
        # the classic "all processes on GPU 0" out-of-memory or hang.
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=args.pg_timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if marks is not None:
        marks.append(f"init {time.monotonic():.6f}")

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's at wrap time)
    data = synthetic_data(args.samples, args.features, args.seed)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    out_dir = Path(args.output_dir)
    restarted = int(os.environ.get("NODEKIT_RESTART_COUNT", "0") or 0) > 0
    start_epoch, steps = resume(out_dir, model, opt, rank, args.resume or restarted)
    start_steps = steps
    first_loss: float | None = None
    epoch_loss = torch.zeros(2, device=device)  # (sum of losses, batches) of the last epoch
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # without it every epoch repeats the same shuffle
        epoch_loss.zero_()
        for i, (x, y) in enumerate(loader):
            if steps == 0 and rank == args.fail_rank:
                print(f"rank {rank}: failing on purpose (--fail-rank {args.fail_rank})", file=sys.stderr, flush=True)
                sys.exit(FAIL_EXIT_CODE)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP all-reduces gradients here
            opt.step()
            epoch_loss += torch.stack([loss.detach(), torch.ones((), device=device)])
            steps += 1
            if marks is not None:
                marks.append(f"step {time.monotonic():.6f}")
            if rank == 0 and epoch == start_epoch and steps == start_steps + 1:
                print(f"ddp-demo: first step done (epoch {epoch})", flush=True)  # benchmarks/fleet_bench.py
            if args.progress:
                progress(epoch, i + 1, len(loader))
        if first_loss is None:
            first = epoch_loss.clone()
            dist.all_reduce(first)
            first_loss = (first[0] / first[1].clamp(min=1)).item()
        if rank == 0:
            save_checkpoint(out_dir, model, opt, epoch, steps)
            print(f"ddp-demo: epoch {epoch} done, checkpoint written ({steps} steps)", flush=True)
        if args.epoch_delay:
            time.sleep(args.epoch_delay)
    dist.all_reduce(epoch_loss)
    final_loss = (epoch_loss[0] / epoch_loss[1].clamp(min=1)).item()

    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / "checkpoint.pt.tmp"
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "steps": steps,
                "epoch": args.epochs - 1,
                "args": vars(args),
            },
            tmp,
        )
        os.replace(tmp, out_dir / "checkpoint.pt")

    mine = torch.tensor([param_checksum(model)], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    checksums = [f"{int(t.item()) & (2**64 - 1):016x}" for t in gathered]
    equal = len(set(checksums)) == 1
    wall = time.perf_counter() - t0
    if marks is not None and rank == 0:
        marks.append(f"end {time.monotonic():.6f}")
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / STEP_TIMES, ("\n".join(["# time.monotonic() seconds, rank 0", *marks]) + "\n").encode())
    if rank == 0:
        nnodes = int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")))
        result = {
            "nnodes": nnodes,
            "world_size": world_size,
            "nproc_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "backend": backend,
            "epochs": args.epochs,
            "steps": steps,
            "first_epoch_loss": round(first_loss or 0.0, 6),
            "final_loss": round(final_loss, 6),
            "checksums": checksums,
            "checksums_equal": equal,
            "wall_time_s": round(wall, 3),
            "image": os.environ.get("NODEKIT_FINGERPRINT", "")[:12],
        }
        write_atomic(out_dir / "result.json", (json.dumps(result, indent=2) + "\n").encode())
        verdict = "equal" if equal else "DIFFERENT"
        print(
            f"ddp-demo: {nnodes} nodes x {result['nproc_per_node']} proc (world {world_size}, {backend}) | "
            f"{steps} steps | final loss {final_loss:.4f} | checksums {verdict} on {world_size} ranks | "
            f"{wall:.1f} s",
            flush=True,
        )
    # Every rank leaves together, once rank 0 has written its files (the DDP tutorials' usual ending). Without it
    # the other ranks' processes end while rank 0 still holds the group; with torch 2.13's gloo that aborted rank 0
    # once ("terminate called without an active exception") after its summary, before its interpreter exited.
    dist.barrier()
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
