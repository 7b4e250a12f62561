"""python/tests/remote_check.py — shardopt.RemoteOptimizer from Python under mpirun (1-3 ranks): an embedding split over the owners, every rank pushing dense and sparse gradients in deterministic order; the pulled values must be numpy's exact SGD result; bad input raises shardopt.Error by name.

    mpirun -n 2 python remote_check.py      (prints "REMOTE-PY ok rank R")

Its own script, not a pytest module: the remote optimizer needs MPI initialised with
MPI_THREAD_MULTIPLE (remote_mpi_world), which must come before any other test initialises MPI.
"""
import sys

import numpy as np

import shardopt


def main():
    comm = shardopt.remote_mpi_world(timeout_seconds=20)
    rank, size = comm.rank, comm.size
    rows, dim, lr = 16, 4, 0.5
    initial = (np.arange(rows * dim, dtype=np.float32) / 8).reshape(rows, dim)
    begin, end = rows * rank // size, rows * (rank + 1) // size
    groups = [dict(algorithm=shardopt.Algorithm.sgd, lr=lr,
                   params=[("emb", rows, dim, begin, end, np.ascontiguousarray(initial[begin:end]))])]
    remote = shardopt.RemoteOptimizer(comm, groups, deterministic=True, timeout_seconds=20)
    emb = remote.lookup("emb")
    ok = True

    expected = initial.copy()
    for step in range(2):
        context = remote.open_context()
        dense = np.full((rows, dim), 1 / 64, dtype=np.float32)
        picked = np.array([rank % rows, (rank + 5) % rows, rank % rows], dtype=np.int64)
        values = np.full((3, dim), 1 / 32, dtype=np.float32)
        remote.push(context, emb, dense)
        remote.push_rows(context, emb, picked, values)
        if step == 0:
            remote.step(context)
        else:
            remote.step_async(context).wait()
        for t in range(size):  # every trainer's gradient, summed as the owners do
            g = np.full((rows, dim), 1 / 64, dtype=np.float32)
            for r in (t % rows, (t + 5) % rows, t % rows):
                g[r] += np.float32(1 / 32)
            expected = expected - np.float32(lr) * g
    comm.barrier()
    pulled = remote.pull(emb)
    if not np.array_equal(pulled, expected):
        print(f"rank {rank}: pulled values differ from numpy's, max {np.abs(pulled - expected).max()}")
        ok = False
    some = remote.pull_rows(emb, np.array([rows - 1, 0], dtype=np.int64))
    ok = ok and np.array_equal(some, expected[[rows - 1, 0]])

    try:
        remote.push_rows(remote.open_context(), emb, np.array([rows], dtype=np.int64), np.zeros((1, dim), np.float32))
        ok = False
    except shardopt.Error as e:
        ok = ok and e.code == "invalid_argument" and f"row {rows} (index 0) is out of range" in str(e)
    try:
        remote.lookup("nope")
        ok = False
    except shardopt.Error as e:
        ok = ok and "no owner registered a parameter named 'nope'" in str(e)
    remote.close()
    print(f"REMOTE-PY {'ok' if ok else 'FAILED'} rank {rank}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
