"""python/tests/test_torch_dropin.py — shardopt.torch.ZeroRedundancyOptimizer against torch's own ZeroRedundancyOptimizer (gloo, in the same mpirun job) and torch.optim.

    mpirun -np 2 python -m pytest -q python/tests/test_torch_dropin.py   (or run it as a script)

Every rank runs every test in the same order (the optimizers' calls are collective). Skipped,
with the reason, where torch cannot be imported.
"""
import copy
import os
import sys

try:
    import torch
except ImportError:  # the whole module needs torch
    torch = None

if torch is None:
    if __name__ == "__main__":
        print("test_torch_dropin: skipped: torch cannot be imported", flush=True)
        sys.exit(0)
    import pytest

    pytest.skip("torch cannot be imported: the drop-in's tests need it", allow_module_level=True)

import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel as DDP

import shardopt
from shardopt.torch import ZeroRedundancyOptimizer

COMM = shardopt.mpi_world(timeout_seconds=120)
RANK, WORLD = COMM.rank, COMM.size
TOLERANCE = 1e-6


def _init_torch_distributed():
    """gloo over the ranks mpirun started, at a port this job's id picks (every rank alike)."""
    if dist.is_initialized():
        return
    job = int(os.environ.get("OMPI_MCA_ess_base_jobid", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + job % 20000))
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)


_init_torch_distributed()


