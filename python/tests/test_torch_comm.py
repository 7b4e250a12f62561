"""python/tests/test_torch_comm.py — the communicator over a torch.distributed process group (gloo) against shardopt's MPI communicator: the same bits from every collective, errors, split, and a ZeroOptimizer over it.

    mpirun -np 2 python -m pytest -q python/tests/test_torch_comm.py   (or run it as a script)

torch.distributed (gloo) runs over the ranks mpirun started, beside MPI, so that both
communicators see the same inputs. Every rank runs every test in the same order.
"""
import sys
import time
from datetime import timedelta

try:
    import torch
except ImportError:
    torch = None

if torch is None:
    if __name__ == "__main__":
        print("test_torch_comm: skipped: torch cannot be imported", flush=True)
        sys.exit(0)
    import pytest

    pytest.skip("torch cannot be imported: the torch communicator's tests need it", allow_module_level=True)

import torch.distributed as dist

import shardopt
from shardopt._torch_comm import TorchDistCommunicator
from support import init_gloo_over_mpi_ranks, raises, run_tests

MPI = shardopt.mpi_world(timeout_seconds=120)
RANK, WORLD = MPI.rank, MPI.size
init_gloo_over_mpi_ranks(RANK, WORLD)
TORCH = shardopt.torch_communicator()

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.uint8: torch.uint8}


