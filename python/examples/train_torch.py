"""python/examples/train_torch.py — trains a small torch MLP with shardopt and, in the same run, with torch's ZeroRedundancyOptimizer, and checks that they agree.

    mpirun -np 2 python python/examples/train_torch.py [--steps 20] [--optimizer adamw|adam|sgd]

Every rank builds the same model twice (same seed): one copy is trained by shardopt (external
storage: it updates the torch parameters in place; gradients averaged by shardopt over MPI), the
other by torch.distributed.optim.ZeroRedundancyOptimizer over gloo (gradients averaged by
all_reduce). Each rank draws its own batches, so the averaging matters. With the sorted_greedy
partition shardopt shards the state exactly as torch does, which the script checks too.
Exits non-zero if the parameters or the per-rank state sizes disagree.
"""
import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

import shardopt


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    y = torch.sin(x[:, :4]) + 0.1 * torch.randn(32, 4, generator=g)
    return x, y


def torch_state_bytes(zero):
    """Bytes of per-parameter state tensors (not the 0-d step counters) in this rank's shard."""
    total = 0
    for state in zero.optim.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.dim() > 0:
                total += value.numel() * value.element_size()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adamw")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()

    comm = shardopt.mpi_world()  # initialises MPI (mpirun started us)
    rank, world = comm.rank, comm.size
    # torch.distributed over gloo on this machine, for the reference optimizer.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(0)
    ours = make_model()
    theirs = copy.deepcopy(ours)

    hyper = {"lr": args.lr, "weight_decay": 0.01}
    torch_class = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[args.optimizer]
    if args.optimizer == "sgd":
        hyper["momentum"] = 0.9
    config = shardopt.OptimizerConfig(
        algorithm=getattr(shardopt.Algorithm, args.optimizer),
        partition=shardopt.PartitionStrategy.sorted_greedy,  # torch's assignment of params to ranks
        storage=shardopt.Storage.external,  # update the torch parameters in place
    )
    opt = shardopt.ZeroOptimizer(comm, [shardopt.torch_param_group(ours, **hyper)], config)
    zero = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=torch_class, **hyper)

    loss_fn = torch.nn.MSELoss()
    for step in range(args.steps):
        x, y = batch(rank, step)

        opt.zero_grad()  # zeroes the .grad buffers shardopt reads
        loss = loss_fn(ours(x), y)
        loss.backward()
        opt.reduce_gradients()  # average over ranks (no DDP here)
        opt.step()

        zero.zero_grad()
        their_loss = loss_fn(theirs(x), y)
        their_loss.backward()
        for p in theirs.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        zero.step()

        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss shardopt {loss.item():.6f}  torch {their_loss.item():.6f}", flush=True)

    worst = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    ours_bytes = opt.memory_report().state_bytes
    theirs_bytes = torch_state_bytes(zero)
    total_bytes = sum(p.numel() for p in ours.parameters()) * 4 * (1 if args.optimizer == "sgd" else 2)
    print(
        f"rank {rank}: {args.optimizer} x {args.steps} steps, max |shardopt - torch ZeRO| = {worst:.3g}; "
        f"state bytes on this rank: shardopt {ours_bytes}, torch {theirs_bytes} (of {total_bytes})",
        flush=True,
    )
    ok = worst <= args.tolerance and ours_bytes == theirs_bytes and (world == 1 or ours_bytes < total_bytes)
    # Every rank's verdict, so that all exit alike.
    verdict = torch.tensor([0 if ok else 1])
    dist.all_reduce(verdict)
    dist.destroy_process_group()
    del opt, comm
    if rank == 0:
        print("train_torch: OK" if verdict.item() == 0 else "train_torch: MISMATCH", flush=True)
    return 0 if verdict.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
