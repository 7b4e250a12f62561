"""python/tests/test_views.py — param_view/grad_view arrays kept across a layout change (set_trainable, add_param_group) still read the old buffer, never freed or unmapped memory; new views show the new layout.

    mpirun -np 2 python python/tests/test_views.py
"""
import gc
import sys

import numpy as np

import shardopt

COMM = shardopt.mpi_world(timeout_seconds=60)

# Large enough that the flat buffers are their own mappings: a freed one is unmapped at once, so
# a view that dangled would fault rather than read stale heap memory.
N = 1 << 18


def values(seed, n):
    return np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)


def freeze_first(opt):
    opt.set_trainable(0, False)


def add_group(opt):
    assert opt.add_param_group({"params": [("c", values(23, 1000))], "lr": 0.1}) == 1


def check_kept_views_across(relayout, node_shared):
    config = shardopt.OptimizerConfig()
    config.node_shared_params = node_shared
    w0, b0, g1 = values(20, N), values(21, N // 2), values(22, N // 2)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w0.copy()), ("b", b0.copy())], "lr": 0.01}], config)
    if COMM.size > 1:  # every rank of these tests is on one node
        assert (opt.memory_report().node_shared_param_bytes > 0) == node_shared
    kept_param, kept_grad = opt.param_view(0), opt.grad_view(1)
    kept_grad[:] = g1
    version = opt.layout_version()
    relayout(opt)
    assert opt.layout_version() != version
    gc.collect()
    # The kept arrays still point into the old buffers, which hold the values of the moment of the
    # change (node-shared: still mapped).
    assert np.array_equal(kept_param, w0)
    assert np.array_equal(kept_grad, g1)
    # New views show the new layout: elsewhere, with the values carried over.
    new_param, new_grad = opt.param_view(0), opt.grad_view(1)
    assert new_param.ctypes.data != kept_param.ctypes.data
    assert np.array_equal(new_param, w0) and np.array_equal(new_grad, g1)
    # The kept ones are no longer the parameter: writing them changes nothing the optimizer holds.
    # (A node-shared buffer is one per node: another rank may still be reading the old values.)
    expected = w0
    if not node_shared:
        kept_param[:] = 7.0
        expected = np.full(N, 7.0, dtype=np.float32)
        assert np.array_equal(opt.param_view(0), w0)
    # They outlive the optimizer too.
    del opt, new_param, new_grad
    gc.collect()
    assert np.array_equal(kept_param, expected) and np.array_equal(kept_grad, g1)


def test_views_kept_across_set_trainable():
    check_kept_views_across(freeze_first, node_shared=False)


def test_views_kept_across_set_trainable_node_shared():
    check_kept_views_across(freeze_first, node_shared=True)


def test_views_kept_across_add_param_group():
    check_kept_views_across(add_group, node_shared=False)


def test_views_kept_across_add_param_group_node_shared():
    check_kept_views_across(add_group, node_shared=True)


if __name__ == "__main__":
    from support import run_tests

    sys.exit(run_tests(globals(), COMM.rank))
