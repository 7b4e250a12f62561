"""python/examples/zero_tutorial.py — torch's ZeroRedundancyOptimizer tutorial (Shard Optimizer States with ZeroRedundancyOptimizer), on CPU, launched by torchrun or mpirun.

The tutorial's model (20 layers of nn.Linear(2000, 2000), ~80M parameters) under DDP, one Adam
step by ZeroRedundancyOptimizer, and the sum of the parameters it prints. torch's version spawns
its ranks with mp.spawn on GPUs; here the launcher starts them and gloo carries DDP's traffic::

    python -m torch.distributed.run --nproc_per_node 2 python/examples/zero_tutorial.py
    mpirun -n 2 python python/examples/zero_tutorial.py

To run it over shardopt, change the one import below to ``from shardopt.torch import
ZeroRedundancyOptimizer`` (python/tests/zero_tutorial_check.py does exactly that, and checks the
sum against torch's own run).
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def launch_environment():
    """(rank, world size) from torchrun's variables, or from mpirun's (Open MPI) where torchrun's are absent."""
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    return int(rank), int(world)


def example(rank, world_size, use_zero=True):
    torch.manual_seed(0)  # the same model and batch on every rank, as in the tutorial
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    model = nn.Sequential(*[nn.Linear(2000, 2000) for _ in range(20)])
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    if use_zero:
        optimizer = ZeroRedundancyOptimizer(ddp_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    else:
        optimizer = torch.optim.Adam(ddp_model.parameters(), lr=0.01)

    outputs = ddp_model(torch.randn(20, 2000))
    labels = torch.randn(20, 2000)
    loss_fn(outputs, labels).backward()  # DDP averages the gradients over the ranks
    optimizer.step()

    # The tutorial's check: the sum of the parameters after the step (full precision here).
    params_sum = sum(model.parameters()).sum()
    print(f"rank {rank}: params sum is: {params_sum.item()!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    example(*launch_environment())
