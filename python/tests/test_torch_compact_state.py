"""python/tests/test_torch_compact_state.py — the torch drop-in's compact state: master="remainder16" and state_precision="q8" as keywords and group keys, against the fp32 state.

    mpirun -np 2 python -m pytest -q python/tests/test_torch_compact_state.py

Every rank runs every test in the same order (the optimizers' calls are collective). Skipped,
with the reason, where torch cannot be imported.
"""
import os
import sys
import tempfile

try:
    import torch
except ImportError:  # the whole module needs torch
    torch = None

if torch is None:
    if __name__ == "__main__":
        print("test_torch_compact_state: skipped: torch cannot be imported", flush=True)
        sys.exit(0)
    import pytest

    pytest.skip("torch cannot be imported: the drop-in's tests need it", allow_module_level=True)

import shardopt
from shardopt.torch import ZeroRedundancyOptimizer


def model(dtype=torch.float32, width=64, depth=3):
    """Linear(64, 64) layers: 4096-element weights (8-bit moments under q8), 64-element biases."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]).to(dtype)


def train(net, opt, steps):
    """The same data on every rank (no DDP needed: every rank feeds the same gradients)."""
    for step in range(steps):
        opt.zero_grad()
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(16, 64, generator=g).to(next(net.parameters()).dtype)
        net(x).float().square().mean().backward()
        opt.step()


def bits(net):
    return [p.detach().view(torch.int16).clone() for p in net.parameters()]


def test_remainder_masters_equal_fp32_masters_but_at_exact_ties():
    plain_net, compact_net = model(torch.bfloat16), model(torch.bfloat16)
    plain = ZeroRedundancyOptimizer(plain_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    compact = ZeroRedundancyOptimizer(compact_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3,
                                      master="remainder16")
    train(plain_net, plain, 30)
    train(compact_net, compact, 30)
    for a, b in zip(bits(plain_net), bits(compact_net)):
        differ = a != b
        # Where they differ, the remainder's parameter is one unit up from an even pattern.
        assert torch.all(b[differ] == a[differ] + 1)
        assert torch.all(a[differ] % 2 == 0)
    report = compact.memory_report()
    assert report.master_bytes == 2 * report.shard_numel
    assert plain.memory_report().master_bytes == 4 * report.shard_numel


def test_q8_moments_shrink_the_state_and_a_group_can_keep_fp32():
    q8_net, plain_net, mixed_net = model(), model(), model()
    q8 = ZeroRedundancyOptimizer(q8_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                                 state_precision="q8")
    plain = ZeroRedundancyOptimizer(plain_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    # A group dict's own setting: every group keeps fp32 moments, so it is the plain run.
    mixed = ZeroRedundancyOptimizer([{"params": list(mixed_net.parameters()), "state_precision": "fp32"}],
                                    optimizer_class=torch.optim.AdamW, lr=1e-2, state_precision="q8")
    for net, opt in ((q8_net, q8), (plain_net, plain), (mixed_net, mixed)):
        train(net, opt, 10)
    assert all(torch.equal(a, b) for a, b in zip(plain_net.parameters(), mixed_net.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(plain_net.parameters(), q8_net.parameters()))
    # It still trains toward the same place: within a small distance of the fp32 run.
    assert max((a - b).abs().max().item() for a, b in zip(plain_net.parameters(), q8_net.parameters())) < 0.05
    q8_report, plain_report = q8.memory_report(), plain.memory_report()
    assert q8_report.state_bytes <= plain_report.state_bytes
    if q8_report.shard_numel >= 4096:  # this rank holds a weight: 8-bit moments there
        assert q8_report.state_bytes < plain_report.state_bytes / 3


def _share(obj, rank, barrier):
    """Rank 0's `obj` on every rank, through a file (torch.distributed is not initialised here):
    rank 0 writes it, `barrier` (a collective call) orders the reads after the write."""
    path = os.path.join(tempfile.gettempdir(), f"q8_state_dict_{os.environ.get('OMPI_MCA_ess_base_jobid', 'solo')}.pt")
    if rank == 0:
        torch.save(obj, path)
    barrier()
    shared = torch.load(path)
    barrier()
    if rank == 0:
        os.remove(path)
    return shared


def test_q8_state_dict_holds_torchao_fields_and_loads_back_bitwise():
    net, reference_net = model(), model()
    opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2, state_precision="q8")
    reference = ZeroRedundancyOptimizer(reference_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                                        state_precision="q8")
    train(net, opt, 3)
    train(reference_net, reference, 6)
    opt.consolidate_state_dict(0)
    sd = _share(opt.state_dict() if opt.rank == 0 else None, opt.rank, lambda: reference.consolidate_state_dict(0))
    for index, p in enumerate(net.parameters()):
        entry = sd["state"][index]
        for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
            value = entry[key]
            if p.numel() < 4096:  # under min_8bit_size: fp32 moments, as torch's
                assert torch.is_tensor(value) and value.dtype == torch.float32 and value.shape == p.shape
                continue
            # torchao's OptimState8bit's fields (a dict of them without torchao).
            codes, scale, qmap = (value[k] if isinstance(value, dict) else getattr(value, k)
                                  for k in ("codes", "scale", "qmap"))
            assert codes.dtype == torch.uint8 and codes.shape == p.shape
            assert scale.dtype == torch.float32 and scale.numel() == p.numel() // 256
            assert qmap.numel() == 256 and bool(value["signed"] if isinstance(value, dict) else value.signed) == signed
            assert bool((scale > 0).all())
    # Into a fresh optimizer over the saved run's parameters: it continues as the reference.
    resumed_net = model()
    with torch.no_grad():
        for a, b in zip(resumed_net.parameters(), net.parameters()):
            a.copy_(b)
    resumed = ZeroRedundancyOptimizer(resumed_net.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                                      state_precision="q8")
    resumed.load_state_dict(sd)
    for step in range(3, 6):  # train()'s batches from step 3 on
        resumed.zero_grad()
        g = torch.Generator().manual_seed(100 + step)
        resumed_net(torch.randn(16, 64, generator=g)).float().square().mean().backward()
        resumed.step()
    assert all(torch.equal(a, b) for a, b in zip(resumed_net.parameters(), reference_net.parameters()))
    # An fp32-moment optimizer refuses the 8-bit state by name.
    plain = ZeroRedundancyOptimizer(model().parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    try:
        plain.load_state_dict(sd)
    except shardopt.Error as e:
        assert "has 8-bit 'exp_avg' in the state dict" in str(e)
    else:
        raise AssertionError("8-bit state loaded into fp32 moments")


def test_unknown_names_and_unsupported_combinations_are_refused():
    net = model()
    for key, value in (("state_precision", "q4"), ("master", "remainder8")):
        try:
            ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, **{key: value})
        except ValueError as e:
            assert f"{key}={value!r} is not one of" in str(e)
        else:
            raise AssertionError(f"{key}={value!r} was accepted")
    try:  # f32 parameters are their own master
        ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, master="remainder16")
    except shardopt.Error as e:
        assert "master = remainder16 needs bf16 parameters" in str(e)
    else:
        raise AssertionError("remainder16 over f32 parameters was accepted")
    try:  # SGD's momentum has no 8-bit form here
        ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, state_precision="q8")
    except shardopt.Error as e:
        assert "implemented for adam and adamw" in str(e)
    else:
        raise AssertionError("q8 with SGD was accepted")


if __name__ == "__main__":
    from support import run_tests

    sys.exit(run_tests(globals(), torch.distributed.get_rank() if torch.distributed.is_initialized() else 0))
