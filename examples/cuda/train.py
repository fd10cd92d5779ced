"""A small torchvision job under DDP: a ResNet-18 from torchvision on generated 32x32 images, torchvision's
transforms and one of its compiled operators (``nms``) on every rank, and proof that every rank ends with
bit-identical parameters. NCCL on GPUs; gloo on the CPU when the node has none (a CUDA build of torch trains on the
CPU without a driver).

Run under torchrun (nodekit's launcher does that). Rank 0 writes ``result.json`` to $NODEKIT_OUTPUT_DIR with the
stack the job ran on (torch, CUDA, cuDNN, NCCL as torch itself reports them) and the ranks' checksums.
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
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchvision.transforms import v2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=128, help="generated images, split between the ranks")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=os.environ.get("NODEKIT_OUTPUT_DIR", "outputs"))
    return p.parse_args()


def generated_images(n: int, seed: int) -> TensorDataset:
    """Ten classes of 3x32x32 images, each class a colour blob at its own place, with noise: the same on every
    rank because the generator is seeded."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = 0.1 * torch.randn(n, 3, 32, 32, generator=g)
    for i, c in enumerate(labels.tolist()):
        row, col = divmod(c, 5)
        images[i, c % 3, row * 16 : row * 16 + 12, col * 6 : col * 6 + 6] += 1.0
    augment = v2.Compose([v2.RandomHorizontalFlip(p=0.0), v2.Normalize([0.1] * 3, [0.5] * 3)])
    return TensorDataset(augment(images), labels)


def param_checksum(model: nn.Module) -> str:
    """sha256 over every parameter's bytes (first 16 hex digits): equal strings mean bit-identical parameters.
    Parameters only: BatchNorm's running statistics are buffers that each rank updates in its own last forward pass
    (DDP broadcasts rank 0's at the start of every forward, not after it), so they legitimately differ at the end."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def stack() -> dict[str, object]:
    """The GPU stack as torch reports it; the library versions need no GPU (they are compiled in)."""
    nccl = None
    if torch.cuda.is_available() or torch.version.cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):
            nccl = None
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": nccl,
        "gpus": torch.cuda.device_count(),
    }


def main() -> int:
    args = parse_args()
    t0 = time.perf_counter()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)  # before init: NCCL binds each process to the current device
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()

    # torchvision's compiled operators: a torchvision wheel built for another torch fails right here
    # ("operator torchvision::nms does not exist"), before any training.
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [20.0, 20.0, 30.0, 30.0]])
    kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5).tolist()

    torch.manual_seed(args.seed)
    data = generated_images(args.samples, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps, last = 0, torch.zeros(2, device=device)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        last.zero_()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            opt.step()
            last += torch.stack([loss.detach(), torch.ones((), device=device)])
            steps += 1
    dist.all_reduce(last)
    final_loss = (last[0] / last[1].clamp(min=1)).item()

    sums: list[str | None] = [None] * world
    dist.all_gather_object(sums, param_checksum(model))
    equal = len(set(sums)) == 1
    if rank == 0:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        result = {
            "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1"))),
            "world_size": world,
            "backend": backend,
            "device": str(device),
            "steps": steps,
            "final_loss": round(final_loss, 6),
            "nms_kept": kept,
            "checksums": sums,
            "checksums_equal": equal,
            "stack": stack(),
            "wall_time_s": round(time.perf_counter() - t0, 3),
            "image": os.environ.get("NODEKIT_FINGERPRINT", "")[:12],
        }
        tmp = out / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(tmp, out / "result.json")
        s = stack()
        print(
            f"cuda-demo: {world} ranks ({backend} on {device}) | torch {s['torch']} (CUDA {s['cuda']}, "
            f"cuDNN {s['cudnn']}, NCCL {s['nccl']}) | {steps} steps | loss {final_loss:.4f} | "
            f"checksums {'equal' if equal else 'DIFFERENT'}",
            flush=True,
        )
    dist.barrier()  # every rank leaves once rank 0 wrote its files
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
