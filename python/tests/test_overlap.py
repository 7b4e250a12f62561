"""python/tests/test_overlap.py — config.overlap through the module under mpirun: overlapped steps bitwise equal to plain ones, wait_param/wait_bucket/wait_all, and the refusals (per_bucket with clipping, a Python communicator).

    mpirun -np 2 python python/tests/test_overlap.py

Every rank runs every test in the same order (they are collective).
"""
import sys
import threading
import time

import numpy as np

import shardopt
from support import raises

COMM = shardopt.mpi_world(timeout_seconds=120)

# Sizes that straddle the small buckets below, so a round holds several buckets, some split
# between ranks.
SIZES = [37, 5, 64, 19, 100, 3]
STEPS = 4


def values(seed, n):
    return np.random.default_rng(seed).uniform(-1, 1, n).astype(np.float32)


def grad(step, rank, i):
    # Different on every rank, so the average matters.
    return values(1000 * step + 10 * rank + i, SIZES[i])


def build(overlap, stage=1, partition=shardopt.PartitionStrategy.flat, comm=COMM):
    config = shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.adamw, partition=partition,
                                      bucket_bytes=128, overlap=overlap)
    config.stage = stage
    params = [(f"p{i}", values(i, n)) for i, n in enumerate(SIZES)]
    return shardopt.ZeroOptimizer(comm, [{"params": params, "lr": 0.01}], config)


def params_bytes(opt):
    return [np.array(opt.param_view(i)).tobytes() for i in range(len(SIZES))]


def run_plain(stage):
    opt = build(shardopt.OverlapPolicy.off, stage)
    for step in range(STEPS):
        for i in reversed(range(len(SIZES))):
            if stage == 1:
                opt.grad_view(i)[:] = grad(step, COMM.rank, i)
            else:
                opt.reduce_gradient(i, grad(step, COMM.rank, i))
        opt.reduce_gradients()
        opt.step()
    return params_bytes(opt)


def run_overlapped(policy, stage, hand_over, partition=shardopt.PartitionStrategy.flat):
    """Gradients handed over in backward order (last param first), as a backward hook would;
    the next forward waits per param in forward order before reading it."""
    opt = build(policy, stage, partition)
    assert opt.config.overlap == policy
    for step in range(STEPS):
        for i in reversed(range(len(SIZES))):
            if hand_over == "grad_ready":
                opt.grad_view(i)[:] = grad(step, COMM.rank, i)
                opt.grad_ready(i)
            else:
                opt.reduce_gradient(i, grad(step, COMM.rank, i))
        opt.reduce_gradients()
        opt.step()
        for i in range(len(SIZES)):
            opt.wait_param(i)  # returns once param i's new values have landed
    result = params_bytes(opt)
    opt.wait_all()
    assert opt.param_step(0) == STEPS
    return result


def test_overlap_config_field_and_enum():
    config = shardopt.OptimizerConfig()
    assert config.overlap == shardopt.OverlapPolicy.off  # the default: step() syncs everything
    config.overlap = shardopt.OverlapPolicy.per_bucket
    assert config.overlap == shardopt.OverlapPolicy.per_bucket
    assert shardopt.OptimizerConfig(overlap=shardopt.OverlapPolicy.after_backward).overlap == \
        shardopt.OverlapPolicy.after_backward
    assert {p.name for p in shardopt.OverlapPolicy} == {"off", "after_backward", "per_bucket"}


def test_after_backward_equals_plain_bitwise_stage1_and_2():
    for stage in (1, 2):
        plain = run_plain(stage)
        hand_overs = ("grad_ready", "reduce_gradient") if stage == 1 else ("reduce_gradient",)
        for hand_over in hand_overs:
            got = run_overlapped(shardopt.OverlapPolicy.after_backward, stage, hand_over)
            assert got == plain, (stage, hand_over)


def test_per_bucket_equals_plain_bitwise_stage1_and_2():
    for stage in (1, 2):
        plain = run_plain(stage)
        hand_over = "grad_ready" if stage == 1 else "reduce_gradient"
        got = run_overlapped(shardopt.OverlapPolicy.per_bucket, stage, hand_over)
        assert got == plain, stage


def test_sorted_greedy_overlapped_equals_plain():
    plain = build(shardopt.OverlapPolicy.off, partition=shardopt.PartitionStrategy.sorted_greedy)
    for step in range(STEPS):
        for i in range(len(SIZES)):
            plain.grad_view(i)[:] = grad(step, COMM.rank, i)
        plain.reduce_gradients()
        plain.step()
    for policy in (shardopt.OverlapPolicy.after_backward, shardopt.OverlapPolicy.per_bucket):
        got = run_overlapped(policy, 1, "grad_ready", shardopt.PartitionStrategy.sorted_greedy)
        assert got == params_bytes(plain), policy


def test_overlapped_steps_differ_from_the_start():
    # The comparison above would pass if neither optimizer moved: make sure they did.
    opt = build(shardopt.OverlapPolicy.off)
    assert params_bytes(opt) != run_plain(1)


