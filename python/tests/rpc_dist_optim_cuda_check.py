"""python/tests/rpc_dist_optim_cuda_check.py — torch's DistributedOptimizer example with the owners' parameters on CUDA (which torch's own DistributedOptimizer refuses) under shardopt.torch.DistributedOptimizer: the parameters must agree to 1e-6 with the same run on the CPU, at 2 RPC workers, for SGD (momentum), Adam and AdamW.

Run directly on a machine with a CUDA device and a CUDA build of torch and shardopt:
    python rpc_dist_optim_cuda_check.py
Prints one line per case and "RPC-DIST-OPTIM-CUDA ok"; exits 1 on a mismatch. Without a usable
CUDA device it prints "SKIPPED: ..." and exits 77.
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


def make_param(seed, shape, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device).requires_grad_()


def on_cpu(rref):
    """On the owner: its parameter as a CPU tensor, recorded by distributed autograd (the
    gradient flows back through .cpu() to the CUDA parameter), so no RPC device map is needed."""
    return rref.local_value().cpu()


def fetch(rref):
    return rref.local_value().detach().cpu().clone()


def train(device, optimizer_class, kwargs):
    """On worker0: the example, its parameters on worker1 (on `device` there)."""
    from shardopt.torch import DistributedOptimizer

    rrefs = [rpc.remote("worker1", make_param, args=(10 + i, (4, 3), device)) for i in range(2)]
    x = torch.linspace(-1, 1, 12).view(4, 3)
    dist_optim = None
    for step in range(STEPS):
        with dist_autograd.context() as context_id:
            a, b = (rpc.rpc_sync("worker1", on_cpu, args=(r,)) for r in rrefs)
            loss = (a * x).sum() + (b * b).sum() * 0.5 + ((a - b) ** 2).sum() * (step + 1)
            dist_autograd.backward(context_id, [loss])
            if dist_optim is None:
                dist_optim = DistributedOptimizer(optimizer_class, rrefs, **kwargs)
            dist_optim.step(context_id)
    return [rpc.rpc_sync(r.owner(), fetch, args=(r,)) for r in rrefs]


def worker(rank, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=60)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        for optimizer_class, kwargs in CASES:
            for device in ("cpu", "cuda:0"):
                results[(optimizer_class.__name__, device)] = [t.tolist() for t in train(device, optimizer_class, kwargs)]
    rpc.shutdown()


def main():
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device (or is a CPU build)")
        return 77
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(worker, args=(port, results), nprocs=2, join=True)
    failed = False
    for optimizer_class, _ in CASES:
        on_cuda = torch.tensor(results[(optimizer_class.__name__, "cuda:0")])
        on_cpu = torch.tensor(results[(optimizer_class.__name__, "cpu")])
        diff = (on_cuda - on_cpu).abs().max().item()
        ok = diff <= 1e-6
        failed |= not ok
        print(f"{'ok ' if ok else 'BAD'} {optimizer_class.__name__}: max |cuda - cpu| = {diff:.3g}")
    print("RPC-DIST-OPTIM-CUDA", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
