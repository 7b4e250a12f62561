#!/usr/bin/env python3
"""tools/gen_golden_averaging.py — writes torch's model-averager trajectories (gloo, W ranks) and validation errors as golden vectors.

Each case spawns W processes that form a torch.distributed gloo group on localhost. Every rank
is a replica with its own plain torch.optim.SGD over a few float32 parameters (identical
initial values on every rank); each step feeds that rank's own gradients, calls
optimizer.step() and then averager.average_parameters(params) of torch's
PeriodicModelAverager or HierarchicalModelAverager, and records every rank's parameters.
tests/mpi/test_averaging_golden.cpp replays the same gradients through shardopt's
ZeroOptimizer (one per rank) and ModelAverager and compares.

Output (default: tests/data next to this repository's tools/):
  golden_averaging_index.json   the case list, the errors file and what produced them (torch
                                version, CPU capability, backend)
  golden_averaging_<case>.json  one case: world_size, averager ("periodic": period;
                                "hierarchical": levels [[period, group_size], ...] in torch's
                                dict order), warmup_steps, optimizer hyperparams (torch's SGD
                                names), params (name, numel, init), steps,
                                grads[step][rank][param], averaged_group_size[step] (the size of
                                the group that step's average_parameters() averaged over, 0 for
                                none), expected[step][rank][param] (the params after that step's
                                average_parameters())
  golden_averaging_errors.json  per world size, the averager configurations torch refuses: the
                                configuration, torch's exception type and message, and `key`,
                                the part of the message (a substring of it) that names the rule
Every float32 value is written as Python's float.hex() of that value (e.g. "-0x1.8p-3"): exact,
and parsed by C's strtof without any decimal rounding question. Gradients and initial values
come from torch's seeded generator rounded to multiples of 2^-10 (exact in float32, short in
the file), and are stored: the test replays the files, never the generator.

Run with an interpreter that has torch with torch.distributed and gloo, recent enough that
dist.new_subgroups works without CUDA (torch 2.x; torch 1.13 refuses on a CPU-only machine):
  python3 tools/gen_golden_averaging.py [--out DIR]
The arithmetic is torch's unfused CPU kernels (ATEN_CPU_CAPABILITY=default is set before torch
is imported: its AVX2 kernels fuse p + alpha*g into an FMA, shardopt's never do), one thread
per rank; gloo's all-reduce order is fixed for a given world size, so the output is
byte-identical across runs with the same torch build.
"""

import argparse
import json
import math
import os
import re
import socket
import sys
import tempfile
import warnings
import zlib

from golden_json import write_json
from collections import OrderedDict

# Before torch is imported, here and (inherited) in every spawned rank.
os.environ["ATEN_CPU_CAPABILITY"] = "default"

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.algorithms.model_averaging import hierarchical_model_averager
except ImportError as e:  # a clear message instead of a traceback
    sys.stderr.write("gen_golden_averaging.py: cannot import torch.distributed with %s (%s); run it "
                     "with an interpreter that has torch\n" % (sys.executable, e))
    sys.exit(2)

FORMAT = "shardopt-golden-averaging-v1"
ERRORS_FORMAT = "shardopt-golden-averaging-errors-v1"
INDEX_FILE = "golden_averaging_index.json"
ERRORS_FILE = "golden_averaging_errors.json"
PARAM_NUMELS = (5, 17, 3)
GRID = 1024.0  # gradients and initial values are multiples of 1/GRID


def case(name, world_size, averager, steps, warmup_steps, hyper, description,
         period=None, levels=None):
    return {"name": name, "world_size": world_size, "averager": averager, "steps": steps,
            "warmup_steps": warmup_steps, "hyper": hyper, "description": description,
            "period": period, "levels": levels}