def tutorial_model(width=64, depth=4):
    """torch's ZeRO tutorial model (Linear(2000, 2000) layers), smaller; the same on every rank."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])


def batch(step, width=64, rank=RANK):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(20, width, generator=g)


def train_step(model, opt, step, rank=RANK):
    opt.zero_grad()
    width = next(model.parameters()).shape[1]
    model(batch(step, width, rank=rank)).square().mean().backward()
    opt.step()


def largest_difference(a, b):
    return max((x.detach() - y.detach()).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))


def agree_everywhere(ok):
    """Every rank's verdict, so that one rank's failure fails the test on all."""
    verdict = torch.tensor([0 if ok else 1])
    dist.all_reduce(verdict)
    return verdict.item() == 0


def compare_with_torch_zero(optimizer_class, steps=4, **hyper):
    """Trains the tutorial model under DDP with torch's ZeRO and with the drop-in; returns the
    largest parameter difference and both (model, optimizer) pairs."""
    ours_model = tutorial_model()
    theirs_model = copy.deepcopy(ours_model)
    ours_ddp, theirs_ddp = DDP(ours_model), DDP(theirs_model)
    ours = ZeroRedundancyOptimizer(ours_ddp.parameters(), optimizer_class=optimizer_class, **hyper)
    theirs = TorchZero(theirs_ddp.parameters(), optimizer_class=optimizer_class, **hyper)
    for step in range(steps):
        train_step(ours_ddp, ours, step)
        train_step(theirs_ddp, theirs, step)
    return largest_difference(ours_model, theirs_model), (ours_model, ours), (theirs_model, theirs)


def test_adam_matches_torch_zero_on_the_tutorial_model():
    before = tutorial_model()
    worst, (model, _), _ = compare_with_torch_zero(torch.optim.Adam, lr=0.01)
    assert largest_difference(model, before) > 1e-3  # it trained
    assert agree_everywhere(worst <= TOLERANCE), worst


def test_sgd_momentum_and_adamw_match_torch_zero():
    cases = [
        (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
        (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, dampening=0.0)),
        (torch.optim.AdamW, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)),
        (torch.optim.Adam, dict(lr=0.01, amsgrad=True, maximize=True)),
    ]
    for optimizer_class, hyper in cases:
        worst, _, _ = compare_with_torch_zero(optimizer_class, **hyper)
        assert agree_everywhere(worst <= TOLERANCE), (optimizer_class.__name__, hyper, worst)


def test_step_lr_and_param_group_writes_drive_the_drop_in():
    ours_model = tutorial_model()
    theirs_model = copy.deepcopy(ours_model)
    ours = ZeroRedundancyOptimizer(ours_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.02)
    theirs = TorchZero(theirs_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.02)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.1) for o in (ours, theirs)]
    for step in range(6):
        if step == 5:  # a write by hand takes effect at the next step too
            for o in (ours, theirs):
                o.param_groups[0]["lr"] = 3e-3
        train_step(ours_model, ours, step, rank=0)
        train_step(theirs_model, theirs, step, rank=0)
        for s in schedulers:
            s.step()
        assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"], (step, ours.param_groups[0], theirs.param_groups[0])
    assert abs(ours.param_groups[0]["lr"] - 3e-4) < 1e-12  # the scheduler decayed the value written by hand
    assert ours._zero.param_groups[0].lr == 3e-3  # which is what shardopt's last step used
    assert agree_everywhere(largest_difference(ours_model, theirs_model) <= TOLERANCE)
    # A scheduler's learning rate is not a constant: without it the result differs.
    plain_model = tutorial_model()
    plain = ZeroRedundancyOptimizer(plain_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.02)
    for step in range(6):
        train_step(plain_model, plain, step, rank=0)
    assert largest_difference(plain_model, ours_model) > 1e-3


def _broadcast(obj):
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def test_state_dict_round_trip_with_torch_adam():
    # torch.optim.Adam trains a few steps (the same batches on every rank) ...
    reference_model = tutorial_model(width=16, depth=2)
    reference = torch.optim.Adam(reference_model.parameters(), lr=0.01, weight_decay=0.05)
    for step in range(3):
        train_step(reference_model, reference, step, rank=0)
    # ... the drop-in takes over its state and continues exactly as it does ...
    model = copy.deepcopy(reference_model)
    ours = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.5)
    ours.load_state_dict(copy.deepcopy(reference.state_dict()))
    assert ours.param_groups[0]["lr"] == 0.01 and ours.param_groups[0]["weight_decay"] == 0.05
    for step in range(3, 6):
        train_step(reference_model, reference, step, rank=0)
        train_step(model, ours, step, rank=0)
    assert largest_difference(model, reference_model) <= TOLERANCE
    # ... and hands back torch's exact layout, which torch.optim.Adam loads and continues from.
    ours.consolidate_state_dict(to=0)
    if RANK != 0:
        try:
            ours.state_dict()
            raise AssertionError("state_dict() without the consolidated state did not raise")
        except RuntimeError as e:
            assert "consolidate_state_dict(to=" in str(e)
        for step in range(6, 9):
            train_step(model, ours, step, rank=0)
        return
    sd = ours.state_dict()
    expected = reference.state_dict()
    assert sorted(sd["state"]) == sorted(expected["state"]) == [0, 1, 2, 3]
    for index, entry in expected["state"].items():
        assert set(sd["state"][index]) == set(entry) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in entry.items():
            assert sd["state"][index][key].shape == value.shape, key
            assert torch.allclose(sd["state"][index][key], value, atol=TOLERANCE, rtol=0), key
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1, 2, 3]]
    resumed_model = copy.deepcopy(model)
    resumed = torch.optim.Adam(resumed_model.parameters(), lr=1.0)
    resumed.load_state_dict(sd)
    for step in range(6, 9):
        train_step(model, ours, step, rank=0)
        train_step(resumed_model, resumed, step, rank=0)
    assert largest_difference(model, resumed_model) <= TOLERANCE


def test_loads_torch_zero_consolidated_state():
    worst, (model, _), (theirs_model, theirs) = compare_with_torch_zero(torch.optim.Adam, steps=2, lr=0.01)
    theirs.consolidate_state_dict(to=0)
    sd = _broadcast(theirs.state_dict() if RANK == 0 else None)
    ours_model = copy.deepcopy(theirs_model)
    ours = ZeroRedundancyOptimizer(ours_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    ours.load_state_dict(sd)
    for step in range(2, 5):
        train_step(ours_model, ours, step, rank=0)
        for p in theirs_model.parameters():  # torch's ZeRO on the same (rank 0's) batches, no DDP
            p.grad = None
        theirs_model(batch(step, rank=0)).square().mean().backward()
        theirs.step()
    assert agree_everywhere(largest_difference(ours_model, theirs_model) <= TOLERANCE)


def test_unsupported_optimizer_class_and_options_are_refused():
    model = tutorial_model(width=4, depth=1)
    try:
        ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.RMSprop, lr=0.1)
        raise AssertionError("RMSprop was accepted")
    except ValueError as e:
        message = str(e)
        assert "RMSprop" in message and "torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW" in message, message
    try:
        ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.1, capturable=True)
        raise AssertionError("capturable=True was accepted")
    except ValueError as e:
        assert "capturable=True" in str(e)
    # A value set later in param_groups is refused at the next step, on every rank alike.
    ours = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
    ours.param_groups[0]["capturable"] = True
    try:
        ours.step()
        raise AssertionError("capturable=True in param_groups was accepted")
    except ValueError as e:
        assert "capturable=True" in str(e)
    ours.param_groups[0]["capturable"] = False
    try:
        ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=-1.0)
        raise AssertionError("a negative lr was accepted")
    except ValueError as e:
        assert "learning rate" in str(e)


def test_default_zero_grad_trains_and_none_grads_are_skipped_as_torch_does():
    ours_model = tutorial_model(width=8, depth=3)
    theirs_model = copy.deepcopy(ours_model)
    ours = ZeroRedundancyOptimizer(ours_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.05)
    theirs = TorchZero(theirs_model.parameters(), optimizer_class=torch.optim.Adam, lr=0.05)
    start = copy.deepcopy(ours_model)
    for step in range(6):
        for model, opt in ((ours_model, ours), (theirs_model, theirs)):
            opt.zero_grad(set_to_none=True)
            assert all(p.grad is None for p in model.parameters())
            model(batch(step, width=8, rank=0)).square().mean().backward()
            if 2 <= step <= 3:  # the middle layer sits these steps out
                model[1].weight.grad = None
                model[1].bias.grad = None
            opt.step()
        if step == 2:
            held = [p.detach().clone() for p in ours_model[1].parameters()]
        if step == 3:  # untouched: no update while its grads were None
            assert all(torch.equal(a, p.detach()) for a, p in zip(held, ours_model[1].parameters()))
    # Every layer trained, and the skipped steps advanced neither its state nor its step count
    # (Adam's bias correction would differ otherwise).
    assert all((a - b).abs().max().item() > 1e-3 for a, b in zip(ours_model.parameters(), start.parameters()))
    assert agree_everywhere(largest_difference(ours_model, theirs_model) <= TOLERANCE)
    assert ours._zero.param_step(2) == 4 and ours._zero.param_step(0) == 6
    # The default zero_grad drops the gradients (torch 2's default), and training goes on.
    ours.zero_grad()
    assert all(p.grad is None for p in ours_model.parameters())


def test_overlap_with_ddp_equals_the_plain_step_bitwise():
    # Plain: gradients averaged by hand (as DDP would), then step(). Overlapped: each gradient
    # handed to shardopt by a hook as backward accumulates it, averaged by shardopt's engine.
    plain_model = tutorial_model(width=16, depth=3)
    over_model = copy.deepcopy(plain_model)
    start = copy.deepcopy(plain_model)
    plain = ZeroRedundancyOptimizer(plain_model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05)
    over = ZeroRedundancyOptimizer(over_model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05,
                                   overlap_with_ddp=True)
    for step in range(5):
        plain.zero_grad()
        plain_model(batch(step, width=16)).square().mean().backward()
        for p in plain_model.parameters():
            COMM.all_reduce(p.grad, "avg")
        plain.step()
        over.zero_grad()
        over_model(batch(step, width=16)).square().mean().backward()
        over.step()
        same = all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), over_model.parameters()))
        assert agree_everywhere(same), step
    assert all((a - b).abs().max().item() > 1e-3 for a, b in zip(over_model.parameters(), start.parameters()))
    assert over._zero.config.overlap == shardopt.OverlapPolicy.after_backward
    # The consolidated state is the plain run's, byte for byte.
    for opt in (plain, over):
        opt.consolidate_state_dict(0)
    if RANK == 0:
        a, b = plain.state_dict()["state"], over.state_dict()["state"]
        assert sorted(a) == sorted(b) and len(a) == 6
        for index in a:
            assert all(torch.equal(torch.as_tensor(a[index][k]), torch.as_tensor(b[index][k])) for k in a[index]), index
    # A param whose grad is None sits the step out, as without overlap.
    held = over_model[1].weight.detach().clone()
    over.zero_grad()
    over_model[1].weight.requires_grad_(False)
    over_model(batch(9, width=16)).square().mean().backward()
    over.step()
    over_model[1].weight.requires_grad_(True)
    assert torch.equal(held, over_model[1].weight.detach())
    assert over._zero.param_step(2) == 5 and over._zero.param_step(3) == 6


def test_overlap_with_ddp_after_add_param_group_equals_the_plain_step():
    # add_param_group changes the layout: the params are pointed at their new views and the new
    # ones get hooks.
    models = [tutorial_model(width=8, depth=2) for _ in range(2)]
    opts = []
    for model, overlap in zip(models, (False, True)):
        opt = ZeroRedundancyOptimizer(models[0 if not overlap else 1][0].parameters(),
                                      optimizer_class=torch.optim.Adam, lr=0.05, overlap_with_ddp=overlap)
        opt.add_param_group({"params": list(model[1].parameters()), "lr": 0.02})
        opts.append(opt)
    for step in range(3):
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model(batch(step, width=8)).square().mean().backward()
            if not opt.overlap_with_ddp:
                for p in model.parameters():
                    COMM.all_reduce(p.grad, "avg")
            opt.step()
        same = all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))
        assert agree_everywhere(same), step
    assert opts[1]._zero.param_step(3) == 3
    # Two backwards before a step (gradient accumulation) are refused by name, not reduced twice.
    opts[1].zero_grad()
    models[1](batch(7, width=8)).square().mean().backward()
    try:
        models[1](batch(8, width=8)).square().mean().backward()
        raise AssertionError("a second backward before step() was accepted")
    except RuntimeError as e:
        assert "a second backward reached param" in str(e) and "overlap_with_ddp=False" in str(e), str(e)


def test_overlap_with_ddp_over_a_torch_process_group_equals_the_plain_step_bitwise():
    # As under torchrun: the collectives go over torch's process group, which the overlap
    # engine's thread cannot call. The drop-in then averages gradient buckets with nonblocking
    # collectives started as backward fills them: the plain step's bits, every iteration.
    torch_comm = shardopt.torch_communicator()
    plain_model = tutorial_model(width=16, depth=3)
    over_model = copy.deepcopy(plain_model)
    plain = ZeroRedundancyOptimizer(plain_model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05,
                                    process_group=torch_comm)
    # Small buckets, so that most start during backward: each holds one Linear's weight or bias.
    from shardopt import _torch_overlap

    default_bytes, _torch_overlap.BUCKET_BYTES = _torch_overlap.BUCKET_BYTES, 16 * 16 * 4
    try:
        over = ZeroRedundancyOptimizer(over_model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.05,
                                       process_group=torch_comm, overlap_with_ddp=True)
    finally:
        _torch_overlap.BUCKET_BYTES = default_bytes
    assert over._buckets is not None and over._zero.config.overlap == shardopt.OverlapPolicy.off
    started_in_backward = []
    for step in range(4):
        plain.zero_grad()
        plain_model(batch(step, width=16)).square().mean().backward()
        for p in plain_model.parameters():
            COMM.all_reduce(p.grad, "avg")
        plain.step()
        over.zero_grad()
        over_model(batch(step, width=16)).square().mean().backward()
        started_in_backward.append(len(over._buckets._pending))
        over.step()
        same = all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), over_model.parameters()))
        assert agree_everywhere(same), step
    assert started_in_backward == [6] * 4, started_in_backward  # every bucket started before step()
    # A param without a gradient sits the step out; its bucket still starts (zeros), in order.
    held = over_model[1].weight.detach().clone()
    over.zero_grad()
    over_model[1].weight.requires_grad_(False)
    over_model(batch(9, width=16)).square().mean().backward()
    assert len(over._buckets._pending) < 6
    over.step()
    over_model[1].weight.requires_grad_(True)
    assert torch.equal(held, over_model[1].weight.detach())
    assert over._zero.param_step(2) == 4 and over._zero.param_step(3) == 5
    # Two backwards before a step are refused by name, as with the engine.
    over.zero_grad()
    over_model(batch(7, width=16)).square().mean().backward()
    try:
        over_model(batch(8, width=16)).square().mean().backward()
        raise AssertionError("a second backward before step() was accepted")
    except RuntimeError as e:
        assert "a second backward reached param" in str(e), str(e)


def test_frozen_params_and_add_param_group():
    model = tutorial_model(width=8, depth=2)
    reference_model = copy.deepcopy(model)
    model[0].weight.requires_grad_(False)
    reference_model[0].weight.requires_grad_(False)
    ours = ZeroRedundancyOptimizer(list(model[0].parameters()), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.5)
    reference = torch.optim.SGD(list(reference_model[0].parameters()), lr=0.1, momentum=0.5)
    ours.add_param_group({"params": list(model[1].parameters()), "lr": 0.02})
    reference.add_param_group({"params": list(reference_model[1].parameters()), "lr": 0.02})
    assert ours.param_groups[1]["momentum"] == 0.5 and len(ours.param_groups) == 2
    for step in range(3):
        train_step(model, ours, step, rank=0)
        train_step(reference_model, reference, step, rank=0)
    assert largest_difference(model, reference_model) <= TOLERANCE


def _train_uneven(model, opt):
    """Rank r trains 2 + r batches under torch's Join with DDP and the optimizer."""
    from torch.distributed.algorithms.join import Join

    with Join([model, opt]):
        for step in range(2 + RANK):
            train_step(model, opt, step)


