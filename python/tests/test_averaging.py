"""python/tests/test_averaging.py — model averaging from Python: torch's PeriodicModelAverager / HierarchicalModelAverager and PostLocalSGDOptimizer over ZeroOptimizers, state dicts with torch's step key and warning, checkpoints, the outer optimizer.

    mpirun -np 2 python -m pytest -q python/tests/test_averaging.py
    mpirun -np 2 python python/tests/test_averaging.py      # without pytest

Every rank runs every test in the same order (construction, steps and averaging are collective).
Each rank is a replica of its own (plain local SGD): its optimizer's communicator is
COMM.split(COMM.rank), and the replicas average over COMM.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

import shardopt
from support import raises

COMM = shardopt.mpi_world(timeout_seconds=120)
SIZES = (13, 4)
TORCH_WARNING = "Loaded state dict does not contain a step counter for an averager. Setting step counter to 0."


def initial(i):
    return np.random.default_rng(100 + i).uniform(-1, 1, SIZES[i]).astype(np.float32)


def grad(i, step, rank):
    """This rank's gradient: different on every rank, so that the replicas drift apart."""
    return np.random.default_rng(1000 + 97 * i + 13 * step + 7919 * rank).uniform(-1, 1, SIZES[i]).astype(np.float32)


def replica_optimizer(algorithm=shardopt.Algorithm.sgd, lr=0.5):
    """A ZeroOptimizer over a replica of this rank alone, with the same initial values everywhere."""
    replica = COMM.split(COMM.rank)
    groups = [{"params": [(f"p{i}", initial(i)) for i in range(len(SIZES))], "lr": lr}]
    return shardopt.ZeroOptimizer(replica, groups, shardopt.OptimizerConfig(algorithm=algorithm))


def write_grads(opt, step):
    for i in range(len(SIZES)):
        opt.grad_view(i)[:] = grad(i, step, COMM.rank)


def params(opt):
    return [np.array(opt.param_view(i)) for i in range(len(SIZES))]


def same_bits(a, b):
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def plain_local_sgd(opt, averager, steps, first=0):
    for step in range(first, first + steps):
        write_grads(opt, step)
        opt.reduce_gradients()
        opt.step()
        averager.average_parameters()


def local_sgd(plsgd, steps, first=0):
    for step in range(first, first + steps):
        write_grads(plsgd.optimizer, step)
        plsgd.reduce_gradients()
        plsgd.step()


# ---- configs -------------------------------------------------------------------------------


def test_averager_configs_as_torch_names_them():
    periodic = shardopt.periodic_averager(4, warmup_steps=2)
    assert periodic.levels == [(4, 0)] and periodic.warmup_steps == 2 and not periodic.hierarchical
    assert not periodic.outer.enabled
    # The dict's insertion order is the levels' order, as torch keeps it.
    hierarchical = shardopt.hierarchical_averager({2: 1, 8: 4}, warmup_steps=3)
    assert hierarchical.levels == [(2, 1), (8, 4)] and hierarchical.warmup_steps == 3 and hierarchical.hierarchical
    outer = shardopt.OuterOptimizer(lr=0.5)
    assert outer.enabled and outer.lr == 0.5 and outer.momentum == 0.9 and outer.nesterov
    config = shardopt.AveragerConfig(levels=[(3, 0)], outer=dict(lr=0.25, nesterov=False))
    assert config.outer.enabled and config.outer.lr == 0.25 and not config.outer.nesterov
    assert "levels=[(3, 0)]" in repr(config) and "lr=0.25" in repr(config)
    config.levels = [(1, 0)]
    assert config.levels == [(1, 0)]
    try:
        shardopt.hierarchical_averager([(2, 1)])
        raise AssertionError("a list was accepted as period_group_size_dict")
    except shardopt.Error as e:
        assert "period_group_size_dict must be a dict" in str(e), str(e)
    try:
        shardopt.AveragerConfig(levels=[(1, 0)], outer=dict(learning_rate=1.0))
        raise AssertionError("an unknown outer key was accepted")
    except shardopt.Error as e:
        assert "unknown outer optimizer key 'learning_rate'" in str(e), str(e)


def test_module_does_not_import_torch():
    code = "import sys, shardopt; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- the averagers ---------------------------------------------------------------------------


