"""python/tests/test_muon.py — Muon and an algorithm per param group through the binding: group dicts with "algorithm", shapes from the arrays, Muon's keys, and the torch drop-in's torch.optim.Muon where torch has it.

    mpirun -np 2 python python/tests/test_muon.py
"""
import sys

import numpy as np

import shardopt
from support import raises, run_tests

COMM = shardopt.mpi_world(timeout_seconds=60)


def values(seed, shape):
    # Multiples of 2^-12: the ranks' identical gradients average to themselves at any world size.
    return (np.round(np.random.default_rng(seed).uniform(-1, 1, shape) * 4096) / 4096).astype(np.float32)


def train(groups, steps=3, config=None):
    opt = shardopt.ZeroOptimizer(COMM, groups, config or shardopt.OptimizerConfig())
    for s in range(steps):
        for i in range(opt.num_params()):
            seed = 100 + 10 * s + sum(map(ord, opt.param_name(i)))  # by name: the same in every optimizer
            opt.grad_view(i)[:] = values(seed, opt.grad_view(i).shape).reshape(-1)
        opt.reduce_gradients()
        opt.step()
    return opt


def test_mixed_groups_equal_one_optimizer_per_algorithm():
    w, b = values(1, (6, 4)), values(2, 9)
    mixed = train([{"params": [("b", b.copy())], "algorithm": "adamw", "lr": 0.01},
                   {"params": [("w", w.copy())], "algorithm": "muon", "lr": 0.02, "adjust_lr_fn": "match_rms_adamw",
                    "ns_steps": 4}])
    assert mixed.group_algorithm(1) == shardopt.Algorithm.muon and mixed.group_algorithm(0) == shardopt.Algorithm.adamw
    config = shardopt.OptimizerConfig()
    config.algorithm = shardopt.Algorithm.adamw
    adamw = train([{"params": [("b", b.copy())], "lr": 0.01}], config=config)
    config = shardopt.OptimizerConfig()
    config.algorithm = shardopt.Algorithm.muon
    muon = train([{"params": [("w", w.copy())], "lr": 0.02, "adjust_lr_fn": "match_rms_adamw", "ns_steps": 4}],
                 config=config)
    assert np.array_equal(mixed.param_view(0), adamw.param_view(0))
    assert np.array_equal(mixed.param_view(1), muon.param_view(0))
    assert not np.array_equal(mixed.param_view(1), w.reshape(-1))
    assert mixed.hyperparams(1)["adjust_lr_fn"] == "match_rms_adamw" and mixed.hyperparams(1)["ns_steps"] == 4


def test_muon_refuses_a_vector_by_name():
    message = raises(lambda: shardopt.ZeroOptimizer(COMM, [{"params": [("v", values(3, 8))], "algorithm": "muon"}]))
    assert "'v'" in message and "2-D parameters only" in message


def test_last_step_reports_newton_schulz_time():
    # Three 24 x 16 matrices beside a vector: each orthogonalised once, by its owner.
    groups = [{"params": [(f"w{i}", values(7 + i, (24, 16))) for i in range(3)], "algorithm": "muon"},
              {"params": [("b", values(11, 5))], "algorithm": "adamw"}]
    opt = shardopt.ZeroOptimizer(COMM, groups)
    assert opt.last_step().newton_schulz_seconds == 0.0  # before any step
    opt = train(groups, steps=1)
    report = opt.last_step()
    assert 0.0 <= report.newton_schulz_seconds <= report.update_seconds
    total = np.array([report.newton_schulz_seconds], dtype=np.float32)  # the collectives take 16/32-bit floats
    COMM.all_reduce(total, "sum")
    assert 0.0 < total[0] < 60.0
    adamw_only = train([{"params": [("b", values(11, 5))], "algorithm": "adamw"}], steps=1)
    assert adamw_only.last_step().newton_schulz_seconds == 0.0 and adamw_only.last_step().update_seconds >= 0.0


def test_torch_muon_dropin():
    try:
        import torch
    except ImportError:
        return
    if not hasattr(torch.optim, "Muon"):
        return  # torch before 2.9: nothing to compare against
    from support import init_gloo_over_mpi_ranks
    from shardopt.torch import ZeroRedundancyOptimizer
    init_gloo_over_mpi_ranks(COMM.rank, COMM.size)
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.from_numpy(values(5 + i, (5, 3 + i)))) for i in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    zero = ZeroRedundancyOptimizer(ours, optimizer_class=torch.optim.Muon, lr=0.02)
    reference = torch.optim.Muon(theirs, lr=0.02)
    for s in range(3):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            g = torch.from_numpy(values(50 + 10 * s + i, tuple(a.shape)))
            a.grad, b.grad = g.clone(), g.clone()
        zero.step()
        reference.step()
    for a, b in zip(ours, theirs):  # torch runs Newton-Schulz in bf16 with other GEMMs
        assert torch.allclose(a, b, atol=2e-4), (a - b).abs().max()


if __name__ == "__main__":
    sys.exit(run_tests(globals(), COMM.rank))