CASES = [
    case("periodic_p2_w1_ws2", 2, "periodic", 7, 1, dict(lr=0.1),
         "averages after steps 1, 3, 5 (0-based): (step - warmup) % period == 0", period=2),
    case("periodic_p2_w1_ws4", 4, "periodic", 7, 1, dict(lr=0.1),
         "as periodic_p2_w1_ws2 over 4 replicas: gloo sums 4 values in its own order", period=2),
    case("periodic_p3_w0_ws2", 2, "periodic", 7, 0, dict(lr=0.1),
         "without warmup step 0 averages too: steps 0, 3, 6", period=3),
    case("periodic_p2_w1_momentum_ws2", 2, "periodic", 7, 1, dict(lr=0.1, momentum=0.9),
         "averaging replaces the params, not the momentum buffers, which stay per replica",
         period=2),
    case("hierarchical_2x2_4x4_w1_ws4", 4, "hierarchical", 8, 1, dict(lr=0.1),
         "pairs of ranks average at steps 2 and 6, the world at step 4 (the largest period that "
         "divides the step wins); step 0 is warmup", levels=[[2, 2], [4, 4]]),
]


def error_specs(world_size):
    """(name, averager kwargs, key): configurations torch refuses at this world size, each with
    exactly one defect; `key` is the part of torch's message that states the rule."""
    half = world_size // 2
    specs = [
        ("periodic_period_0", dict(averager="periodic", period=0, warmup_steps=0),
         "``period`` must be a positive value"),
        ("periodic_negative_warmup", dict(averager="periodic", period=2, warmup_steps=-1),
         "``warmup_steps`` must be a non-negative number"),
        ("hierarchical_empty", dict(averager="hierarchical", levels=[], warmup_steps=0),
         "``period_group_size_dict`` must not be empty"),
        ("hierarchical_period_0", dict(averager="hierarchical", levels=[[0, half], [4, world_size]],
                                       warmup_steps=0),
         "The minimum period in arg ``period_group_size_dict`` must be a positive value"),
        ("hierarchical_last_not_world",
         dict(averager="hierarchical", levels=[[2, half]], warmup_steps=0),
         "must be equal to the size of arg ``process_group`` %d" % world_size),
        # -1, not 0: shardopt's AveragingLevel reads group size 0 as "the whole world".
        ("hierarchical_group_size_negative",
         dict(averager="hierarchical", levels=[[2, -1], [4, world_size]], warmup_steps=0),
         "The arg 'group_size' (-1) must be positive"),
        ("hierarchical_group_exceeds_world",
         dict(averager="hierarchical", levels=[[2, 2 * world_size], [4, world_size]],
              warmup_steps=0),
         "must not exceed the world size (%d)" % world_size),
        ("hierarchical_negative_warmup",
         dict(averager="hierarchical", levels=[[2, half], [4, world_size]], warmup_steps=-1),
         "``warmup_steps`` must be a non-negative number"),
    ]
    if world_size == 4:  # 2 has no group size below it that does not divide it
        specs.append(("hierarchical_group_not_dividing",
                      dict(averager="hierarchical", levels=[[2, 3], [4, 4]], warmup_steps=0),
                      "The world size (4) must be divisible by"))
    return specs


def hexf(value):
    """Exact text for a float32 value: float.hex() with the mantissa's trailing zeros cut."""
    if not math.isfinite(value):
        raise ValueError("non-finite value %r in golden data" % value)
    mantissa, exponent = value.hex().split("p")
    return mantissa.rstrip("0").rstrip(".") + "p" + exponent


def hex_list(tensor):
    assert tensor.dtype == torch.float32
    return [hexf(v) for v in tensor.detach().reshape(-1).tolist()]


def on_grid(gen, numel, scale):
    """Seeded normal values rounded to multiples of 1/GRID: exact float32s, stored anyway."""
    values = torch.randn(numel, generator=gen, dtype=torch.float64) * scale
    return (torch.round(values * GRID) / GRID).to(torch.float32)


