"""python/tests/remote_check.py — shardopt.RemoteOptimizer from Python under mpirun (1-3 ranks): an embedding split over the owners, every rank pushing dense and sparse gradients in deterministic order; the pulled values must be numpy's exact SGD result; bad input raises shardopt.Error by name; push_log_bytes= reaches the owners (a negative or past-int64 cap, or caps unequal across ranks, raise by name on every rank) and stats() counts the pushes' exact bytes, nothing left logged after the steps.

    mpirun -n 2 python remote_check.py      (prints "REMOTE-PY ok rank R")

Its own script, not a pytest module: the remote optimizer needs MPI initialised with
MPI_THREAD_MULTIPLE (remote_mpi_world), which must come before any other test initialises MPI.
"""
import sys

import numpy as np

import shardopt


def refused(comm, groups, fragment, code="invalid_argument", **options):
    """Whether constructing with `options` raises shardopt.Error `code` naming `fragment` here."""
    try:
        shardopt.RemoteOptimizer(comm, groups, deterministic=True, timeout_seconds=20, **options).close()
    except shardopt.Error as e:
        if e.code == code and fragment in str(e):
            return True
        print(f"rank {comm.rank}: {options} raised {e.code}: {e}")
        return False
    print(f"rank {comm.rank}: {options} was accepted")
    return False


def check_push_log_refusals(comm, groups):
    """push_log_bytes reaches the agreed construction: bad caps raise by name on every rank."""
    ok = refused(comm, groups, "RemoteOptions.push_log_bytes is -1", push_log_bytes=-1)
    ok = refused(comm, groups, "push_log_bytes is 9223372036854775808, past the largest int64",
                 push_log_bytes=2**63) and ok
    if comm.rank == 0:  # one rank's bad value: the others raise too, naming it
        ok = refused(comm, groups, "push_log_bytes must be an int, not float", push_log_bytes=1.5) and ok
    else:
        ok = refused(comm, groups, "push_log_bytes must be an int, not float", push_log_bytes=1000) and ok
    if comm.size > 1:
        ok = refused(comm, groups, "ranks disagree on RemoteOptions.push_log_bytes: rank 0 has 1000, rank 1 has 2000",
                     code="mismatch", push_log_bytes=1000 if comm.rank == 0 else 2000) and ok
    return ok


def main():
    comm = shardopt.remote_mpi_world(timeout_seconds=20)
    rank, size = comm.rank, comm.size
    rows, dim, lr = 16, 4, 0.5
    initial = (np.arange(rows * dim, dtype=np.float32) / 8).reshape(rows, dim)
    begin, end = rows * rank // size, rows * (rank + 1) // size
    groups = [dict(algorithm=shardopt.Algorithm.sgd, lr=lr,
                   params=[("emb", rows, dim, begin, end, np.ascontiguousarray(initial[begin:end]))])]
    ok = check_push_log_refusals(comm, groups)
    # A cap past one push (its 48 payload bytes and header): pushes are logged, then summed.
    remote = shardopt.RemoteOptimizer(comm, groups, deterministic=True, timeout_seconds=20, push_log_bytes=1000)
    emb = remote.lookup("emb")

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
    # Each trainer's context reached each owner as the dense push (its rows of 4 f32) and, when
    # any of its 3 rows are the owner's, a push of those (an int64 index and 4 f32 each).
    stats = remote.stats()
    dense_bytes = (end - begin) * dim * 4
    mine = [sum(begin <= r < end for r in (t % rows, (t + 5) % rows, t % rows)) for t in range(size)]
    row_pushes = sum(1 for m in mine if m > 0)
    expected_stats = dict(pushes_received=2 * (size + row_pushes), logged_bytes=0, open_contexts=0,
                          accumulator_bytes=0, contexts_applied=2 * size,
                          bytes_received=2 * (size * dense_bytes + 24 * sum(mine)))
    got = {k: stats[k] for k in expected_stats}
    if got != expected_stats:
        print(f"rank {rank}: stats {got}, expected {expected_stats}")
        ok = False
    print(f"REMOTE-PY {'ok' if ok else 'FAILED'} rank {rank}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
