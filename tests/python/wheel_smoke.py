"""tests/python/wheel_smoke.py — the installed wheel in a bare venv (numpy only): import, one SGD and one Adam step over every rank, values checked exactly.

    mpirun -n 2 venv/bin/python wheel_smoke.py
"""
import sys

import numpy as np

import shardopt

comm = shardopt.mpi_world(timeout_seconds=20)
rank, size = comm.rank, comm.size

# SGD on the caller's buffers, gradients averaged over ranks: rank r holds (r + 1) * g, so the
# average is g * (size + 1) / 2, and w - lr * that is exact in float for these values.
w = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], np.float32)
g = np.array([0.5, -1.0, 2.0, 0.25, 0.0, 4.0, -8.0], np.float32)
start = w.copy()
config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.sgd, storage=shardopt.Storage.external)
opt = shardopt.ZeroOptimizer(comm, [{"params": [("w", w, g * (rank + 1))], "lr": 0.5}], config)
opt.reduce_gradients()
opt.step()
expected = start - np.float32(0.5) * (g * np.float32((size + 1) / 2))
assert np.array_equal(w, expected), (rank, w, expected)

# Adam in bucket_view storage: a constant gradient moves every weight by lr per step.
adam = shardopt.ZeroOptimizer(comm, [{"params": [("v", np.zeros(33, np.float32))], "lr": 0.125}])
adam.grad_view(0)[:] = 1.0
adam.reduce_gradients()
adam.step()
assert np.allclose(adam.param_view(0), -0.125, rtol=0, atol=1e-6), adam.param_view(0)
assert adam.param_step(0) == 1

print(f"rank {rank} of {size}: ok ({shardopt.__file__})", flush=True)
sys.exit(0)