def case_inputs(spec):
    """Initial params (the same on every rank) and grads[step][rank][param] (differing by rank)."""
    gen = torch.Generator().manual_seed(zlib.crc32(spec["name"].encode()))
    inits = [on_grid(gen, n, 0.5) for n in PARAM_NUMELS]
    grads = []
    for step in range(spec["steps"]):
        per_rank = []
        for rank in range(spec["world_size"]):
            gen = torch.Generator().manual_seed(zlib.crc32(("%s/%d/%d" % (spec["name"], rank, step)).encode()))
            per_rank.append([on_grid(gen, n, 1.0) for n in PARAM_NUMELS])
        grads.append(per_rank)
    return inits, grads


def make_averager(config):
    if config["averager"] == "periodic":
        return averagers.PeriodicModelAverager(period=config["period"],
                                               warmup_steps=config["warmup_steps"])
    return hierarchical_model_averager.HierarchicalModelAverager(
        period_group_size_dict=OrderedDict((p, g) for p, g in config["levels"]),
        warmup_steps=config["warmup_steps"])


def averaging_group_size(averager):
    """The size of the group the next average_parameters() averages over, 0 for none (torch's
    own rule, read from the averager before it runs)."""
    if averager.step < averager.warmup_steps:
        return 0
    if isinstance(averager, averagers.PeriodicModelAverager):
        due = (averager.step - averager.warmup_steps) % averager.period == 0
        return dist.get_world_size(averager.process_group) if due else 0
    group = averager._find_process_group()
    return 0 if group is None else dist.get_world_size(group)


def run_trajectory(spec, rank):
    inits, grads = case_inputs(spec)
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    optimizer = torch.optim.SGD(params, foreach=False, **spec["hyper"])
    averager = make_averager(spec)
    expected, group_sizes = [], []
    for step in range(spec["steps"]):
        for p, g in zip(params, grads[step][rank]):
            p.grad = g.clone()
        optimizer.step()
        group_sizes.append(averaging_group_size(averager))
        averager.average_parameters(params)
        expected.append([hex_list(p) for p in params])
    return {"expected": expected, "averaged_group_size": group_sizes}


def run_errors(world_size):
    out = []
    for name, config, key in error_specs(world_size):
        try:
            make_averager(config)
        except Exception as e:  # noqa: BLE001 - whatever torch raises is what we record
            message = str(e)
            if key not in message:
                raise RuntimeError("%s: key %r is not in torch's message %r" % (name, key, message))
            out.append({"name": name, "config": config, "torch_type": type(e).__name__,
                        "torch_message": message, "key": key})
        else:
            raise RuntimeError("%s: torch accepted %r" % (name, config))
    return out