def test_periodic_averager_averages_every_period():
    opt = replica_optimizer(lr=0.5)
    averager = shardopt.PeriodicModelAverager(COMM, opt, period=2, warmup_steps=1)
    assert isinstance(averager, shardopt.ModelAverager)
    assert averager.replica_size == 1 and averager.num_replicas == COMM.size
    assert averager.step == 0 and averager.next_group_size() == 0  # warmup
    plain_local_sgd(opt, averager, 1)
    assert averager.step == 1 and averager.next_group_size() == COMM.size  # (1 - 1) % 2 == 0
    # Step 1 (the first after warmup) averages: every replica ends at the mean of the replicas,
    # each of which took its own two SGD steps.
    plain_local_sgd(opt, averager, 1, first=1)
    for i, p in enumerate(params(opt)):
        replicas = [initial(i) - 0.5 * grad(i, 0, r) - 0.5 * grad(i, 1, r) for r in range(COMM.size)]
        assert np.allclose(p, np.mean(replicas, axis=0), atol=1e-5), (i, p)
    assert averager.step == 2 and averager.next_group_size() == 0
    if COMM.size > 1:
        assert averager.communication.averages == 1 and averager.communication.averaging_bytes > 0
    averager.step = 6  # torch's `averager.step = n`
    assert averager.step == 6 and averager.next_group_size() == 0
    averager.step = 5
    assert averager.next_group_size() == COMM.size


def test_hierarchical_averager_picks_the_largest_period():
    opt = replica_optimizer()
    levels = {2: 1, 4: COMM.size} if COMM.size > 1 else {2: 1}
    averager = shardopt.HierarchicalModelAverager(COMM, opt, levels, warmup_steps=1)
    assert isinstance(averager, shardopt.ModelAverager) and averager.config.hierarchical
    assert averager.config.levels == list(levels.items())
    expected = []
    for step in range(6):
        averager.step = step
        expected.append(averager.next_group_size())
    # Periods count from step 0, from the warmup on; step 4 falls on both levels and takes the larger.
    if COMM.size > 1:
        assert expected == [0, 0, 1, 0, COMM.size, 0], expected
    else:
        assert expected == [0, 0, 1, 0, 1, 0], expected


def test_bad_averager_arguments_raise_on_every_rank():
    opt = replica_optimizer()
    raises(lambda: shardopt.PeriodicModelAverager(COMM, opt, period=0))
    raises(lambda: shardopt.PeriodicModelAverager(COMM, opt, period=2, warmup_steps=-1))
    raises(lambda: shardopt.HierarchicalModelAverager(COMM, opt, {2: COMM.size + 1}))
    raises(lambda: shardopt.HierarchicalModelAverager(COMM, opt, {}))
    message = raises(lambda: shardopt.PeriodicModelAverager(COMM, "not an optimizer", period=2))
    assert "needs a shardopt.ZeroOptimizer" in message, message
    raises(lambda: shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(0)))
    # The world is still in step: every rank failed in the same calls.
    COMM.barrier()


# ---- PostLocalSGDOptimizer -------------------------------------------------------------------


def test_post_local_sgd_is_the_optimizer_then_the_averager():
    by_hand = replica_optimizer(shardopt.Algorithm.adam, lr=0.01)
    averager = shardopt.ModelAverager(COMM, by_hand, shardopt.periodic_averager(2))
    plain_local_sgd(by_hand, averager, 5)

    opt = replica_optimizer(shardopt.Algorithm.adam, lr=0.01)
    plsgd = shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(2))
    assert plsgd.optimizer is opt
    local_sgd(plsgd, 5)
    assert same_bits(params(opt), params(by_hand))
    assert plsgd.averager.step == 5 and isinstance(plsgd.averager, shardopt.ModelAverager)
    plsgd.averager.step = 6  # torch's postlocal_sgd.averager.step
    assert plsgd.averager.step == 6
    assert plsgd.param_groups[0]["lr"] == 0.01
    counts = plsgd.communication
    assert isinstance(counts, shardopt.CommunicationCounts)
    assert repr(counts) == (f"shardopt.CommunicationCounts(gradient_bytes={counts.gradient_bytes}, "
                            f"averaging_bytes={counts.averaging_bytes}, averages={counts.averages})")
    if COMM.size > 1:
        assert counts.averages == 3 and counts.averaging_bytes > 0


