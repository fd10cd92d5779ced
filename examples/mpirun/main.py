"""A script in the style of Lambda's mpirun examples: it reads only the variables Open MPI's mpirun sets and hands
rank and world size to init_process_group itself (MASTER_ADDR and MASTER_PORT come from mpirun's -x flags).

    mpirun -np 4 -H host1:2,host2:2 -x MASTER_ADDR=host1 -x MASTER_PORT=1234 python3 main.py --backend gloo

With nodekit: launcher = "mpirun" in nodekit.toml, then `nodekit run` (or `nodekit up` on each node).
"""

import argparse
import os

import torch
import torch.distributed as dist

# Set by mpirun (and by nodekit's launcher = "mpirun").
LOCAL_RANK = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
WORLD_SIZE = int(os.environ["OMPI_COMM_WORLD_SIZE"])
WORLD_RANK = int(os.environ["OMPI_COMM_WORLD_RANK"])


def run(backend: str) -> None:
    device = torch.device("cuda", LOCAL_RANK) if backend == "nccl" else torch.device("cpu")
    tensor = torch.zeros(1, device=device)
    # Rank 0 sends a token to every other rank, point to point.
    if WORLD_RANK == 0:
        for dst in range(1, WORLD_SIZE):
            dist.send(tensor=tensor + dst, dst=dst)
    else:
        dist.recv(tensor=tensor, src=0)
        assert int(tensor.item()) == WORLD_RANK, f"rank {WORLD_RANK} received {tensor.item()}"
    # Every rank contributes its rank: the sum proves each process holds a distinct rank of one world.
    total = torch.tensor([float(WORLD_RANK)], device=device)
    dist.all_reduce(total)
    expected = WORLD_SIZE * (WORLD_SIZE - 1) / 2
    print(f"mpirun: rank {WORLD_RANK} local {LOCAL_RANK} of {WORLD_SIZE}: sum of ranks {total.item():g}", flush=True)
    if total.item() != expected:
        raise SystemExit(f"sum of ranks {total.item()} != {expected}")
    if WORLD_RANK == 0:
        print(f"mpirun: {WORLD_SIZE} ranks, send/recv and all_reduce ok", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", type=str, default="nccl", choices=["nccl", "gloo"])
    args = parser.parse_args()
    dist.init_process_group(args.backend, rank=WORLD_RANK, world_size=WORLD_SIZE)
    run(args.backend)
    dist.destroy_process_group()
