"""The PyTorch multinode tutorial's trainer (pytorch/examples, distributed/ddp-tutorial-series/multinode.py), small
enough for a CPU: a snapshot saved every epoch and loaded at start when present, so that a job restarted by
torchrun (``max_restarts``) or by ``nodekit run`` (``restarts``) resumes where it stopped instead of from epoch 0.

    torchrun --nnodes 2 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        --rdzv-id JOB train.py 8 1

Every node's local rank 0 writes ``snapshot.pt`` to $NODEKIT_OUTPUT_DIR (default ./outputs) after every
``save_every`` epochs; every rank loads it at start when it exists. At the end every rank prints a checksum of its
parameters and rank 0 writes ``result.json`` (every rank's checksum) there. Two changes to the tutorial, both for
correctness: the snapshot records the epochs *completed* (the tutorial's records the last epoch run, which is then
run again), and the ranks take the epoch to resume from from rank 0, whose parameters DDP broadcasts anyway: with
per-node disks a kill can land after one node wrote epoch k and before another did.

As the tutorial says, RANK (and the node's group rank) can differ after a restart: nothing here depends on which
rank runs where, except that rank 0 writes result.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(n: int = 2048, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 20, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) / 10 + 0.01 * torch.rand(n, 1, generator=g))


def checksum(model: torch.nn.Module) -> int:
    """The first 8 bytes of a sha256 over every parameter, as a signed int64 so that it travels in a tensor."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(p.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    return int.from_bytes(h.digest()[:8], "big", signed=True)


class Trainer:
    def __init__(
        self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer, save_every: int,
        snapshot_path: Path, epoch_seconds: float,
    ) -> None:  # fmt: skip
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epoch_seconds = epoch_seconds
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if snapshot_path.exists():
            print(f"[rank {self.global_rank}] Loading snapshot", flush=True)
            self._load_snapshot(snapshot_path)
        agreed = torch.tensor([self.epochs_run])
        dist.broadcast(agreed, src=0)
        self.epochs_run = int(agreed.item())
        self.model = DDP(self.model)  # broadcasts rank 0's parameters to every rank

    def _load_snapshot(self, snapshot_path: Path) -> None:
        snapshot = torch.load(snapshot_path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = int(snapshot["EPOCHS_RUN"])
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        print(
            f"[rank {self.global_rank}] Resuming training from snapshot at Epoch {self.epochs_run} "
            f"(torchrun restart {restart}, NODEKIT_RESTART_COUNT {os.environ.get('NODEKIT_RESTART_COUNT', '0')})",
            flush=True,
        )

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        steps = len(self.train_data)
        print(f"[rank {self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {steps}", flush=True)
        self.train_data.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for source, targets in self.train_data:
            self._run_batch(source, targets)
        time.sleep(self.epoch_seconds)  # what a real epoch's compute would take: time to kill a worker in

    def _save_snapshot(self, epochs_run: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epochs_run}
        # Atomic: a kill mid-write leaves the previous snapshot, and nodes sharing a directory never mix their bytes.
        # The temporary name is unique (mkstemp): two containers on one machine share the host name and, often, PIDs.
        self.snapshot_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.snapshot_path.parent, prefix=f"{self.snapshot_path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(snapshot, f)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epochs_run - 1} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def finish(model: torch.nn.Module, out_dir: Path, epochs: int) -> None:
    """Every rank's parameter checksum, printed by each and written by rank 0 to result.json."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([checksum(model)], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    sums = [f"{int(t.item()) & (2**64 - 1):016x}" for t in every]
    print(f"[rank {rank}] parameter checksum {sums[rank]}", flush=True)
    if rank == 0:
        result = {"world_size": world, "epochs": epochs, "checksums": sums, "checksums_equal": len(set(sums)) == 1}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json.tmp").write_text(json.dumps(result, indent=2) + "\n")
        os.replace(out_dir / "result.json.tmp", out_dir / "result.json")
        print(f"snapshot-demo: {epochs} epochs | checksums {'equal' if len(set(sums)) == 1 else 'DIFFERENT'} "
              f"on {world} ranks", flush=True)  # fmt: skip


def main(save_every: int, total_epochs: int, batch_size: int, epoch_seconds: float) -> None:
    dist.init_process_group(backend="gloo")
    out_dir = Path(os.environ.get("NODEKIT_OUTPUT_DIR", "outputs"))
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    data = dataset()
    loader = DataLoader(data, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(data))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    trainer = Trainer(model, loader, optimizer, save_every, out_dir / "snapshot.pt", epoch_seconds)
    trainer.train(total_epochs)
    finish(model, out_dir, total_epochs)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--epoch_seconds", default=0.0, type=float, help="pause at the end of every epoch")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.epoch_seconds)
