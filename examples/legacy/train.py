"""An older DDP script in the style of the torch.distributed.launch guides:

    python -m torch.distributed.launch --nproc_per_node 1 --nnodes 2 --node_rank R --master_addr A \
        --master_port P train.py

The launcher passes each process its --local_rank argument; the rest comes from the environment (env://). At the
end every rank compares a checksum of its parameters with everyone else's.
"""

import argparse
import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

if torch.cuda.is_available():
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", args.local_rank)
else:
    dist.init_process_group(backend="gloo", init_method="env://")
    device = torch.device("cpu")
rank = dist.get_rank()

torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = x.sum(dim=1, keepdim=True).sin()
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
model = DDP(model, device_ids=[args.local_rank] if device.type == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

h = hashlib.sha256()
for name, p in sorted(model.module.state_dict().items()):
    h.update(name.encode())
    h.update(bytes(p.detach().cpu().contiguous().view(-1).view(torch.uint8).tolist()))
mine = torch.tensor([int.from_bytes(h.digest()[:8], "big", signed=True)], device=device)
sums = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
dist.all_gather(sums, mine)
equal = len({int(t.item()) for t in sums}) == 1
if rank == 0:
    print(
        f"legacy: local_rank {args.local_rank}, loss {loss.item():.4f}, parameters "
        f"{'equal' if equal else 'DIFFERENT'} on {dist.get_world_size()} ranks",
        flush=True,
    )
if not equal:
    raise SystemExit(1)
