"""python/shardopt/torch.py — ZeroRedundancyOptimizer: a drop-in for torch.distributed.optim.ZeroRedundancyOptimizer that runs shardopt's sharded step over MPI or a torch.distributed process group.

Change one import::

    from shardopt.torch import ZeroRedundancyOptimizer   # was: from torch.distributed.optim import ...
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    for x, y in batches:
        opt.zero_grad()                 # set_to_none=True, as torch 2's default
        loss_fn(model(x), y).backward()  # gradients averaged by DDP, as torch's ZeRO expects
        opt.step()

Run under mpirun (the ranks are MPI's: process_group=None means the world) or under torchrun
(with torch.distributed initialised and no mpirun, shardopt's collectives go over torch's process
group: process_group, or the default group when None; gloo on CPU, NCCL on GPU). Each rank keeps the
optimizer state of its share of the parameters (torch's sorted-greedy assignment), updates it
with shardopt's kernels and syncs the model's own parameters, in place, to every rank. As with
torch's ZeRO, gradients must already be averaged across ranks (DDP, or an all-reduce).
"""
import os
import weakref

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from ._shardopt import (Algorithm, Communicator, Error, MasterStorage, OptimizerConfig, OverlapPolicy,
                        PartitionStrategy, StatePrecision, Storage, ZeroOptimizer, mpi_world)
from ._torch_comm import torch_communicator
from ._torch_overlap import (GradientBuckets, averaged_grads, hook_with_zero_step, hook_with_zero_step_interleaved,
                             warn_step_in_loop)
from ._torch_options import MUON_KEYS, algorithm_for, check_group, hyperparams_of, torch_defaults
from ._torch_rpc import DistributedOptimizer
from ._torch_state import from_torch, to_torch

__all__ = ["DistributedOptimizer", "ZeroRedundancyOptimizer", "hook_with_zero_step", "hook_with_zero_step_interleaved"]


def launched_by_mpirun():
    """Whether an MPI launcher (Open MPI's mpirun, or a PMI/PMIx one) started this process."""
    return any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def _communicator(process_group):
    """shardopt's communicator for torch's process_group argument.

    A shardopt.Communicator is used as it is. Under mpirun, the MPI world (None, or torch's world
    group, which names the same ranks when torch was started by the same mpirun). Otherwise (e.g.
    under torchrun) the torch process group given, or torch's default group: torch's transport
    under shardopt's kernels."""
    if isinstance(process_group, Communicator):
        return process_group
    torch_ready = dist.is_available() and dist.is_initialized()
    if launched_by_mpirun() or not torch_ready:
        if process_group is None:
            return mpi_world()
        if torch_ready and process_group is dist.group.WORLD:
            world = mpi_world()
            if dist.get_world_size() == world.size and dist.get_rank() == world.rank:
                return world
        if not torch_ready:
            raise ValueError(
                "shardopt.torch.ZeroRedundancyOptimizer: process_group is a torch process group, but "
                "torch.distributed is not initialised"
            )
    return torch_communicator(process_group)


class _ZeroJoinHook(JoinHook):
    """torch's Join hook for the drop-in: while other ranks still train, each iteration this rank
    takes its part in their optimizer step (its shard's update with the gradients DDP's own join
    hook left in .grad, and the parameter sync)."""

    def __init__(self, zero):
        self.zero = zero

    def main_hook(self):
        self.zero._shadow_step()


def _compact_settings(state_precision, master):
    """The keywords' StatePrecision and MasterStorage (None where unset); names or the enums."""

    def pick(value, enum, key):
        if value is None or isinstance(value, enum):
            return value
        try:
            return getattr(enum, str(value))
        except AttributeError:
            names = ", ".join(repr(n) for n in enum.__members__)
            raise ValueError(f"shardopt.torch.ZeroRedundancyOptimizer: {key}={value!r} is not one of {names}") from None

    return pick(state_precision, StatePrecision, "state_precision"), pick(master, MasterStorage, "master")