def worker(rank, world_size, port, specs, result_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # no intra-op split can change how elements are grouped
    warnings.simplefilter("ignore")  # torch's experimental-API notes are not data
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = {"cases": {spec["name"]: run_trajectory(spec, rank) for spec in specs},
                  "errors": run_errors(world_size),
                  "cpu_capability": cpu_capability()}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(result_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_capability():
    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if getter is not None:
        return getter()
    match = re.search(r"CPU capability usage: (.*)", torch.__config__.show())
    return match.group(1).strip() if match else "unknown"


def run_world(world_size, specs):
    """Spawns the ranks once for every case of this world size; returns the per-rank results."""
    with tempfile.TemporaryDirectory() as result_dir:
        mp.spawn(worker, args=(world_size, free_port(), specs, result_dir), nprocs=world_size,
                 join=True)
        results = []
        for rank in range(world_size):
            with open(os.path.join(result_dir, "rank%d.json" % rank)) as f:
                results.append(json.load(f))
    return results


def check_case(spec, expected, group_sizes):
    """What the test relies on: averaging happened, made the group's ranks equal, and the ranks
    differ between averagings (else a replay that never averaged could pass)."""
    world = spec["world_size"]
    if not any(group_sizes) or not any(s == 0 for s in group_sizes):
        raise RuntimeError("%s: needs steps that average and steps that do not" % spec["name"])
    for step, size in enumerate(group_sizes):
        ranks = [expected[step][r] for r in range(world)]
        if size == 0 and any(ranks[r] == ranks[0] for r in range(1, world)):
            raise RuntimeError("%s step %d: ranks are equal without averaging" % (spec["name"], step))
        for first in range(0, world, size or world):
            if size and any(ranks[r] != ranks[first] for r in range(first, first + size)):
                raise RuntimeError("%s step %d: a group differs after averaging" % (spec["name"], step))




def main(argv):
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "data")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="output folder (default: tests/data)")
    args = parser.parse_args(argv)
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)

    names = [spec["name"] for spec in CASES]
    if len(set(names)) != len(names) or any(n in ("index", "errors") for n in names):
        raise RuntimeError("case names must be unique and not 'index' or 'errors'")
    worlds = sorted({spec["world_size"] for spec in CASES})
    errors = []
    capability = None
    for world_size in worlds:
        specs = [spec for spec in CASES if spec["world_size"] == world_size]
        results = run_world(world_size, specs)
        capability = results[0]["cpu_capability"]
        if any(r["errors"] != results[0]["errors"] for r in results):
            raise RuntimeError("ranks of world %d disagree on torch's errors" % world_size)
        errors.append({"world_size": world_size, "errors": results[0]["errors"]})
        for spec in specs:
            per_rank = [r["cases"][spec["name"]] for r in results]
            group_sizes = per_rank[0]["averaged_group_size"]
            if any(r["averaged_group_size"] != group_sizes for r in per_rank):
                raise RuntimeError("%s: ranks disagree on when they averaged" % spec["name"])
            expected = [[per_rank[r]["expected"][step] for r in range(world_size)]
                        for step in range(spec["steps"])]
            check_case(spec, expected, group_sizes)
            inits, grads = case_inputs(spec)
            data = {
                "format": FORMAT,
                "case": spec["name"],
                "description": spec["description"],
                "world_size": world_size,
                "averager": spec["averager"],
                "warmup_steps": spec["warmup_steps"],
                "optimizer": "SGD",
                "hyperparams": {k: float(v) for k, v in spec["hyper"].items()},
                "float_encoding": "float32 values as float.hex() strings",
                "steps": spec["steps"],
                "params": [{"name": "p%d" % i, "numel": n, "init": hex_list(inits[i])}
                           for i, n in enumerate(PARAM_NUMELS)],
                "grads": [[[hex_list(g) for g in rank_grads] for rank_grads in step_grads]
                          for step_grads in grads],
                "averaged_group_size": group_sizes,
                "expected": expected,
            }
            if spec["averager"] == "periodic":
                data["period"] = spec["period"]
            else:
                data["levels"] = spec["levels"]
            write_json(os.path.join(out, "golden_averaging_%s.json" % spec["name"]), data)
    if "AVX" in capability.upper():
        raise RuntimeError("torch ran its %s kernels (fused multiply-adds), not the default ones"
                           % capability)
    write_json(os.path.join(out, ERRORS_FILE), {"format": ERRORS_FORMAT, "worlds": errors})
    write_json(os.path.join(out, INDEX_FILE), {
        "format": FORMAT,
        "generator": "tools/gen_golden_averaging.py",
        "torch_version": torch.__version__,
        "cpu_capability": capability,
        "backend": "gloo",
        "cases": names,
        "errors": ERRORS_FILE,
    })
    # Drop files of averaging cases that no longer exist so the folder matches the index.
    keep = {"golden_averaging_%s.json" % n for n in names} | {INDEX_FILE, ERRORS_FILE}
    for stale in os.listdir(out):
        if re.fullmatch(r"golden_averaging_.+\.json", stale) and stale not in keep:
            os.remove(os.path.join(out, stale))
    print("gen_golden_averaging.py: wrote %d averaging cases and the errors of %d world sizes to %s "
          "(torch %s, gloo, CPU capability %s)"
          % (len(names), len(errors), out, torch.__version__, capability))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
