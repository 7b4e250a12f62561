"""bench/remote/remote_ps_torch_rpc.py — the parameter-server benchmark's shape under torch's RPC DistributedOptimizer, for the side-by-side with shardopt-remote-bench --pull.

    python3 remote_ps_torch_rpc.py [--rows R] [--dim D] [--trainers T] [--batch B] [--pushes P]
                                   [--optimizer torch|shardopt]

worker0 owns an R x D f32 table; workers 1..T train. Each trainer, in one dist_autograd context,
pulls P times B rows of the table (an RPC returning them, recorded by distributed autograd, with
sparse gradients as nn.Embedding(sparse=True): dense ones made each pull cost the whole table),
then runs one backward whose gradient (B rows of 1/64 per pull) flows back to the owner, and
DistributedOptimizer(SGD, lr=1).step(context). Prints pulls+pushes per second over the
trainers (the slowest trainer's time), as shardopt-remote-bench --pull does, and checks the table.
--optimizer shardopt runs the same program with the one import changed to
shardopt.torch.DistributedOptimizer (torch's RPC and autograd, shardopt's update on the owner).
"""
import argparse
import os
import socket
import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import optim
from torch.distributed.optim import DistributedOptimizer

TABLE = {}
BARRIER = {"cond": threading.Condition(), "arrived": 0}


def arrive_and_wait(trainers):
    """On worker0: returns once every trainer has arrived (their backwards are done)."""
    with BARRIER["cond"]:
        BARRIER["arrived"] += 1
        BARRIER["cond"].notify_all()
        BARRIER["cond"].wait_for(lambda: BARRIER["arrived"] >= trainers)


def make_table(rows, dim):
    TABLE["t"] = torch.zeros(rows, dim, requires_grad=True)
    return TABLE["t"]


def lookup(table_rref, index):
    # Sparse gradients (as nn.Embedding(sparse=True)): a dense one would be the whole table per pull.
    return torch.nn.functional.embedding(index, table_rref.local_value(), sparse=True)


def rows_of(trainer, i, rows, batch):
    g = torch.Generator().manual_seed(trainer * 1000003 + i)
    return torch.randint(0, rows, (batch,), generator=g)


def table_sum():
    return float(TABLE["t"].detach().double().sum())


def worker(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    world = args.trainers + 1
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=600)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
    if rank == 0:
        table = rpc.remote("worker0", make_table, args=(args.rows, args.dim))
        futures = [rpc.rpc_async(f"worker{t}", train, args=(table, t, args)) for t in range(1, world)]
        seconds = max(f.wait() for f in futures)
        total = args.pushes * args.trainers
        expected = -total * args.batch * args.dim / 64.0
        name = "shardopt.torch" if args.optimizer == "shardopt" else "torch"
        results["line"] = (f"{name} RPC DistributedOptimizer: {args.rows} x {args.dim} table on 1 owner, {args.trainers} trainer(s), "
                           f"{args.pushes} pulls+pushes of {args.batch} rows each: {seconds:.4f} s, {total / seconds:.0f} /s; "
                           f"table check: {'ok' if abs(rpc.rpc_sync('worker0', table_sum) - expected) < 1e-3 * abs(expected) else 'WRONG'}")
    rpc.shutdown()


def optimizer_class(name):
    if name == "shardopt":
        from shardopt.torch import DistributedOptimizer as Drop_in

        return Drop_in
    return DistributedOptimizer


def train(table, trainer, args):
    dist_optim = optimizer_class(args.optimizer)(optim.SGD, [table], lr=1.0)
    index = [rows_of(trainer, i, args.rows, args.batch) for i in range(args.pushes)]
    start = time.perf_counter()
    with dist_autograd.context() as context_id:
        loss = 0
        for i in range(args.pushes):
            pulled = rpc.rpc_sync(table.owner(), lookup, args=(table, index[i]))
            loss = loss + pulled.sum() / 64.0
        dist_autograd.backward(context_id, [loss])
        # Every trainer's backward before any step: a step's in-place update of the table under
        # another trainer's pending backward fails torch's saved-tensor version check.
        rpc.rpc_sync("worker0", arrive_and_wait, args=(args.trainers,))
        dist_optim.step(context_id)
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--pushes", type=int, default=300)
    p.add_argument("--optimizer", choices=("torch", "shardopt"), default="torch")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(worker, args=(args, port, results), nprocs=args.trainers + 1, join=True)
    print(results["line"])


if __name__ == "__main__":
    main()
