"""A job that stops progressing on purpose, to see nodekit's stall watch and ``nodekit stacks`` at work.

Three phases, each announced by one line:

1. ``--quiet S``: DDP training (gradients all-reduced every step) for S seconds, printing nothing;
2. ``--solo S``: rank 0 computes alone for S seconds, without a collective, while every other rank waits for it
   in a barrier (what an evaluation or a checkpoint written by rank 0 looks like);
3. ``--mismatch``: the ranks issue different collectives (even ranks ``all_reduce``, odd ranks ``all_gather``, on
   two process groups of their own, so that no message of one can complete the other): the job hangs, every
   rank alive, as when nodes resume from snapshots of different epochs. Without it every rank ends (exit 0).

Phases 1 and 2 make progress, quietly; only phase 3 is a stall. With nodekit's default ``stall_timeout`` (300 s)
the watch reports it after five minutes; try 20 s, on one machine::

    export NODEKIT_STALL_TIMEOUT=20 NODEKIT_ARGS='["--mismatch"]'
    nodekit up --node-rank 1 --main 127.0.0.1 --script stall.py --detach
    nodekit up --node-rank 0 --main 127.0.0.1 --script stall.py     # nodekit stacks, from a third shell
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quiet", type=float, default=20.0, help="seconds of silent DDP training")
    p.add_argument("--solo", type=float, default=20.0, help="seconds rank 0 computes alone while the others wait")
    p.add_argument("--mismatch", action="store_true", help="then issue different collectives: a hang")
    p.add_argument("--pg-timeout", type=float, default=1800.0, help="seconds before gloo itself gives up")
    return p.parse_args()


def say(rank: int, line: str) -> None:
    print(f"[rank {rank}] stall-demo: {line}", flush=True)


def train_quietly(ddp: nn.Module, seconds: float) -> int:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    end, steps = time.monotonic() + seconds, 0
    while True:
        # Every rank decides together whether to go on, so that none starts a step the others skip.
        go = torch.tensor([1.0 if time.monotonic() < end else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if go.item() == 0:
            return steps
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()  # DDP all-reduces the gradients here
        opt.step()
        steps += 1


def compute_alone(seconds: float) -> int:
    end, rounds = time.monotonic() + seconds, 0
    a = torch.randn(128, 128)
    while time.monotonic() < end:
        a = torch.tanh(a @ a.T / 128)
        rounds += 1
    return rounds


def mismatch(rank: int, evens: dist.ProcessGroup, odds: dist.ProcessGroup) -> None:
    t = torch.ones(4)
    if rank % 2 == 0:
        dist.all_reduce(t, group=evens)
    else:
        out = [torch.zeros(4) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t, group=odds)


def main() -> int:
    args = parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    everyone = list(range(world))
    evens, odds = dist.new_group(everyone), dist.new_group(everyone)  # every rank creates both, in the same order
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    say(rank, f"training quietly for {args.quiet:g} s")
    steps = train_quietly(ddp, args.quiet)
    say(rank, f"trained {steps} steps; rank 0 computes alone for {args.solo:g} s")
    if rank == 0:
        compute_alone(args.solo)
    dist.barrier()
    say(rank, "solo phase done")
    if args.mismatch:
        say(rank, "issuing a different collective than the other ranks: the job hangs here")
        mismatch(rank, evens, odds)
        say(rank, "the mismatched collective completed (it should not have)")
        return 1
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