def test_wait_bucket_and_num_buckets():
    opt = build(shardopt.OverlapPolicy.after_backward)
    buckets = opt.num_buckets()
    # 128-byte buckets over 228 f32 params: at least ceil(912 / 128) = 8 of them.
    assert buckets >= 8, buckets
    for i in reversed(range(len(SIZES))):
        opt.grad_view(i)[:] = grad(0, COMM.rank, i)
        opt.grad_ready(i)
    opt.reduce_gradients()
    opt.step()
    for b in range(buckets):
        opt.wait_bucket(b)
    message = raises(lambda: opt.wait_bucket(buckets))
    assert str(buckets) in message, message
    opt.wait_all()


def test_waits_release_the_gil():
    # The first grad_ready of a round waits for every rank to open it. Rank 1 opens it late, so
    # rank 0 waits inside grad_ready for about DELAY seconds; a Python thread that ticks every
    # millisecond must tick in the middle of that wait, which it cannot if the call holds the
    # GIL (a thread switch can only happen before the call enters C++, not inside it).
    DELAY = 0.5
    opt = build(shardopt.OverlapPolicy.after_backward)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        last = len(SIZES) - 1
        opt.grad_view(last)[:] = grad(0, COMM.rank, last)
        if COMM.rank == 1:
            time.sleep(DELAY)
        begin = time.monotonic()
        opt.grad_ready(last)
        end = time.monotonic()
        for i in reversed(range(last)):
            opt.grad_view(i)[:] = grad(0, COMM.rank, i)
            opt.grad_ready(i)
        opt.reduce_gradients()
        opt.step()
        opt.wait_all()
    finally:
        stop.set()
        thread.join()
    if COMM.rank == 0 and COMM.size > 1:
        assert end - begin > DELAY / 2, f"grad_ready waited only {end - begin:.3f} s for the late rank"
        inside = [t for t in ticks if begin + 0.05 < t < end - 0.05]
        assert len(inside) > 10, f"the other thread ticked {len(inside)} times during grad_ready's wait"


def test_per_bucket_refuses_clipping_with_the_reason():
    opt = build(shardopt.OverlapPolicy.per_bucket)
    message = raises(lambda: opt.clip_grad_norm(1.0))
    assert "per_bucket" in message and "cannot clip" in message and "after_backward" in message, message
    # after_backward clips, and equals the plain path's clipped step.
    results = []
    for policy in (shardopt.OverlapPolicy.off, shardopt.OverlapPolicy.after_backward):
        opt = build(policy)
        for i in reversed(range(len(SIZES))):
            opt.grad_view(i)[:] = 10 * grad(0, COMM.rank, i)
            opt.grad_ready(i)
        opt.reduce_gradients()
        norm = opt.clip_grad_norm(1.0)
        assert norm > 1.0, norm
        opt.step()
        opt.wait_all()
        results.append((norm, params_bytes(opt)))
    assert results[0] == results[1]


def test_external_storage_refused():
    config = shardopt.OptimizerConfig(storage=shardopt.Storage.external, overlap=shardopt.OverlapPolicy.after_backward)
    w, g = np.ones(8, np.float32), np.zeros(8, np.float32)
    message = raises(lambda: shardopt.ZeroOptimizer(COMM, [{"params": [("w", w, g)]}], config))
    assert "bucket_view" in message, message


class _PythonOverMpi:
    """A communicator implemented in Python (the protocol of shardopt/_torch_comm.py), moving its
    bytes through the MPI communicator's bound collectives: a Python communicator without torch."""

    def rank(self):
        return COMM.rank

    def size(self):
        return COMM.size

    def backend(self):
        return "python-over-mpi"

    def barrier(self):
        COMM.barrier()  # complete: None is a finished collective

    def __getattr__(self, name):  # broadcast, all_gather, all_reduce, ...: the *_async form
        collective = getattr(COMM, name + "_async")
        return lambda *args: collective(*[_DlpackCapsule.wrap(a) for a in args])


class _DlpackCapsule:
    """Buffers the library hands over as bare DLPack capsules (bytes, bf16), given __dlpack__."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    @staticmethod
    def wrap(arg):
        is_capsule = type(arg).__name__ == "PyCapsule"
        return _DlpackCapsule(arg) if is_capsule else arg


def test_python_communicator_refuses_overlap_clearly_on_every_rank():
    comm = shardopt.python_communicator(_PythonOverMpi())
    for policy in (shardopt.OverlapPolicy.after_backward, shardopt.OverlapPolicy.per_bucket):
        message = raises(lambda: build(policy, comm=comm), code="unsupported")
        assert "implemented in Python" in message and "overlap = off" in message and "mpi_world" in message, message
    # Without overlap the same communicator trains, bitwise as over MPI.
    opt = build(shardopt.OverlapPolicy.off, comm=comm)
    for step in range(STEPS):
        for i in range(len(SIZES)):
            opt.grad_view(i)[:] = grad(step, COMM.rank, i)
        opt.reduce_gradients()
        opt.step()
    assert params_bytes(opt) == run_plain(1)


def main():
    from support import run_tests
    return run_tests(globals(), COMM.rank)


if __name__ == "__main__":
    sys.exit(main())
