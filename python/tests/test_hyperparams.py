"""python/tests/test_hyperparams.py — live group hyperparameters (HyperparamsView) and torch's defaults/inheritance for param-group dicts and keyword hyperparameters.

    mpirun -np 2 python -m pytest -q python/tests/test_hyperparams.py
    mpirun -np 2 python python/tests/test_hyperparams.py      # without pytest

Every rank runs every test in the same order (construction and add_param_group are collective).
"""
import gc
import sys

import numpy as np

import shardopt
from support import raises

COMM = shardopt.mpi_world(timeout_seconds=120)
SGD_EXTERNAL = dict(algorithm=shardopt.Algorithm.sgd, storage=shardopt.Storage.external)


def external_param(name, n, value=1.0, grad=1.0):
    return (name, np.full(n, value, np.float32), np.full(n, grad, np.float32))


# ---- (a) opt.hyperparams(g) is a live view, never a reference into the optimizer's storage -----


def test_view_written_after_add_param_group_reaches_the_step():
    w = external_param("w", 6)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [w], "lr": 0.5}], shardopt.OptimizerConfig(**SGD_EXTERNAL))
    view = opt.hyperparams(0)
    assert isinstance(view, shardopt.HyperparamsView) and view.group == 0
    # Enough groups to move any storage that held group 0 before.
    for i in range(24):
        opt.add_param_group({"params": [external_param(f"extra{i}", 3)], "lr": 0.01 * (i + 1)})
    view.lr = 0.25
    assert opt.hyperparams(0).lr == 0.25 and view.lr == 0.25
    assert opt.hyperparams(24).lr == 0.24  # the other groups are untouched
    opt.step()
    assert np.allclose(w[1], 1.0 - 0.25 * 1.0)


def test_view_keeps_its_optimizer_alive():
    def make():
        return shardopt.ZeroOptimizer(COMM, [{"params": [external_param("w", 4)]}],
                                      shardopt.OptimizerConfig(**SGD_EXTERNAL)).hyperparams(0)

    view = make()
    gc.collect()
    view.lr = 0.125  # the optimizer is only reachable through the view
    assert view.lr == 0.125 and view.momentum == 0.0


def test_view_repr_equality_and_dict_access():
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [external_param("a", 4)], "lr": 0.5},
                                        {"params": [external_param("b", 4)], "lr": 0.5}],
                                 shardopt.OptimizerConfig(**SGD_EXTERNAL))
    a, b = opt.hyperparams(0), opt.hyperparams(1)
    assert repr(a).startswith("<shardopt.HyperparamsView group 0: lr=0.5, betas=(0.9, 0.999)"), repr(a)
    # Equal by value: another view, a detached copy, or a param-group-style dict of every key.
    assert a == b and a == opt.hyperparams(0) and a == a.get() and a.get() == a
    assert a == a.as_dict() and a.as_dict()["lr"] == 0.5
    b.momentum = 0.9
    assert a != b and a != 0.5
    copy = a.get()
    a.lr = 0.75
    assert copy.lr == 0.5 and copy != a  # get() is detached
    try:
        hash(a)
        raise AssertionError("a mutable view must not be hashable")
    except TypeError:
        pass
    # torch's idiom for schedules: param_groups[g]["lr"].
    for group in opt.param_groups:
        group["lr"] = 0.0625
    assert opt.hyperparams(0).lr == 0.0625 and opt.hyperparams(1)["lr"] == 0.0625
    a["betas"] = (0.8, 0.95)
    assert a.betas == (0.8, 0.95) and a.beta1 == 0.8
    assert "unknown hyperparameter 'learning_rate'" in raises(lambda: a.__getitem__("learning_rate"))


def test_view_refuses_bad_values_and_missing_groups():
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [external_param("w", 4)], "lr": 0.5}],
                                 shardopt.OptimizerConfig(**SGD_EXTERNAL))
    view = opt.hyperparams(0)

    def negative_lr():
        view.lr = -1.0

    assert "invalid lr -1" in raises(negative_lr)
    assert view.lr == 0.5  # a refused value changes nothing

    def nesterov_without_momentum():
        view.nesterov = True

    assert "nesterov" in raises(nesterov_without_momentum)
    assert "param group 3 does not exist" in raises(lambda: opt.hyperparams(3))


# ---- (b) defaults: torch's per algorithm, keyword hyperparameters, inheritance ------------------


def test_group_dict_without_a_key_takes_torchs_default_for_the_algorithm():
    config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.adamw)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", np.ones(5, np.float32))], "lr": 0.01}], config)
    assert opt.hyperparams(0).weight_decay == 0.01  # AdamW's own default, not Adam's 0
    assert opt.hyperparams(0).lr == 0.01
    assert opt.defaults == shardopt.default_hyperparams(shardopt.Algorithm.adamw)
    adam = shardopt.ZeroOptimizer(COMM, [{"params": [("w", np.ones(5, np.float32))]}])
    assert adam.hyperparams(0).weight_decay == 0.0


def test_keyword_hyperparameters_are_the_defaults_that_groups_inherit():
    config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.adam)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("a", np.ones(4, np.float32))], "lr": 0.5}], config,
                                 lr=0.1, amsgrad=True, betas=(0.8, 0.99))
    assert opt.defaults.lr == 0.1 and opt.defaults.amsgrad and opt.defaults.beta1 == 0.8
    first = opt.hyperparams(0)
    assert first.lr == 0.5 and first.amsgrad and first.betas == (0.8, 0.99)  # its own lr, the rest inherited
    index = opt.add_param_group({"params": [("b", np.ones(3, np.float32))], "weight_decay": 0.2})
    added = opt.hyperparams(index)
    assert added.lr == 0.1 and added.amsgrad and added.weight_decay == 0.2 and added.beta2 == 0.99
    # Changing a group later does not change what later groups inherit.
    first.lr = 0.3
    later = opt.add_param_group({"params": [("c", np.ones(2, np.float32))]})
    assert opt.hyperparams(later).lr == 0.1
    assert config.defaults is None  # the caller's config is not modified


def test_config_defaults_with_keywords_over_them():
    base = shardopt.Hyperparams()
    base.lr = 0.2
    base.momentum = 0.9
    config = shardopt.OptimizerConfig(**SGD_EXTERNAL)
    config.defaults = base
    assert config.defaults == base
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [external_param("w", 4, grad=2.0)]}], config, lr=0.05)
    assert opt.defaults.lr == 0.05 and opt.defaults.momentum == 0.9
    index = opt.add_param_group({"params": [external_param("v", 4, grad=2.0)]})
    assert opt.hyperparams(index) == opt.defaults
    opt.step()  # the first SGD step with momentum moves by lr * grad
    assert np.allclose(opt.param_view(1), 1.0 - 0.05 * 2.0)
    config.defaults = None
    assert config.defaults is None


def test_bad_keyword_hyperparameters_are_refused_by_name():
    group = [{"params": [("w", np.ones(4, np.float32))]}]
    message = raises(lambda: shardopt.ZeroOptimizer(COMM, group, shardopt.OptimizerConfig(), learning_rate=0.1))
    assert "unknown keyword hyperparameter 'learning_rate'" in message, message
    message = raises(lambda: shardopt.ZeroOptimizer(COMM, [{"params": [("w", np.ones(4, np.float32))]}],
                                                    shardopt.OptimizerConfig(), lr=-1.0))
    assert "defaults: invalid lr -1" in message, message


def main():
    from support import run_tests
    return run_tests(globals(), COMM.rank)


if __name__ == "__main__":
    sys.exit(main())
