"""python/shardopt/_torch_overlap.py — overlap_with_ddp without shardopt's communication thread: gradient buckets averaged by nonblocking collectives started as backward fills them, and torch's DDP hook `hook_with_zero_step`.

Over a torch.distributed process group (torchrun), the optimizer's overlap engine cannot run:
its communication thread would call torch from a second thread. The same overlap needs no
thread there, because torch's backends progress a nonblocking collective on their own (gloo's
worker threads, NCCL's stream). So the drop-in does it here, on the caller's thread:

- ``GradientBuckets``: the params' gradient buffers are views of a few flat buckets (about 25 MiB,
  in reverse registration order, as DDP's). A hook on each param's AccumulateGrad node copies the
  gradient into its view; once every param of a bucket is in, the bucket's average starts
  (``all_reduce_async(avg)`` on the optimizer's communicator), always in bucket order, so every
  rank issues the same collectives in the same order whichever of its params had gradients.
  ``finish()`` (in step()) zero-fills the params backward did not reach, starts what is left
  and waits for all. The optimizer then runs its plain step over the averaged buffers: bitwise
  what the non-overlapped drop-in computes from gradients averaged the same way.
- ``hook_with_zero_step``: torch's DDP communication hook for ZeRO. torch's runs the optimizer
  inside the last bucket's hook, loses the first two or three iterations while DDP settles its
  buckets, and refuses gloo ("may hang"). This one runs the user's hook (DDP's all-reduce, so
  ``.grad`` holds what DDP promises) and queues the drop-in's step at the end of backward; the
  step reads each bucket's averages from its hook's future (DDP copies them into ``.grad`` only
  in its own end-of-backward callback, queued after ours). No iteration is lost, gloo and NCCL
  alike, and ``step()`` in the loop becomes a no-op with torch's warning.
"""
import logging
import weakref

import torch

logger = logging.getLogger(__name__)

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb


class GradientBuckets:
    """Flat gradient buckets averaged with nonblocking collectives as backward fills them."""

    def __init__(self, comm, bucket_bytes=None):
        self._comm = comm
        self._bucket_bytes = bucket_bytes or BUCKET_BYTES
        self.grads = {}  # param index -> its view of a bucket (the buffer the optimizer reads)
        self._bucket_of = {}
        self._buckets = []  # each: (flat tensor, param indices)
        self._filled = []  # per bucket: how many of its params are in this round
        self._pending = []  # the started buckets' collectives, in bucket order
        self._handed = set()

    def add(self, params):
        """Buckets for `params` ({index: param}), appended after the existing ones (whose views
        stay where they are: the optimizer keeps pointers to them). Params of one dtype and
        device per bucket, the last index first (backward's order)."""
        current, size, key = [], 0, None
        for index in sorted(params, reverse=True):
            p = params[index]
            nbytes = p.numel() * p.element_size()
            if current and ((p.dtype, p.device) != key or size + nbytes > self._bucket_bytes):
                self._add_bucket(current, params)
                current, size = [], 0
            current.append(index)
            size += nbytes
            key = (p.dtype, p.device)
        if current:
            self._add_bucket(current, params)

    def _add_bucket(self, indices, params):
        first = params[indices[0]]
        flat = torch.zeros(sum(params[i].numel() for i in indices), dtype=first.dtype, device=first.device)
        offset = 0
        for i in indices:
            p = params[i]
            self.grads[i] = flat[offset:offset + p.numel()].view(p.shape)
            self._bucket_of[i] = len(self._buckets)
            offset += p.numel()
        self._buckets.append((flat, indices))
        self._filled.append(0)

    def __del__(self):
        # A started collective writes into its bucket until it completes, and the communicator
        # does not own the bucket's memory: never free a bucket under a collective in flight.
        for work in self._pending:
            try:
                work.wait()
            except Exception:  # noqa: BLE001  (the error was the round's; the memory is what matters)
                pass

    def handed(self, index):
        return index in self._handed

    def hand(self, index, grad):
        """backward's gradient of param `index`: into its view; starts the buckets now complete."""
        self.grads[index].copy_(grad)
        self._handed.add(index)
        self._filled[self._bucket_of[index]] += 1
        self._start_ready()

    def _start_ready(self):
        """Starts complete buckets, in bucket order only (the same collectives on every rank)."""
        while len(self._pending) < len(self._buckets):
            b = len(self._pending)
            flat, indices = self._buckets[b]
            if self._filled[b] < len(indices):
                return
            self._pending.append(self._comm.all_reduce_async(flat, "avg"))

    def finish(self):
        """Completes the round: zeros for params without a gradient, every bucket averaged.
        Returns the indices backward did not reach (in index order)."""
        without_grad = sorted(i for i in self.grads if i not in self._handed)
        for index in without_grad:
            self.grads[index].zero_()
            self._filled[self._bucket_of[index]] += 1
        self._start_ready()
        try:
            while self._pending:
                self._pending[0].wait()
                self._pending.pop(0)
        finally:
            self._handed.clear()
            self._filled = [0] * len(self._buckets)
        return without_grad


def hook_with_zero_step(hook, ddp, zero, shard_buckets=False):
    """torch's ``hook_with_zero_step`` for shardopt's drop-in: the returned DDP communication hook
    runs ``hook`` (e.g. ``allreduce_hook``) on each bucket as DDP would, and, once backward is
    over and DDP has written the averaged gradients, runs ``zero``'s step (update and parameter
    sync). From the first iteration, over gloo or NCCL. ``shard_buckets`` is accepted for
    torch's signature; shardopt's own partition decides who updates what."""
    del shard_buckets
    if not getattr(zero, "_overlap_with_ddp", False):
        raise ValueError("ZeroRedundancyOptimizer must be constructed with `overlap_with_ddp=True` to use this hook properly")
    zero._drive_from_ddp_hook(ddp)
    # DDP keeps the hook: a weak reference, so that the optimizer (and its communication thread)
    # still goes when the program drops it, not at interpreter exit after MPI's.
    zero_ref = weakref.ref(zero)

    def hook_with_zero_fn(state, bucket):
        future = hook(state, bucket)
        zero = zero_ref()
        if zero is None:
            raise RuntimeError("hook_with_zero_step: the ZeroRedundancyOptimizer no longer exists")
        zero._ddp_buckets.append((bucket.parameters(), future))
        if bucket.is_last():  # every bucket's hook has run: the step once backward is over
            torch.autograd.Variable._execution_engine.queue_callback(zero._step_after_ddp)
        return future

    return hook_with_zero_fn


def hook_with_zero_step_interleaved(hook, ddp, zero, shard_buckets=False):
    """torch's interleaved variant: here the same as ``hook_with_zero_step`` (shardopt's step is
    one fused pass over this rank's shard, run once backward is over)."""
    return hook_with_zero_step(hook, ddp, zero, shard_buckets)


def warn_step_in_loop():
    logger.warning("`step()` should not be included in the training loop when `overlap_with_ddp=True`")


def averaged_grads(ddp_buckets):
    """{id(param): its averaged gradient} from (bucket params, the hook's future) pairs: each
    future's tensor is its bucket's gradients, flat, in the order of the bucket's params."""
    grads = {}
    for params, future in ddp_buckets:
        flat = future.wait()
        if isinstance(flat, (list, tuple)):
            flat = flat[0]
        offset = 0
        for p in params:
            grads[id(p)] = flat[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
        if offset != flat.numel():
            raise RuntimeError(f"hook_with_zero_step: a bucket's hook returned {flat.numel()} elements for "
                               f"params of {offset}")
    return grads
