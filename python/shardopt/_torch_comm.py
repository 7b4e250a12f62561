"""python/shardopt/_torch_comm.py — TorchDistCommunicator: shardopt's collectives over a torch.distributed process group (gloo on CPU, NCCL on GPU).

shardopt's kernels run the optimizer; torch's process group moves the bytes. The C++ side
(``shardopt.python_communicator``) calls these methods with the library's own buffers as DLPack
arrays (no copy), each method starts the collective and returns an object whose ``wait()``
finishes it (torch's ``Work.wait()``, then whatever the backend leaves to do).

Over NCCL the communicator is CUDA-aware on the host's timeline (as a CUDA-aware MPI): shardopt
hands over device buffers, and host ones (its small agreement records), which travel through
device copies; every collective completes before wait() returns.

Reductions match shardopt's MPI communicator (include/shardopt/communicator.hpp): avg is the sum
divided by size() in float and, for bf16/f16, rounded back to the dtype (gloo has no AVG; NCCL
uses its own). At 1 and 2 ranks the results are the MPI communicator's bits.

Timeouts: torch's own process-group timeout applies (``init_process_group(timeout=...)``); a
collective that times out raises shardopt.Error with code "timeout" and poisons the communicator.
"""
import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def _global_rank(group, rank):
    """The default group's rank of `rank` in `group` (what torch's src/dst arguments take)."""
    if group is None or group is dist.group.WORLD:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


class _Done:
    """A collective already complete (nothing to wait for)."""

    def wait(self):
        return True


class _Then:
    """torch's Work, then `finish()` once it completes (avg's division, a copy out)."""

    def __init__(self, work, finish=None):
        self._work = work
        self._finish = finish

    def wait(self):
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return True


