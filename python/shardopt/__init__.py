"""python/shardopt/__init__.py — the `shardopt` package: the nanobind extension's API, plus a torch param-group helper.

shardopt runs ZeRO-style sharded optimizers over MPI, or over a torch.distributed process group
(``torch_communicator``), for any tensor exposing ``__dlpack__``.

Run under ``mpirun -np N python ...``. Each rank keeps optimizer state for ~1/N of the
parameters, updates that shard and syncs the parameters back to every rank::

    import shardopt
    comm = shardopt.mpi_world()
    opt = shardopt.ZeroOptimizer(
        comm,
        [{"params": [(name, p) for name, p in model.named_parameters()], "lr": 1e-3}],
        shardopt.OptimizerConfig(algorithm=shardopt.Algorithm.adamw, storage=shardopt.Storage.external),
        weight_decay=0.05,  # keyword hyperparameters: the defaults that groups' missing keys take
    )
    opt.hyperparams(0).lr = 5e-4  # a live view of the group: takes effect at the next step

Local SGD (torch's PostLocalSGDOptimizer): each replica is a ZeroOptimizer over a split of the
world (here the ranks of one node), and the replicas average their parameters every few steps::

    world = shardopt.mpi_world()
    replica = world.split(color=node_index)  # e.g. one colour per node
    opt = shardopt.ZeroOptimizer(replica, groups, config)
    local_sgd = shardopt.PostLocalSGDOptimizer(
        world, opt, shardopt.periodic_averager(period=4, warmup_steps=100),
        outer=None,  # or dict(lr=0.7, momentum=0.9, nesterov=True): DiLoCo's outer optimizer
    )
    local_sgd.reduce_gradients()  # over the world during warmup, the replica after it
    local_sgd.step()              # the optimizer's step, then the averaging
"""
from ._shardopt import (  # noqa: F401  (the public API)
    Algorithm,
    AveragerConfig,
    CommunicationCounts,
    Communicator,
    Error,
    HierarchicalModelAverager,
    Hyperparams,
    HyperparamsView,
    MemoryReport,
    ModelAverager,
    OptimizerConfig,
    OverlapPolicy,
    OuterOptimizer,
    PartitionStrategy,
    PendingCollective,
    PeriodicModelAverager,
    PostLocalSGDOptimizer,
    RemoteOptimizer,
    RemoteParam,
    RemoteStep,
    Storage,
    StatePrecision,
    MasterStorage,
    ZeroOptimizer,
    default_hyperparams,
    hierarchical_averager,
    mpi_world,
    nccl_compiled_in,
    nccl_world,
    periodic_averager,
    python_communicator,
    remote_mpi_world,
    version,
)

__version__ = version()


def torch_communicator(process_group=None):
    """A Communicator over a torch.distributed process group (None: the default group; torch must
    be initialised already): shardopt's kernels, torch's transport (gloo on CPU, NCCL on GPU).
    For launches by torchrun, where there is no MPI::

        dist.init_process_group("gloo")
        opt = shardopt.ZeroOptimizer(shardopt.torch_communicator(), groups, config)

    Collectives time out as torch's process group does (init_process_group's timeout)."""
    from ._torch_comm import torch_communicator as make

    return make(process_group)


def torch_param_group(module, with_grads=True, **hyperparams):
    """A param group of a torch module's named parameters, for external storage.

    Gives every parameter a zeroed ``.grad`` first (when ``with_grads``), so that its gradient
    buffer exists and stays put: backward accumulates into it, and shardopt reads it.
    """
    params = []
    for name, p in module.named_parameters():
        if with_grads and p.grad is None:
            import torch

            p.grad = torch.zeros_like(p)
        params.append((name, p))
    return dict(params=params, **hyperparams)
