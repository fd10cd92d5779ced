"""A Lightning Fabric script as the "Bare Bones Cluster" guide writes it, for `fabric run`:

    fabric run --node-rank R --main-address A --main-port P --num-nodes 2 --devices 1 --accelerator cpu \
        --strategy ddp train.py

Fabric() leaves accelerator, strategy, devices and nodes to the CLI and there is no fabric.launch() call: the CLI
(or nodekit's launcher = "fabric") started every process. At the end every rank compares a checksum of its
parameters with everyone else's.
"""

import argparse
import hashlib

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def checksum(model: nn.Module) -> int:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(p.detach().cpu().contiguous().view(-1).view(torch.uint8).tolist()))
    return int.from_bytes(h.digest()[:8], "big", signed=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    fabric = L.Fabric()
    fabric.seed_everything(0)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)

    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step == args.steps:
                break

    sums = fabric.all_gather(torch.tensor([checksum(model)]))
    equal = len(set(sums.view(-1).tolist())) == 1
    fabric.print(
        f"fabric: {step} steps, loss {loss.item():.4f}, parameters {'equal' if equal else 'DIFFERENT'} "
        f"on {fabric.world_size} ranks"
    )
    if not equal:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
