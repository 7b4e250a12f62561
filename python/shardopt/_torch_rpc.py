"""python/shardopt/_torch_rpc.py — DistributedOptimizer: a drop-in for torch.distributed.optim.DistributedOptimizer whose owners update their parameters with shardopt's fused kernels, over torch's RPC.

Change one import::

    from shardopt.torch import DistributedOptimizer   # was: from torch.distributed.optim import ...
    with dist_autograd.context() as context_id:
        ...
        dist_autograd.backward(context_id, [loss])
        dist_optim = DistributedOptimizer(optim.SGD, [rref1, rref2], lr=0.05)
        dist_optim.step(context_id)

As torch's: the constructor creates one optimizer on each worker that owns some of the RRefs'
parameters (an RPC to it); step(context_id) asks every such owner to apply the gradients that
distributed autograd accumulated there for the context, and returns when all have (raising the
first owner's error). On an owner, steps of several trainers are applied one at a time (a lock
per owner), as torch's. A parameter without a gradient in the context is left as it is (torch's
optimizers skip a parameter whose grad is None).

The update on each owner is shardopt's: a one-rank ZeroOptimizer over the owner's parameters in
place (external storage), with torch's hyperparameters. CUDA parameters are accepted (torch's
DistributedOptimizer refuses them with its TorchScript path off); the owner's optimizer then
runs on that device.
"""
import threading

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc

from ._shardopt import OptimizerConfig, Storage, ZeroOptimizer, python_communicator
from ._torch_options import algorithm_for, check_group, hyperparams_of, torch_defaults


class _Done:
    def wait(self):
        return True


def _tensor(array):
    return torch.utils.dlpack.from_dlpack(array)


def _copy(src_array, dst_array):
    src, dst = _tensor(src_array), _tensor(dst_array)
    if src.data_ptr() != dst.data_ptr():
        dst.copy_(src)


class _Alone:
    """The protocol of shardopt.python_communicator for a group of one rank: every collective is
    the identity (avg over one rank divides by 1), so the owner's optimizer needs no transport."""

    def __init__(self, cuda):
        self._cuda = cuda

    def rank(self):
        return 0

    def size(self):
        return 1

    def cuda_aware(self):
        return self._cuda

    def backend(self):
        return "one rank (shardopt.torch.DistributedOptimizer's owner)"

    def broadcast(self, array, root):
        return _Done()

    def all_gather(self, send_array, recv_array):
        _copy(send_array, recv_array)
        return _Done()

    def all_reduce(self, array, op):
        return _Done()

    def reduce_scatter(self, send_array, recv_array, op):
        _copy(send_array, recv_array)
        return _Done()

    def reduce(self, send_array, recv_array, op, root):
        if recv_array is not None:
            _copy(send_array, recv_array)
        return _Done()

    def barrier(self):
        return _Done()

    def split(self, color, key):
        return _Alone(self._cuda) if color >= 0 else None


class _OwnerOptimizer:
    """Lives on an owner (created there by rpc.remote): its parameters' optimizer."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        self._lock = threading.Lock()
        self.params = [rref.local_value() for rref in params_rref]
        algorithm = _supported(optimizer_class)
        defaults = dict(kwargs)
        if args:  # torch's optimizers take lr (then their own order) positionally
            defaults.update(zip(_positional_names(optimizer_class), args))
        given, pristine = torch_defaults(optimizer_class, defaults)
        check_group(given, algorithm, pristine)
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"shardopt.torch.DistributedOptimizer: one owner's parameters are on several devices: {devices}")
        self._grads = [torch.zeros_like(p) for p in self.params]
        group = {"params": [(f"param{i}", p.data, g) for i, (p, g) in enumerate(zip(self.params, self._grads))]}
        h = hyperparams_of(given, algorithm)
        group.update(lr=h.lr, weight_decay=h.weight_decay, maximize=h.maximize)
        if algorithm.name == "sgd":
            group.update(momentum=h.momentum, dampening=h.dampening, nesterov=h.nesterov)
        else:
            group.update(betas=(h.beta1, h.beta2), eps=h.eps, amsgrad=h.amsgrad)
        comm = python_communicator(_Alone(next(iter(devices)).type == "cuda"))
        config = OptimizerConfig(algorithm=algorithm, storage=Storage.external)
        self._opt = ZeroOptimizer(comm, [group], config)

    def step(self, context_id):
        grads = dist_autograd.get_gradients(context_id)
        with self._lock:
            without = []
            for i, p in enumerate(self.params):
                g = grads.get(p)
                if g is None:
                    without.append(i)
                    continue
                self._grads[i].copy_(g.to_dense() if g.is_sparse else g)
            if len(without) == len(self.params):
                return
            self._opt.step(without_grad=without)


def _supported(optimizer_class):
    algorithm = algorithm_for(optimizer_class)
    if algorithm.name not in ("sgd", "adam", "adamw"):
        raise ValueError(f"shardopt.torch.DistributedOptimizer runs SGD, Adam and AdamW; not {algorithm.name}")
    return algorithm


def _positional_names(optimizer_class):
    import inspect

    names = list(inspect.signature(optimizer_class.__init__).parameters)[2:]  # self, params
    return names


def _owner_step(owner_rref, context_id):
    owner_rref.local_value().step(context_id)


class DistributedOptimizer:
    """torch.distributed.optim.DistributedOptimizer's interface, shardopt's update on the owners."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        _supported(optimizer_class)  # refuses an unsupported class here, before any RPC
        per_worker = {}
        for rref in params_rref:
            per_worker.setdefault(rref.owner(), []).append(rref)
        futures = [
            rpc.rpc_async(worker, _make_owner, args=(optimizer_class, rrefs) + tuple(args), kwargs=kwargs)
            for worker, rrefs in per_worker.items()
        ]
        self.remote_optimizers = [f.wait() for f in futures]

    def step(self, context_id):
        dist_autograd._is_valid_context(context_id)
        futures = [rpc.rpc_async(o.owner(), _owner_step, args=(o, context_id)) for o in self.remote_optimizers]
        errors = []
        for f in futures:
            try:
                f.wait()
            except Exception as e:  # every owner is waited for, as torch does, then the first error raised
                errors.append(e)
        if errors:
            raise errors[0]


def _make_owner(optimizer_class, params_rref, *args, **kwargs):
    return rpc.RRef(_OwnerOptimizer(optimizer_class, params_rref, *args, **kwargs))