def rank_values(dtype, n, seed=0, rank=RANK):
    """Values that differ by rank and whose sums and averages round (so a wrong order or a
    division done differently shows in the bits)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return (torch.randn(n, generator=g) * 3).to(dtype)


def same_bits(a, b):
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def test_identity_of_the_torch_communicator():
    assert (TORCH.rank, TORCH.size) == (RANK, WORLD)
    assert TORCH.backend == "torch.distributed (gloo)" and TORCH.device == "cpu" and MPI.device == "cpu"
    assert "torch.distributed (gloo)" in repr(TORCH)


def test_all_reduce_gives_the_mpi_bits():
    for dtype in DTYPES:
        for op in ("sum", "avg", "max"):
            ours, theirs = rank_values(dtype, 257, seed=1), rank_values(dtype, 257, seed=1)
            TORCH.all_reduce(ours, op)
            MPI.all_reduce(theirs, op)
            assert same_bits(ours, theirs), (dtype, op)
            if WORLD > 1:  # the reduction did something: this rank's values changed
                assert not same_bits(ours, rank_values(dtype, 257, seed=1)), (dtype, op)


def test_reduce_scatter_gives_the_mpi_bits():
    for dtype in DTYPES:
        for op in ("sum", "avg", "max"):
            send = rank_values(dtype, 33 * WORLD, seed=2)
            ours, theirs = torch.zeros(33, dtype=dtype), torch.zeros(33, dtype=dtype)
            TORCH.reduce_scatter(send, ours, op)
            MPI.reduce_scatter(send, theirs, op)
            assert same_bits(ours, theirs), (dtype, op)
            assert same_bits(send, rank_values(dtype, 33 * WORLD, seed=2))  # send untouched


def test_reduce_gives_the_mpi_bits_on_the_root_and_leaves_send_alone():
    for dtype in DTYPES:
        for root in sorted({0, WORLD - 1}):
            for op in ("sum", "avg"):
                send = rank_values(dtype, 40, seed=3)
                ours, theirs = torch.full((40,), 7.0, dtype=dtype), torch.full((40,), 7.0, dtype=dtype)
                TORCH.reduce(send, ours, op, root)
                MPI.reduce(send, theirs, op, root)
                assert same_bits(send, rank_values(dtype, 40, seed=3))
                if RANK == root:
                    assert same_bits(ours, theirs), (dtype, root, op)
                # In place on the root.
                ours_in_place, theirs_in_place = rank_values(dtype, 40, seed=3), rank_values(dtype, 40, seed=3)
                TORCH.reduce(ours_in_place, ours_in_place, op, root)
                MPI.reduce(theirs_in_place, theirs_in_place, op, root)
                if RANK == root:
                    assert same_bits(ours_in_place, theirs), (dtype, root, op)
                    assert same_bits(theirs_in_place, theirs)


def test_all_gather_and_broadcast_move_every_dtype_bit_for_bit():
    for dtype in DTYPES + (torch.uint8,):
        mine = (rank_values(torch.float32, 19, seed=4) * 40).to(dtype) if dtype == torch.uint8 else rank_values(dtype, 19, seed=4)
        ours, theirs = torch.zeros(19 * WORLD, dtype=dtype), torch.zeros(19 * WORLD, dtype=dtype)
        TORCH.all_gather(mine, ours)
        MPI.all_gather(mine, theirs)
        assert same_bits(ours, theirs), dtype
        assert same_bits(ours[19 * RANK : 19 * (RANK + 1)], mine)
        # In place: this rank's block of recv is send.
        in_place = torch.zeros(19 * WORLD, dtype=dtype)
        in_place[19 * RANK : 19 * (RANK + 1)] = mine
        TORCH.all_gather(in_place[19 * RANK : 19 * (RANK + 1)], in_place)
        assert same_bits(in_place, theirs), dtype
        root = WORLD - 1
        ours_b, theirs_b = mine.clone(), mine.clone()
        TORCH.broadcast(ours_b, root)
        MPI.broadcast(theirs_b, root)
        assert same_bits(ours_b, theirs_b), dtype
        assert same_bits(ours_b, (rank_values(torch.float32, 19, seed=4, rank=root) * 40).to(dtype) if dtype == torch.uint8 else rank_values(dtype, 19, seed=4, rank=root))


def test_async_collectives_overlap_and_give_the_same_bits():
    a, b = rank_values(torch.float32, 100, seed=5), rank_values(torch.bfloat16, 64 * WORLD, seed=6)
    gathered = torch.zeros(100 * WORLD)
    scattered = torch.zeros(64, dtype=torch.bfloat16)
    reduced = a.clone()
    pending = [
        TORCH.all_gather_async(a, gathered),
        TORCH.reduce_scatter_async(b, scattered, "avg"),
        TORCH.all_reduce_async(reduced, "avg"),
    ]
    for p in pending:
        p.wait()
    pending[0].wait()  # a second wait is a no-op
    expect_gathered, expect_scattered, expect_reduced = torch.zeros(100 * WORLD), torch.zeros(64, dtype=torch.bfloat16), a.clone()
    MPI.all_gather(a, expect_gathered)
    MPI.reduce_scatter(b, expect_scattered, "avg")
    MPI.all_reduce(expect_reduced, "avg")
    assert same_bits(gathered, expect_gathered) and same_bits(scattered, expect_scattered)
    assert same_bits(reduced, expect_reduced)


def test_byte_reductions_and_bad_arguments_are_refused():
    message = raises(lambda: TORCH.all_reduce(torch.zeros(4, dtype=torch.uint8), "sum"), "unsupported")
    assert "all_reduce over torch.distributed (gloo) cannot reduce dtype byte" in message, message
    message = raises(lambda: TORCH.broadcast(torch.zeros(4), WORLD))
    assert f"broadcast: root {WORLD} is not a rank of this {WORLD}-rank communicator" in message, message
    message = raises(lambda: TORCH.all_reduce(torch.zeros(4), "mean"))
    assert "unknown reduce op 'mean'" in message, message
    TORCH.barrier()  # still usable: nothing reached torch


class Spy(TorchDistCommunicator):
    """The torch communicator, recording the buffers it is handed; optionally failing."""

    def __init__(self, fail_with=None):
        super().__init__()
        self.fail_with = fail_with
        self.pointers = []

    def _tensor(self, array):
        tensor = super()._tensor(array)
        self.pointers.append(tensor.data_ptr())
        return tensor

    def all_reduce(self, array, op):
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        return super().all_reduce(array, op)


def test_buffers_reach_python_without_a_copy():
    spy = Spy()
    comm = shardopt.python_communicator(spy)
    send, recv = rank_values(torch.float32, 1000, seed=7), torch.zeros(1000 * WORLD)
    comm.all_gather(send, recv)
    assert spy.pointers == [send.data_ptr(), recv.data_ptr()]


def test_a_python_failure_is_a_comm_error_and_poisons_the_communicator():
    comm = shardopt.python_communicator(Spy(fail_with="the transport broke"))
    message = raises(lambda: comm.all_reduce(torch.ones(3), "sum"), "comm")
    assert f"all_reduce on rank {RANK} of {WORLD} failed in torch.distributed (gloo): RuntimeError: the transport broke" in message
    assert "the communicator is now unusable" in message
    message = raises(lambda: comm.barrier(), "comm")
    assert "barrier on rank" in message and "refused" in message and "the transport broke" in message, message
    # torch's timeouts come out as shardopt's.
    timed_out = shardopt.python_communicator(Spy(fail_with="Timed out waiting 1000ms for recv operation to complete"))
    message = raises(lambda: timed_out.all_reduce(torch.ones(3), "max"), "timeout")
    assert "Timed out waiting 1000ms" in message, message
    raises(lambda: timed_out.all_reduce(torch.ones(3), "max"), "timeout")


def test_a_torch_timeout_is_a_shardopt_timeout_on_the_rank_left_waiting():
    """torch's process-group timeout is the communicator's: rank 0 all-reduces alone on a group
    with a 2 s timeout and gets shardopt.Error(timeout) with gloo's message; the others wait."""
    if WORLD < 2:
        return
    group = dist.new_group(ranks=list(range(WORLD)), timeout=timedelta(seconds=2))
    comm = shardopt.torch_communicator(group)
    if RANK == 0:
        start = time.monotonic()
        message = raises(lambda: comm.all_reduce(torch.ones(4), "sum"), "timeout")
        assert 1.5 < time.monotonic() - start < 30, time.monotonic() - start
        assert "all_reduce on rank 0 of" in message and "Timed out" in message, message
        message = raises(lambda: comm.barrier(), "timeout")
        assert "refused" in message and "timed out" in message, message
    MPI.barrier()