class TorchDistCommunicator:
    """The protocol shardopt.python_communicator() calls, over one torch process group."""

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "shardopt: torch.distributed is not initialised: call torch.distributed.init_process_group() "
                "first (torchrun sets up its environment)"
            )
        self.group = group if group is not None else dist.group.WORLD
        self._backend = dist.get_backend(self.group)
        self._rank = dist.get_rank(self.group)
        self._size = dist.get_world_size(self.group)
        self._on_cuda = self._backend == "nccl"
        self._native_avg = self._on_cuda  # NCCL has ncclAvg; gloo has no AVG

    # ---- what the C++ side reads once ---------------------------------------------------------

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def cuda_aware(self):
        """NCCL: shardopt hands over device buffers (and host ones: its small records)."""
        return self._on_cuda

    def backend(self):
        return f"torch.distributed ({self._backend})"

    # ---- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _tensor(array):
        return torch.utils.dlpack.from_dlpack(array)

    def _tensors(self, *arrays):
        """The buffers as tensors (None stays None), and a function that copies the outputs back
        where they had to be staged: NCCL moves CUDA tensors only, so host buffers (shardopt's
        agreement records) travel through device copies."""
        tensors = [None if a is None else self._tensor(a) for a in arrays]
        if not self._on_cuda or all(t is None or t.is_cuda for t in tensors):
            return tensors, lambda *outputs: None
        device = torch.device("cuda", torch.cuda.current_device())
        staged = [None if t is None else t.to(device) for t in tensors]

        def copy_back(*outputs):
            for i in outputs:
                if tensors[i] is not None and staged[i] is not tensors[i]:
                    tensors[i].copy_(staged[i])

        return staged, copy_back

    def _finish_on_host(self, work, finish=None, copy_back=None):
        """Completes on the host's timeline, which is what shardopt expects of a communicator
        without a stream of its own (NCCL's work is otherwise only ordered on torch's streams);
        then copies staged outputs back (copy_back)."""

        def done():
            if finish is not None:
                finish()
            if self._on_cuda:
                torch.cuda.current_stream().synchronize()
            if copy_back is not None:
                copy_back()

        return _Then(work, done)

    def _reduce_op(self, op):
        if op == "avg":
            return dist.ReduceOp.AVG if self._native_avg else dist.ReduceOp.SUM
        return _OPS[op]

    def _average(self, tensor, op):
        """avg's last step where the backend summed: the sum / size() in float, rounded to the dtype."""
        if op != "avg" or self._native_avg:
            return
        if tensor.dtype == torch.float32:
            tensor.div_(float(self._size))
        else:
            tensor.copy_(tensor.float().div_(float(self._size)))

    def _moved(self, tensor):
        """What the transport moves: gloo knows no bf16, so its bytes."""
        return tensor.view(torch.uint8) if tensor.dtype == torch.bfloat16 and not self._on_cuda else tensor

    def _widened(self, tensor):
        """What the transport reduces: gloo knows no bf16, so a float copy (a sum of two bf16 values
        in float, rounded back once, is the correctly rounded sum MPI's pairwise combination gives)."""
        return tensor.float() if tensor.dtype == torch.bfloat16 and not self._on_cuda else tensor

    # ---- collectives: each starts one and returns a waitable -----------------------------------

    def broadcast(self, array, root):
        (tensor,), copy_back = self._tensors(array)
        work = dist.broadcast(self._moved(tensor), _global_rank(self.group, root), group=self.group, async_op=True)
        return self._finish_on_host(work, copy_back=lambda: copy_back(0))

    def all_gather(self, send_array, recv_array):
        (send, recv), copy_back = self._tensors(send_array, recv_array)
        if send.numel() == 0:  # the same count on every rank: nothing to move anywhere
            return _Done()
        send, recv = self._moved(send), self._moved(recv)
        if self._on_cuda:
            work = dist.all_gather_into_tensor(recv, send, group=self.group, async_op=True)
        else:  # gloo has no all_gather into one tensor: the blocks of recv, as views
            work = dist.all_gather(list(recv.chunk(self._size)), send, group=self.group, async_op=True)
        return self._finish_on_host(work, copy_back=lambda: copy_back(1))

    def all_reduce(self, array, op):
        (tensor,), copy_back = self._tensors(array)
        wire = self._widened(tensor)
        work = dist.all_reduce(wire, op=self._reduce_op(op), group=self.group, async_op=True)

        def finish():
            if wire is not tensor:
                tensor.copy_(wire)
            self._average(tensor, op)

        return self._finish_on_host(work, finish, lambda: copy_back(0))

    def reduce_scatter(self, send_array, recv_array, op):
        (send, recv), copy_back = self._tensors(send_array, recv_array)
        if recv.numel() == 0:
            return _Done()
        if self._on_cuda:
            work = dist.reduce_scatter_tensor(recv, send, op=self._reduce_op(op), group=self.group, async_op=True)
            return self._finish_on_host(work, lambda: self._average(recv, op), lambda: copy_back(1))
        # gloo has no reduce_scatter: an all-reduce of a copy, of which this rank keeps its block.
        whole = send.float() if send.dtype == torch.bfloat16 else send.clone()
        work = dist.all_reduce(whole, op=self._reduce_op(op), group=self.group, async_op=True)

        def keep_block():
            recv.copy_(whole.chunk(self._size)[self._rank])
            self._average(recv, op)

        return self._finish_on_host(work, keep_block)

    def reduce(self, send_array, recv_array, op, root):
        (send, recv), copy_back = self._tensors(send_array, recv_array)  # recv: None off the root
        wire = self._widened(send)
        if wire is send:
            if recv is not None:  # reduce into recv itself, from send's values
                if recv.data_ptr() != send.data_ptr():
                    recv.copy_(send)
                wire = recv
            else:  # torch's reduce may write its input off the root: shardopt's send stays untouched
                wire = send.clone()
        work = dist.reduce(wire, _global_rank(self.group, root), op=self._reduce_op(op), group=self.group,
                           async_op=True)

        def finish():
            if recv is None:
                return
            if wire is not recv:
                recv.copy_(wire)
            self._average(recv, op)

        return self._finish_on_host(work, finish, lambda: copy_back(1))

    def barrier(self):
        return self._finish_on_host(dist.barrier(group=self.group, async_op=True))

    def split(self, color, key):
        """Ranks with the same color form a group ordered by (key, rank); None for a negative color.
        torch's new_group must be called by every process of the default group, for every new
        group, in the same order: the (color, key) of every rank is all-gathered first."""
        if self._size != dist.get_world_size():
            raise RuntimeError(
                "split over torch.distributed needs every process of the default group (torch's new_group is "
                "collective over all of them): split the world's communicator instead"
            )
        mine = torch.tensor([color, key, dist.get_rank()], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self._size)]
        dist.all_gather(everyone, mine, group=self.group)
        entries = [tuple(int(v) for v in e) for e in everyone]  # (color, key, global rank), by group rank
        colors = sorted({c for c, _, _ in entries if c >= 0})
        backend = self._backend
        own = None
        for c in colors:
            members = sorted((k, position, g) for position, (cc, k, g) in enumerate(entries) if cc == c)
            ranks = [g for _, _, g in members]
            if ranks != sorted(ranks):  # the same verdict on every rank: all raise, before any new_group
                raise RuntimeError(
                    f"split over torch.distributed: color {c}'s keys order its ranks as {ranks}, but torch orders "
                    "a group's ranks by their global rank; pass keys that keep that order (e.g. key=0)"
                )
        for c in colors:
            ranks = sorted(g for cc, _, g in entries if cc == c)
            group = dist.new_group(ranks=ranks, backend=backend)
            if c == color:
                own = group
        if color < 0:
            return None
        return TorchDistCommunicator(own)


def torch_communicator(process_group=None):
    """A shardopt.Communicator over torch.distributed's `process_group` (None: the default group),
    which must be initialised already."""
    from ._shardopt import python_communicator

    return python_communicator(TorchDistCommunicator(process_group))
