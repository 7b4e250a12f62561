"""python/tests/rpc_dist_optim_check.py — torch's DistributedOptimizer example (RPC workers, dist_autograd contexts, remote parameters, step(context_id)) run with torch's class and with shardopt.torch.DistributedOptimizer: the parameters must agree to 1e-6, at 2 and 3 RPC workers, for SGD (momentum), Adam and AdamW.

Run directly (it starts its own workers with torch.multiprocessing, outside mpirun):
    python rpc_dist_optim_check.py
Prints one line per case and "RPC-DIST-OPTIM ok" at the end; exits 1 on a mismatch.
"""
import os
import socket
import sys

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import optim

STEPS = 4
CASES = [
    (optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, amsgrad=True)),
    (optim.AdamW, dict(lr=0.01, weight_decay=0.05)),
]


def make_param(seed, shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).requires_grad_()


def fetch(rref):
    return rref.local_value().detach().clone()


def train(flavour, optimizer_class, kwargs, world):
    """On worker0: torch's docs example, a few contexts, parameters on the other workers."""
    if flavour == "torch":
        from torch.distributed.optim import DistributedOptimizer
    else:
        from shardopt.torch import DistributedOptimizer  # the one line that changes
    owners = [f"worker{1 + i % (world - 1)}" for i in range(3)]
    rrefs = [rpc.remote(owner, make_param, args=(10 + i, (4, 3))) for i, owner in enumerate(owners)]
    x = torch.linspace(-1, 1, 12).view(4, 3)
    dist_optim = None
    for step in range(STEPS):
        with dist_autograd.context() as context_id:
            a, b = rrefs[0].to_here(), rrefs[1].to_here()
            if step == 2:  # a context without a gradient for c: its owner leaves it as it is
                loss = (a * x).sum() + (b * b).sum()
            else:
                c = rrefs[2].to_here()
                loss = (a * x).sum() + (b * b).sum() * 0.5 + ((a - c) ** 2).sum() * (step + 1)
            dist_autograd.backward(context_id, [loss])
            if dist_optim is None:
                dist_optim = DistributedOptimizer(optimizer_class, rrefs, **kwargs)
            dist_optim.step(context_id)
    return [rpc.rpc_sync(r.owner(), fetch, args=(r,)) for r in rrefs]


def worker(rank, world, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
    if rank == 0:
        for optimizer_class, kwargs in CASES:
            for flavour in ("torch", "shardopt"):
                results[(optimizer_class.__name__, flavour)] = [t.tolist() for t in train(flavour, optimizer_class, kwargs, world)]
    rpc.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    failed = False
    for world in (2, 3):
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(worker, args=(world, free_port(), results), nprocs=world, join=True)
        for optimizer_class, _ in CASES:
            ours = torch.tensor(results[(optimizer_class.__name__, "shardopt")])
            theirs = torch.tensor(results[(optimizer_class.__name__, "torch")])
            start = torch.stack([make_param(10 + i, (4, 3)).detach() for i in range(3)])
            diff = (ours - theirs).abs().max().item()
            moved = (theirs - start).abs().max().item()
            ok = diff <= 1e-6 and moved > 1e-3
            failed |= not ok
            print(f"{'ok ' if ok else 'BAD'} workers={world} {optimizer_class.__name__}: max |shardopt - torch| = {diff:.3g}"
                  f" (the parameters moved by up to {moved:.3g})")
    print("RPC-DIST-OPTIM", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