def test_post_local_sgd_warmup_averages_gradients_over_the_world():
    # During warmup every replica steps with the world's average gradient: they stay equal.
    opt = replica_optimizer(lr=0.5)
    plsgd = shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(100, warmup_steps=3))
    start = params(opt)
    local_sgd(plsgd, 1)
    for i, (p, s) in enumerate(zip(params(opt), start)):
        mean = np.mean([grad(i, 0, r) for r in range(COMM.size)], axis=0)
        assert np.allclose(p, s - 0.5 * mean, atol=1e-6)
    if COMM.size > 1:
        assert plsgd.communication.gradient_bytes > 0


def test_step_with_closure_returns_the_loss():
    opt = replica_optimizer()
    plsgd = shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(1))
    calls = []

    def closure():
        calls.append(1)
        write_grads(opt, 0)
        plsgd.reduce_gradients()
        return 1.5

    assert plsgd.step(closure) == 1.5 and calls == [1]
    assert plsgd.step() is None


def test_outer_optimizer_options():
    opt = replica_optimizer()
    plsgd = shardopt.PostLocalSGDOptimizer(
        COMM, opt, shardopt.periodic_averager(2), outer=dict(lr=0.5, momentum=0.0, nesterov=False)
    )
    outer = plsgd.averager.config.outer
    assert outer.enabled and outer.lr == 0.5 and outer.momentum == 0.0 and not outer.nesterov
    # With lr 1 and no momentum the outer step lands on the plain average.
    plain = replica_optimizer()
    plain_plsgd = shardopt.PostLocalSGDOptimizer(COMM, plain, shardopt.periodic_averager(2))
    unit = replica_optimizer()
    unit_plsgd = shardopt.PostLocalSGDOptimizer(
        COMM, unit, shardopt.periodic_averager(2), outer=shardopt.OuterOptimizer(lr=1.0, momentum=0.0, nesterov=False)
    )
    local_sgd(plain_plsgd, 4)
    local_sgd(unit_plsgd, 4)
    for p, q in zip(params(plain), params(unit)):
        assert np.allclose(p, q, atol=1e-6)
    # outer=False switches off one the config enables.
    config = shardopt.periodic_averager(2)
    config.outer = shardopt.OuterOptimizer()
    off = shardopt.PostLocalSGDOptimizer(COMM, replica_optimizer(), config, outer=False)
    assert not off.averager.config.outer.enabled


def test_state_dict_has_torch_step_and_warns_without_it():
    opt = replica_optimizer(shardopt.Algorithm.adam, lr=0.01)
    plsgd = shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(2))
    local_sgd(plsgd, 3)
    plsgd.consolidate_state_dict(0)  # every rank is rank 0 of its replica
    sd = plsgd.state_dict()
    assert sd["step"] == 3 and sd["algorithm"] == "adam" and sd["param_names"] == ["p0", "p1"]
    assert sd["state"][0]["step"] == 3 and sd["state"][0]["exp_avg"].shape == (SIZES[0],)

    plsgd.averager.step = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plsgd.load_state_dict(sd)
    assert not caught, [str(w.message) for w in caught]
    assert plsgd.averager.step == 3

    del sd["step"]  # a plain optimizer's dict
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plsgd.load_state_dict(sd)
    assert [str(w.message) for w in caught] == [TORCH_WARNING], [str(w.message) for w in caught]
    assert issubclass(caught[0].category, UserWarning)
    assert plsgd.averager.step == 0


def test_save_and_load_round_trip():
    directory = os.path.join(tempfile.gettempdir(), f"shardopt_python_averaging_np{COMM.size}_{os.getuid()}")
    if COMM.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    COMM.barrier()
    opt = replica_optimizer(shardopt.Algorithm.adam, lr=0.01)
    plsgd = shardopt.PostLocalSGDOptimizer(COMM, opt, shardopt.periodic_averager(2), outer=dict(lr=0.7))
    local_sgd(plsgd, 3)
    plsgd.save(directory)
    saved = params(opt)
    local_sgd(plsgd, 3, first=3)
    continued = params(opt)
    assert not same_bits(saved, continued)
    plsgd.load(directory)
    assert same_bits(params(opt), saved) and plsgd.averager.step == 3
    local_sgd(plsgd, 3, first=3)
    assert same_bits(params(opt), continued)


def main():
    from support import run_tests
    return run_tests(globals(), COMM.rank)


if __name__ == "__main__":
    sys.exit(main())