class ZeroRedundancyOptimizer(torch.optim.Optimizer, Joinable):
    """torch.distributed.optim.ZeroRedundancyOptimizer over shardopt (SGD, Adam, AdamW).

    ``param_groups`` are torch's dicts, live: a value changed there (by hand or by an
    lr_scheduler) takes effect at the next step. A param whose ``.grad`` is None is left as it
    is by that step (no update, no state change), as torch's optimizers do.
    ``parameters_as_bucket_view`` is accepted for compatibility: shardopt always updates the
    model's own parameter tensors in place.
    ``overlap_with_ddp=True``: each gradient is handed over (and averaged by shardopt, so
    without DDP) as backward accumulates it; step() finishes the round, updates, and returns with
    every parameter synced. Under mpirun the parameters become views of shardopt's buffers and
    its overlap engine reduces each bucket on its communication thread; over a torch process
    group (torchrun) the gradients go into flat buckets whose averages start, nonblocking, as
    backward completes them (_torch_overlap.py). Both give the non-overlapped step's bits for
    gradients averaged alike. torch's pattern, a DDP model with
    ``ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))`` (this
    module's ``hook_with_zero_step``), works too: the step then runs at the end of each backward,
    from the first iteration, on gloo and NCCL, and ``step()`` in the loop is a no-op.
    ``state_precision="q8"`` keeps Adam's moments in 8 bits per element (bitsandbytes' blockwise
    quantisation; parameters under 4096 elements keep fp32 moments) and ``master="remainder16"``
    keeps the fp32 master of a bf16 parameter as the parameter and a 16-bit remainder
    (docs/compact_state.md); a param group dict may set its own ``"state_precision"`` and
    ``"master"``. None: shardopt's defaults (fp32 for both).
    """

    def __init__(
        self,
        params,
        optimizer_class,
        process_group=None,
        parameters_as_bucket_view=False,
        overlap_with_ddp=False,
        state_precision=None,
        master=None,
        **defaults,
    ):
        self._algorithm = algorithm_for(optimizer_class)
        self._optimizer_class = optimizer_class
        full_defaults, self._reference = torch_defaults(optimizer_class, defaults)
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._zero = None  # created once torch has built param_groups
        self._params = []  # every param, in torch's index order
        self._grads = []  # the gradient buffer shardopt reads, one per param
        self._zeroed = set()  # indices of buffers zeroed since their last gradient
        self._holds_consolidated = False  # whether this rank holds a consolidated state
        self.overlap_with_ddp = bool(overlap_with_ddp)
        self._overlap_with_ddp = self.overlap_with_ddp  # the name torch's DDP hooks read
        self._hooks = []  # overlap: the AccumulateGrad nodes whose hooks hand gradients over
        self._handed = set()  # overlap (engine): indices handed over since the last step
        self._buckets = None  # overlap without the engine (a torch process group): GradientBuckets
        self._ddp = None  # True once hook_with_zero_step is made: DDP's hook drives the step
        self._ddp_buckets = []  # this backward's DDP buckets: (params, their hook's future)
        self._warned_step = False
        comm = _communicator(process_group)
        self.process_group = process_group
        self.rank, self.world_size = comm.rank, comm.size
        super().__init__(params, full_defaults)
        Joinable.__init__(self)
        self._compact = _compact_settings(state_precision, master)
        config = OptimizerConfig(
            algorithm=self._algorithm,
            partition=PartitionStrategy.sorted_greedy,  # torch's assignment of params to ranks
            storage=Storage.external,  # the model's own tensors, updated in place
        )
        self._apply_compact(config)
        if self.overlap_with_ddp:
            # shardopt's overlap engine: it owns the flat buffers (the model's parameters become
            # views of them) and averages each bucket's gradients itself as backward hands them
            # over, so the model needs no DDP. after_backward rather than torch's per-bucket
            # update, so that params without a gradient are skipped as without overlap. Over a
            # torch process group (torchrun) the engine refuses with Error(unsupported).
            config.storage = Storage.bucket_view
            config.node_shared_params = False  # each rank's model owns its parameter memory
            config.overlap = OverlapPolicy.after_backward
        try:
            self._zero = ZeroOptimizer(comm, self._shardopt_groups(), config)
        except Error as e:
            if not (self.overlap_with_ddp and e.code == "unsupported"):
                raise
            # The communicator cannot serve the engine's thread (a torch process group, on every
            # rank alike): the same overlap through nonblocking collectives on this thread.
            self._buckets = GradientBuckets(comm)
            self._buckets.add(dict(enumerate(self._params)))
            self._grads = [self._buckets.grads[i] for i in range(len(self._params))]
            config = OptimizerConfig(algorithm=self._algorithm, partition=PartitionStrategy.sorted_greedy,
                                     storage=Storage.external)
            self._apply_compact(config)
            self._zero = ZeroOptimizer(comm, self._shardopt_groups(), config)
        if self._engine_overlap():
            self._point_params_at_buffers()
        if self.overlap_with_ddp:
            for index, p in enumerate(self._params):
                self._hook_grad(index, p)

    def memory_report(self):
        """shardopt's MemoryReport of this rank (state, master and buffer bytes)."""
        return self._zero.memory_report()

    def last_step(self):
        """shardopt's StepReport of the last step on this rank (phase times, Muon's Newton-Schulz time)."""
        return self._zero.last_step()

    def _apply_compact(self, config):
        precision, master = self._compact
        if precision is not None:
            config.state_precision = precision
        if master is not None:
            config.master = master

    # ---- param groups -------------------------------------------------------------------------

    def _engine_overlap(self):
        """overlap_with_ddp through shardopt's overlap engine (bucket view, its own thread)."""
        return self.overlap_with_ddp and self._buckets is None

    def _shardopt_groups(self):
        groups, first = [], 0
        for group in self.param_groups:
            groups.append(self._shardopt_group(group, first))
            first += len(group["params"])
        return groups

    def _shardopt_group(self, group, first_index):
        """shardopt's group for a torch group whose params are indexed from first_index."""
        h = hyperparams_of(group, self._algorithm).as_dict()
        if self._algorithm == Algorithm.muon:
            h.update({key: group[key] for key in MUON_KEYS if key in group})
        entries = []
        for offset, p in enumerate(group["params"]):
            index = first_index + offset
            if self._engine_overlap():  # bucket view: initial values only; gradients handed over
                entries.append((f"param{index}", p.detach()))
            else:
                entries.append((f"param{index}", p.detach(), self._grads[index]))
        h["params"] = entries
        for key in ("state_precision", "master"):  # the group's own compact-state settings
            if group.get(key) is not None:
                h[key] = group[key]
        return h

    def add_param_group(self, param_group):
        """torch's add_param_group; collective, as torch's ZeRO's."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        check_group(group, self._algorithm, self._reference)
        first_index = len(self._params)
        for p in group["params"]:
            if p.is_sparse:
                raise ValueError("shardopt.torch.ZeroRedundancyOptimizer: sparse parameters are not supported")
            self._params.append(p)
            self._grads.append(torch.zeros_like(p, memory_format=torch.contiguous_format).detach())
        if self._zero is not None:
            if self._buckets is not None:  # new buckets after the old (whose views shardopt holds)
                self._buckets.add({i: self._params[i] for i in range(first_index, len(self._params))})
                for i in range(first_index, len(self._params)):
                    self._grads[i] = self._buckets.grads[i]
            self._zero.add_param_group(self._shardopt_group(group, first_index))
            if self._engine_overlap():
                self._point_params_at_buffers()  # the layout changed: every view moved
            if self.overlap_with_ddp:
                for index in range(first_index, len(self._params)):
                    self._hook_grad(index, self._params[index])

    # ---- overlap_with_ddp ---------------------------------------------------------------------

    def _point_params_at_buffers(self):
        """Each param's data becomes its view of shardopt's flat buffer (the values it holds)."""
        for index, p in enumerate(self._params):
            view = torch.from_dlpack(self._zero.param_view(index)).view(p.shape)
            p.data = view

    def _hook_grad(self, index, p):
        """Hands p's gradient over as soon as backward has accumulated it (torch 1.13 has no
        register_post_accumulate_grad_hook: the hook goes on p's AccumulateGrad node)."""
        if not p.requires_grad:
            return
        accumulate = p.expand_as(p).grad_fn.next_functions[0][0]

        # A weak reference: the node keeps its hook, and this optimizer keeps the node.
        zero_ref = weakref.ref(self)

        def hand(*_):
            zero = zero_ref()
            if zero is not None:
                zero._hand(index, p.grad.detach())

        accumulate.register_hook(hand)
        self._hooks.append(accumulate)  # the node must outlive this call for its hook to stay

    def _hand(self, index, grad):
        """backward's gradient of param `index`, from its AccumulateGrad hook."""
        if self._ddp is not None and self._buckets is not None:
            return  # DDP averages the gradients; its hook runs the plain step after backward
        if index in self._handed or (self._buckets is not None and self._buckets.handed(index)):
            raise RuntimeError(
                "shardopt.torch.ZeroRedundancyOptimizer(overlap_with_ddp=True): a second backward "
                f"reached param {index} before step(); gradient accumulation over several backwards "
                "needs overlap_with_ddp=False"
            )
        if self._buckets is not None:
            self._buckets.hand(index, grad)
            return
        self._handed.add(index)
        self._zero.reduce_gradient(index, grad.contiguous())

    def _sync_hyperparams(self):
        """param_groups' values (as a scheduler or the user left them) into shardopt's groups."""
        for group, view in zip(self.param_groups, self._zero.param_groups):
            check_group(group, self._algorithm, self._reference)
            view.set(hyperparams_of(group, self._algorithm))

    # ---- the step -----------------------------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True):
        """torch's zero_grad; set_to_none=True (the default) drops the .grad tensors."""
        super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """Collective: updates this rank's shard and syncs the parameters to every rank. With
        hook_with_zero_step registered, DDP's hook has done that at the end of backward, and this
        returns None, as torch's does."""
        if self._ddp is not None:
            if not self._warned_step:
                warn_step_in_loop()
                self._warned_step = True
            return None
        Join.notify_join_context(self)  # inside torch's Join: this rank has not joined (yet)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        return self._step_now(loss)

    def _drive_from_ddp_hook(self, ddp):
        """hook_with_zero_step: from now on DDP's hook runs the step (_step_after_ddp)."""
        group = getattr(ddp, "process_group", None)
        if group is not None and dist.get_world_size(group) != self.world_size:
            raise ValueError(
                f"hook_with_zero_step: the DDP model's process group has {dist.get_world_size(group)} ranks, "
                f"the ZeroRedundancyOptimizer's {self.world_size}"
            )
        self._ddp = True  # (not the DDP model itself: it keeps this optimizer's hook)

    def _step_after_ddp(self):
        """The step hook_with_zero_step queues at the end of backward."""
        buckets, self._ddp_buckets = self._ddp_buckets, []
        Join.notify_join_context(self)
        if self._buckets is None:  # the engine: it has averaged what the hooks handed over
            self._step_now(None)
            return
        # The gradients DDP averaged (its buckets' futures): the non-overlapped step's input.
        averaged = averaged_grads(buckets)
        self._zero.step(without_grad=self._gather_grads(lambda p: averaged.get(id(p))))

    def _step_now(self, loss):
        if self._buckets is not None:
            self._sync_hyperparams()
            self._zero.step(without_grad=self._buckets.finish())
            return loss
        if self.overlap_with_ddp:
            self._sync_hyperparams()
            without_grad = [i for i in range(len(self._params)) if i not in self._handed]
            self._handed.clear()
            # The round needs every param handed: zeros for those without a gradient, which the
            # step then leaves as they are (the same set on every rank, as torch's skip requires).
            for index in without_grad:
                self._zero.reduce_gradient(index, torch.zeros_like(self._params[index].detach()))
            self._zero.reduce_gradients()
            self._zero.step(without_grad=without_grad)
            self._zero.wait_all()  # torch's contract: the parameters are updated when step() returns
            return loss
        self._zero.step(without_grad=self._gather_grads())
        return loss

    def _shadow_step(self):
        """In torch's Join, once this rank is out of inputs: follows one step of the others."""
        if self._buckets is not None and self._ddp is None:
            self._sync_hyperparams()
            self._buckets.finish()  # zeros, in the others' bucket collectives
        else:
            self._gather_grads()
        self._zero.join_step()

    # ---- Join (uneven inputs) -----------------------------------------------------------------

    def join_hook(self, **kwargs):
        """torch's Join hook: a rank out of inputs keeps taking its part in the others' steps.
        Its hyperparameters must stay as the active ranks' (an LR scheduler stepped only on them
        makes the step fail on every rank, naming the joined rank). No keyword arguments."""
        return _ZeroJoinHook(self)

    @property
    def join_device(self):
        return self._params[0].device if self._params else torch.device("cpu")

    @property
    def join_process_group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def _gather_grads(self, grad_of=lambda p: p.grad):
        """Each param's gradient (its .grad, or what grad_of gives) into the buffers shardopt
        reads; returns the indices without one."""
        self._sync_hyperparams()
        without_grad = []
        for index, (p, buffer) in enumerate(zip(self._params, self._grads)):
            grad = grad_of(p)
            if grad is None:
                without_grad.append(index)
                if index not in self._zeroed:  # unread by the update; zeroed for what reads every gradient
                    buffer.zero_()
                    self._zeroed.add(index)
            elif grad.is_sparse:
                raise RuntimeError("shardopt.torch.ZeroRedundancyOptimizer does not support sparse gradients")
            else:
                buffer.copy_(grad)
                self._zeroed.discard(index)
        return without_grad

    # ---- state dicts --------------------------------------------------------------------------

    def consolidate_state_dict(self, to: int = 0):
        """Collective: gathers the whole optimizer state on rank `to`, as torch's ZeRO does."""
        self._zero.consolidate_state_dict(to)
        self._holds_consolidated = self.rank == to

    def state_dict(self):
        """torch.optim's state_dict() of the whole optimizer (loadable by torch.optim's class);
        only on the rank given to the last consolidate_state_dict()."""
        if not self._holds_consolidated:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. "
                f"Please call `consolidate_state_dict(to={self.rank})` on "
                "all ranks beforehand if you meant to save the global state."
            )
        return to_torch(self._zero.state_dict(), self._params, self.param_groups, self._algorithm)

    def load_state_dict(self, state_dict):
        """Collective: loads a torch.optim state dict (torch.optim.Adam's, torch ZeRO's
        consolidated one, or this class's); every rank passes the same dict."""
        names = [f"param{i}" for i in range(len(self._params))]
        shardopt_dict, groups = from_torch(state_dict, self._params, self.param_groups, names, self._algorithm)
        for group in groups:
            check_group(group, self._algorithm, self._reference)
        self._zero.load_state_dict(shardopt_dict)
        self.param_groups[:] = groups
        self._holds_consolidated = False
