"""python/examples/zero_overlap_ddp.py — torch's documented overlap_with_ddp pattern (a DDP model, ZeroRedundancyOptimizer(overlap_with_ddp=True), the DDP hook hook_with_zero_step), on CPU, launched by torchrun or mpirun.

    python -m torch.distributed.run --nproc_per_node 2 python/examples/zero_overlap_ddp.py
    mpirun -n 2 python python/examples/zero_overlap_ddp.py

As written it uses torch's classes, and torch refuses gloo here ("requires NCCL/HCCL backend to
avoid hangs"); its runs also skip the first two iterations' updates. To run it over shardopt,
replace the two torch imports marked below by ``from shardopt.torch import
ZeroRedundancyOptimizer, hook_with_zero_step`` (python/tests/zero_overlap_ddp_check.py does
exactly that): every iteration updates, on gloo or NCCL, and the parameters are bitwise those of
the non-overlapped drop-in (``--overlap none``) and of the drop-in's own gradient hooks without
DDP (``--overlap own_hooks``). Prints the parameters' sum and a digest of their bytes.
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step  # the two imports
from torch.distributed.optim import ZeroRedundancyOptimizer  # to change


def launch_environment():
    """(rank, world size) from torchrun's variables, or from mpirun's (Open MPI) where torchrun's are absent."""
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    return int(rank), int(world)


def train(rank, world_size, overlap, iterations, width, depth):
    torch.manual_seed(0)  # the same model on every rank
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
    loss_fn = nn.MSELoss()

    if overlap == "ddp_hook":  # torch's pattern: the step runs from DDP's hook, not in the loop
        net = DDP(model)
        zero = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam,
                                       overlap_with_ddp=True, lr=0.01)
        net.register_comm_hook(None, hook_with_zero_step(allreduce_hook, net, zero))
    elif overlap == "own_hooks":  # no DDP: the optimizer averages each gradient as backward produces it
        net = model
        zero = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam,
                                       overlap_with_ddp=True, lr=0.01)
    else:  # the plain loop: DDP averages, then step()
        net = DDP(model)
        zero = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)

    for i in range(iterations):
        g = torch.Generator().manual_seed(100 * i + rank)  # each rank its own batch
        inputs, labels = torch.randn(20, width, generator=g), torch.randn(20, width, generator=g)
        zero.zero_grad()
        loss_fn(net(inputs), labels).backward()
        if overlap != "ddp_hook":
            zero.step()

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank}: params sum is: {params.sum().item()!r} digest {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlap", choices=["ddp_hook", "own_hooks", "none"], default="ddp_hook")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args()
    train(*launch_environment(), args.overlap, args.iterations, args.width, args.depth)