def test_split_forms_the_groups_mpi_forms():
    for color in (RANK % 2, 0):
        ours, theirs = TORCH.split(color, 0), MPI.split(color, 0)
        assert (ours.rank, ours.size) == (theirs.rank, theirs.size)
        assert ours.backend == "torch.distributed (gloo)"
        a, b = rank_values(torch.float32, 50, seed=8), rank_values(torch.float32, 50, seed=8)
        ours.all_reduce(a, "avg")
        theirs.all_reduce(b, "avg")
        assert same_bits(a, b)
    assert TORCH.split(-1, 0) is None
    if WORLD > 1:  # keys that reorder the ranks: torch cannot, and every rank says so
        fresh = shardopt.torch_communicator()  # a failed split poisons its communicator, as any failure does
        message = raises(lambda: fresh.split(0, WORLD - RANK), "comm")
        assert "torch orders a group's ranks by their global rank" in message, message


def test_zero_optimizer_over_torch_steps_as_over_mpi():
    """Adam on bucket_view storage: reduce_gradients (avg) and the step's all-gather both go over
    the communicator; the parameters come out with the same bits."""
    def run(comm):
        w0 = rank_values(torch.float32, 301, seed=9, rank=0)  # the same start on every rank
        b0 = rank_values(torch.float32, 7, seed=10, rank=0)
        opt = shardopt.ZeroOptimizer(comm, [{"params": [("w", w0), ("b", b0)], "lr": 0.01}])
        for step in range(3):
            opt.grad_view(0)[:] = rank_values(torch.float32, 301, seed=11 + step).numpy()
            opt.grad_view(1)[:] = rank_values(torch.float32, 7, seed=21 + step).numpy()
            opt.reduce_gradients()
            opt.step()
        return [torch.from_numpy(opt.param_view(i).copy()) for i in range(2)], opt.memory_report()

    ours, our_report = run(TORCH)
    theirs, _ = run(MPI)
    assert all(same_bits(a, b) for a, b in zip(ours, theirs))
    assert not same_bits(ours[0], rank_values(torch.float32, 301, seed=9, rank=0))  # it trained
    assert our_report.node_ranks == 1 and our_report.node_shared_param_bytes == 0  # no shared memory


def test_the_drop_in_picks_mpi_under_mpirun():
    from shardopt.torch import ZeroRedundancyOptimizer, launched_by_mpirun

    assert launched_by_mpirun()
    model = torch.nn.Linear(3, 2)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    assert opt._zero.communicator.backend == "mpi"
    # A torch group other than the world's goes over torch, even under mpirun.
    group = dist.new_group(ranks=list(range(WORLD)))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, process_group=group, lr=0.1)
    assert opt._zero.communicator.backend == "torch.distributed (gloo)"
    assert opt._zero.communicator.size == WORLD


if __name__ == "__main__":
    sys.exit(run_tests(dict(globals()), RANK))
