"""python/tests/test_module.py — the binding under mpirun: DLPack from numpy (and torch when present), views, hyperparameters, errors, state dicts, one rank failing.

    mpirun -np 2 python python/tests/test_module.py

Prints 'N passed, M failed' and exits non-zero if any rank had a failure. Plain asserts, no
pytest: every rank must run every test (they are collective) in the same order.
"""
import os
import shutil
import sys
import tempfile

import numpy as np

import shardopt

COMM = shardopt.mpi_world(timeout_seconds=120)


def values(seed, n):
    return np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)


def test_bucket_view_adam_matches_reference():
    w0, b0 = values(1, 37), values(2, 5)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w0.copy()), ("b", b0.copy())], "lr": 0.01}])
    assert opt.num_params() == 2 and opt.num_groups() == 1
    assert opt.find_param("b") == 1 and opt.param_name(0) == "w"
    view = opt.param_view(0)
    assert isinstance(view, np.ndarray) and view.dtype == np.float32 and view.shape == (37,)
    assert np.array_equal(view, w0)
    for _ in range(3):
        for i in range(2):
            opt.grad_view(i)[:] = 0.1 * (COMM.rank + 1)  # the average differs from each rank's
        opt.reduce_gradients()
        opt.step()
    # Adam with a constant gradient moves each weight by lr per step (bias-corrected m/sqrt(v) = 1).
    assert np.allclose(opt.param_view(0), w0 - 0.03, atol=1e-5)
    assert opt.param_step(0) == 3
    report = opt.memory_report()
    assert report.trainable_numel == 42 and report.state_bytes == 8 * report.shard_numel
    # Printing a report shows its numbers, field by field.
    text = repr(report)
    assert text.startswith("shardopt.MemoryReport(state_bytes=") and text.endswith(f"node_ranks={report.node_ranks})")
    assert f"shard_numel={report.shard_numel}, trainable_numel=42" in text
    step = repr(opt.last_step())
    assert step.startswith("shardopt.StepReport(skipped=False, loss_scale=1.0,") and "newton_schulz_seconds=0.0)" in step
    if COMM.size > 1:
        assert report.shard_numel < 42


def test_node_shared_params_are_one_buffer_per_node():
    w0 = values(3, 100)
    shared = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w0.copy())], "lr": 0.01}])
    config = shardopt.OptimizerConfig()
    assert config.node_shared_params  # the default
    config.node_shared_params = False
    own = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w0.copy())], "lr": 0.01}], config)
    s, o = shared.memory_report(), own.memory_report()
    if COMM.size > 1:  # every rank of these tests is on one node
        assert s.param_bytes == 0 and s.node_shared_param_bytes == o.param_bytes and s.node_ranks == COMM.size
    else:
        assert s.param_bytes == o.param_bytes and s.node_shared_param_bytes == 0 and s.node_ranks == 1
    for opt in (shared, own):
        opt.grad_view(0)[:] = values(4, 100)
        opt.reduce_gradients()
        opt.step()
    assert np.array_equal(shared.param_view(0), own.param_view(0))


def test_external_sgd_updates_caller_buffers_and_live_hyperparams():
    w, g = np.ones(10, np.float32), np.full(10, 2.0, np.float32)
    config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.sgd, storage=shardopt.Storage.external)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w, g)], "lr": 0.5}], config)
    opt.hyperparams(0).lr = 0.25  # live: the next step uses it
    opt.step()
    assert np.allclose(w, 1.0 - 0.25 * 2.0)
    assert opt.hyperparams(0).lr == 0.25
    opt.zero_grad()
    assert not g.any()
    assert opt.config.storage == shardopt.Storage.external


def test_refused_tensors_raise_with_reasons():
    strided = np.ones(20, np.float32)[::2]
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("s", strided)]}])
        raise AssertionError("a strided array was accepted")
    except shardopt.Error as e:
        assert e.code == "invalid_argument" and "not contiguous" in str(e) and "'s'" in str(e), str(e)
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("r", frozen)]}])
        raise AssertionError("a read-only array was accepted")
    except BufferError:
        pass  # numpy < 2.1 refuses to export it at all
    except shardopt.Error as e:
        assert "read-only" in str(e), str(e)  # numpy >= 2.1 flags it, shardopt refuses it
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("d", np.ones(4, np.float64))]}])
        raise AssertionError("float64 was accepted")
    except shardopt.Error as e:
        assert e.code == "unsupported" and "float64" in str(e), str(e)
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("x", [1.0, 2.0])]}])
        raise AssertionError("a list was accepted")
    except shardopt.Error as e:
        assert "__dlpack__" in str(e), str(e)
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("w", np.ones(4, np.float32))], "learning_rate": 1.0}])
        raise AssertionError("an unknown key was accepted")
    except shardopt.Error as e:
        assert "unknown param group key 'learning_rate'" in str(e), str(e)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", np.ones(4, np.float32))]}])
    try:
        opt.find_param("missing")
        raise AssertionError("find_param did not raise")
    except shardopt.Error as e:
        assert e.code == "invalid_argument"