def test_join_hook_trains_uneven_inputs_as_torch_zero_does():
    ours_model = tutorial_model()
    theirs_model = copy.deepcopy(ours_model)
    before = copy.deepcopy(ours_model)
    ours_ddp, theirs_ddp = DDP(ours_model), DDP(theirs_model)
    ours = ZeroRedundancyOptimizer(ours_ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    theirs = TorchZero(theirs_ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    _train_uneven(ours_ddp, ours)
    _train_uneven(theirs_ddp, theirs)
    assert largest_difference(ours_model, before) > 1e-3  # it trained
    worst = largest_difference(ours_model, theirs_model)
    assert agree_everywhere(worst <= TOLERANCE), worst
    # Every rank, joined early or not, ends with the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in ours_model.parameters()])
    first = flat.clone()
    dist.broadcast(first, 0)
    assert agree_everywhere(torch.equal(first, flat))


def test_join_hook_refuses_an_lr_changed_only_on_the_joined_rank():
    if WORLD < 2:
        return
    from torch.distributed.algorithms.join import Join

    model = DDP(tutorial_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    failure = None
    try:
        with Join([model, opt]):
            for step in range(2 + RANK):
                opt.param_groups[0]["lr"] = 0.1 / (step + 1)  # a schedule the joined rank no longer follows
                train_step(model, opt, step)
    except (shardopt.Error, RuntimeError) as e:
        failure = str(e)
    assert agree_everywhere(failure is not None and "is in join() with other hyperparameters" in failure), failure


def main():
    from support import run_tests

    return run_tests(globals(), RANK)


if __name__ == "__main__":
    sys.exit(main())