def test_one_rank_failing_fails_everyone():
    if COMM.size < 2:
        return
    array = np.ones(8, np.float32)
    if COMM.rank == 1:
        array = np.ones(8, np.float64)  # refused on rank 1 only
    try:
        shardopt.ZeroOptimizer(COMM, [{"params": [("w", array)]}])
        raise AssertionError("no rank should succeed")
    except shardopt.Error as e:
        # Every rank gets rank 1's own reason; the others are told where it happened.
        assert "float64" in str(e), str(e)
        if COMM.rank != 1:
            assert "ZeroOptimizer failed on rank 1" in str(e), str(e)


def test_add_param_group_frozen_and_split():
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("a", values(3, 9))]}])
    index = opt.add_param_group({"params": [("b", values(4, 7))], "lr": 0.1})
    assert index == 1 and opt.num_params() == 2 and opt.hyperparams(1).lr == 0.1
    before = opt.layout_version()
    opt.set_trainable(0, False)
    assert not opt.trainable(0)
    frozen = np.array(opt.param_view(0))
    opt.grad_view(1)[:] = 1.0
    opt.step()
    assert opt.layout_version() != before
    assert np.array_equal(opt.param_view(0), frozen)
    alone = COMM.split(COMM.rank)
    assert alone.size == 1 and alone.rank == 0


def test_state_dict_and_checkpoint_round_trip():
    w0 = values(5, 33)
    opt = shardopt.ZeroOptimizer(COMM, [{"params": [("w", w0.copy())], "betas": (0.8, 0.99)}])
    opt.grad_view(0)[:] = values(6, 33)
    opt.step()
    # Consolidated on every rank in turn (each consolidation replaces the last), so that every
    # rank gets the whole dict.
    sd = None
    for to in range(COMM.size):
        opt.consolidate_state_dict(to)
        if COMM.rank == to:
            sd = opt.state_dict()
    assert sd["algorithm"] == "adam" and sd["param_names"] == ["w"]
    assert sd["state"][0]["step"] == 1 and sd["state"][0]["exp_avg"].shape == (33,)
    assert sd["param_groups"][0]["betas"] == (0.8, 0.99) and sd["param_groups"][0]["params"] == [0]
    sd["state"][0]["exp_avg"][:] = 0.5
    opt.load_state_dict(sd)  # each rank keeps its share
    opt.consolidate_state_dict(0)
    if COMM.rank == 0:
        assert np.all(opt.state_dict()["state"][0]["exp_avg"] == 0.5)

    directory = os.path.join(tempfile.gettempdir(), f"shardopt_python_test_np{COMM.size}_{os.getuid()}")
    if COMM.rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    COMM.barrier()
    saved = np.array(opt.param_view(0))
    opt.save(directory)
    opt.grad_view(0)[:] = 1.0
    opt.step()
    assert not np.array_equal(opt.param_view(0), saved)
    opt.load(directory)
    assert np.array_equal(opt.param_view(0), saved) and opt.param_step(0) == 1

    # A background save of this state; a step goes on before wait_save commits it.
    opt.save_async(directory)
    opt.grad_view(0)[:] = 1.0
    opt.step()
    assert not np.array_equal(opt.param_view(0), saved) and opt.param_step(0) == 2
    opt.wait_save()
    opt.load(directory)
    assert np.array_equal(opt.param_view(0), saved) and opt.param_step(0) == 1


def test_torch_tensors_when_available():
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)  # the same initial values on every rank
    model = torch.nn.Linear(4, 3)
    before = [p.detach().clone() for p in model.parameters()]
    config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.sgd, storage=shardopt.Storage.external)
    opt = shardopt.ZeroOptimizer(COMM, [shardopt.torch_param_group(model, lr=0.5)], config)
    for p in model.parameters():
        p.grad.fill_(1.0)
    opt.step()
    for p, b in zip(model.parameters(), before):
        assert torch.allclose(p.detach(), b - 0.5)
    view = torch.from_dlpack(opt.param_view(0))  # external: the torch parameter's own memory
    assert view.data_ptr() == model.weight.data_ptr()


def main():
    from support import run_tests
    return run_tests(globals(), COMM.rank)


if __name__ == "__main__":
    sys.exit(main())
