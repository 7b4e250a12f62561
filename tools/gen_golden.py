#!/usr/bin/env python3
"""tools/gen_golden.py — writes torch.optim trajectories, some clipped, as golden parity vectors.

Each case builds a few float32 parameters from a seeded generator, feeds K gradient sets to
torch.optim.<Optimizer>(..., foreach=False) and records every parameter after every step, so
tests/parity can replay the same gradients through shardopt and compare.

Output (default: tests/data next to this repository's tools/):
  golden_index.json     the case list and what produced it (torch version, CPU capability)
  golden_<case>.json    one case: optimizer, groups (param indices, torch's hyperparameter names
                        and values at step 1, and per_step: the value of lr, and of any other
                        hyperparameter a schedule changes, at every step), initial params,
                        grads[step][param], expected[step][param] (the params after that step)
Every float32 value is written as Python's float.hex() of that value (e.g. "-0x1.8p-3"): exact,
sign- and zero-preserving, and parsed by C's strtof without any decimal rounding question.

Gradient clipping (tests/parity/parity_clip_test.cpp) has cases of its own, named clip_*:
  golden_clip_index.json   as golden_index.json, format "shardopt-golden-clip-v1"
  golden_clip_<...>.json   everything a plain case holds (format "shardopt-golden-clip-v1"),
                           plus "clip": {"norm_type": 2.0 or "inf",
                                         "max_norm": [per step: a number, or null where
                                                      clip_grad_norm_ is not called that step]},
                           "total_norm": [per step: the float32 tensor clip_grad_norm_(params,
                                          max_norm, norm_type) returned, or null],
                           "clip_coef": [per step: torch's float32 clamp(max_norm / (total_norm +
                                         1e-6), max=1), or null]
  Each step feeds grads[step] (the gradients before clipping), calls clip_grad_norm_ over all
  params (registration order, every group) and then optimizer.step(); expected[step] are the
  params after that step. Every called step's norm lies at least CLIP_MARGIN (relative) away
  from its max_norm, so float32-vs-double rounding cannot flip whether it clips, and each case
  has clipped and unclipped steps and a trajectory that differs from the unclipped one by far
  more than the parity tolerance (the generator checks all three).

Needs only torch (no numpy), so any interpreter that can `import torch` works, e.g.
  /usr/bin/python3 tools/gen_golden.py [--out DIR]
The output is byte-identical across runs with the same torch build. torch's CPU kernels fuse
`a + alpha*b` into an FMA on AVX2/AVX512 builds; run with ATEN_CPU_CAPABILITY=default to get
the unfused arithmetic instead (the capability used is recorded in the files).
"""

import argparse
import inspect
import math
import os
import re
import sys
import zlib

from golden_json import write_json

try:
    import torch
except ImportError:  # a clear message instead of a traceback: the default python3 may lack torch
    sys.stderr.write(
        "gen_golden.py: cannot import torch with %s; run it with an interpreter that has torch "
        "(e.g. /usr/bin/python3 on Debian with python3-torch)\n" % sys.executable)
    sys.exit(2)

FORMAT = "shardopt-golden-v1"
CLIP_FORMAT = "shardopt-golden-clip-v1"
# Smallest relative distance between a clipped step's norm and its max_norm (see above).
CLIP_MARGIN = 0.01
# Smallest worst |clipped - unclipped| / max(1, |clipped|) over a clip case's params: a
# replay that ignored clipping must fail the 1e-6 parity tolerance by a wide margin.
CLIP_MIN_EFFECT = 1e-4
STEPS = 5
PARAM_NUMELS = (1, 7, 37, 67)  # 37 and 67 cover torch's 16-wide vector body plus a scalar tail
# Gradient magnitude per step: a large step followed by small ones makes AMSGrad's running max
# differ from exp_avg_sq, and the tiny step makes eps matter.
STEP_SCALES = (1.0, 0.05, 2.0, 1e-3, 0.5)

# torch hyperparameter names that shardopt's Hyperparams models, per optimizer.
HYPER_KEYS = {
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
}
# Group options that select an implementation rather than the math; they must stay at these
# values so the single-tensor reference path runs.
NEUTRAL_OPTIONS = {"foreach": (False, None), "differentiable": (False,), "capturable": (False,),
                   "fused": (False, None)}


def case(name, optimizer, groups, schedule=None, description=""):
    """groups: list of (param indices, torch kwargs).
    schedule: {group: {hyperparameter: [value per step]}}, written into the group before each
    step as a trainer's scheduler would."""
    return {"name": name, "optimizer": optimizer, "groups": groups,
            "schedule": schedule or {}, "description": description, "clip": None}


def clip_case(name, optimizer, groups, norm_type, max_norm, schedule=None, description=""):
    """A case that calls torch.nn.utils.clip_grad_norm_(all params, max_norm[step], norm_type)
    before each step. max_norm: one value, or one per step with None for "not called"."""
    spec = case(name, optimizer, groups, schedule, description)
    per_step = list(max_norm) if isinstance(max_norm, (list, tuple)) else [max_norm] * STEPS
    spec["clip"] = {"norm_type": norm_type, "max_norm": per_step}
    return spec


ALL = [0, 1, 2, 3]
CASES = [
    # SGD: lr is required by torch, so every case sets it.
    case("sgd_plain", "SGD", [(ALL, dict(lr=0.1))]),
    case("sgd_momentum", "SGD", [(ALL, dict(lr=0.1, momentum=0.9))],
         description="first step clones d_p into the momentum buffer"),
    case("sgd_momentum_dampening", "SGD", [(ALL, dict(lr=0.1, momentum=0.9, dampening=0.3))],
         description="dampening is not applied on the first step"),
    case("sgd_nesterov", "SGD", [(ALL, dict(lr=0.1, momentum=0.9, nesterov=True))]),
    case("sgd_weight_decay", "SGD", [(ALL, dict(lr=0.1, weight_decay=0.05))]),
    case("sgd_maximize", "SGD", [(ALL, dict(lr=0.1, maximize=True))]),
    case("sgd_all_nesterov", "SGD",
         [(ALL, dict(lr=0.05, momentum=0.8, weight_decay=0.01, nesterov=True, maximize=True))],
         description="nesterov requires dampening 0, hence two 'all combined' cases"),
    case("sgd_all_dampening", "SGD",
         [(ALL, dict(lr=0.05, momentum=0.8, dampening=0.25, weight_decay=0.01, maximize=True))]),
    case("sgd_lr_schedule", "SGD", [(ALL, dict(lr=0.1, momentum=0.9, weight_decay=0.01))],
         schedule={0: {"lr": [0.1, 0.05, 0.2, 0.02, 0.1]}}),
    case("sgd_momentum_schedule", "SGD", [(ALL, dict(lr=0.1, momentum=0.0, dampening=0.1))],
         schedule={0: {"momentum": [0.0, 0.9, 0.9, 0.0, 0.5]}},
         description="torch creates the momentum buffer at the first step with momentum != 0 and "
                     "keeps it, untouched, through momentum-0 steps"),
    case("sgd_two_groups", "SGD",
         [([0, 2], dict(lr=0.1, momentum=0.9)),
          ([1, 3], dict(lr=0.03, momentum=0.5, nesterov=True, weight_decay=0.02))],
         schedule={1: {"lr": [0.03, 0.06, 0.01, 0.03, 0.02]}},
         description="groups own their hyperparameters; only group 1 changes lr"),
    # Adam
    case("adam_default", "Adam", [(ALL, dict())]),
    case("adam_weight_decay", "Adam", [(ALL, dict(weight_decay=0.05))]),
    case("adam_amsgrad", "Adam", [(ALL, dict(amsgrad=True))]),
    case("adam_maximize", "Adam", [(ALL, dict(maximize=True))]),
    case("adam_amsgrad_wd_maximize", "Adam",
         [(ALL, dict(amsgrad=True, weight_decay=0.05, maximize=True))]),
    case("adam_custom", "Adam", [(ALL, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6))],
         description="non-default lr, betas and eps"),
    case("adam_lr_schedule", "Adam", [(ALL, dict(lr=1e-3, weight_decay=0.01))],
         schedule={0: {"lr": [1e-3, 3e-3, 5e-4, 1e-2, 2e-3]}}),
    case("adam_two_groups", "Adam",
         [([3, 0], dict(lr=2e-3)),
          ([1, 2], dict(lr=1e-2, betas=(0.5, 0.9), amsgrad=True, weight_decay=0.1))],
         description="per-group betas/amsgrad; group 0 lists its params out of index order"),
    # AdamW (torch's default weight_decay is 1e-2)
    case("adamw_default", "AdamW", [(ALL, dict())]),
    case("adamw_weight_decay", "AdamW", [(ALL, dict(weight_decay=0.1))]),
    case("adamw_amsgrad", "AdamW", [(ALL, dict(amsgrad=True, weight_decay=0.1))]),
    case("adamw_maximize", "AdamW", [(ALL, dict(maximize=True, weight_decay=0.1))]),
    case("adamw_custom", "AdamW",
         [(ALL, dict(lr=5e-3, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.2))],
         description="non-default lr, betas and eps"),
    case("adamw_hyper_schedule", "AdamW", [(ALL, dict(lr=1e-2, weight_decay=0.1))],
         schedule={0: {"betas": [(0.9, 0.999)] * 2 + [(0.8, 0.99)] * 3,
                       "eps": [1e-8, 1e-8, 1e-8, 1e-6, 1e-6],
                       "weight_decay": [0.1, 0.1, 0.0, 0.0, 0.3]}},
         description="bias corrections use the current betas with the running step count"),
    case("adamw_lr_schedule", "AdamW", [(ALL, dict(lr=1e-2, weight_decay=0.1))],
         schedule={0: {"lr": [1e-2, 5e-3, 2e-2, 1e-3, 1e-2]}},
         description="the decoupled decay factor 1 - lr*wd follows the lr"),
]

# Total gradient norms per step follow STEP_SCALES (large, small, larger, tiny, medium), so one
# max_norm clips the large steps and leaves the small ones alone; the comments give torch's norms.
INF = float("inf")
CLIP_CASES = [
    # L2 norms 2.03, 0.068, 4.12, 0.0030, 1.54
    clip_case("clip_sgd_momentum_wd", "SGD", [(ALL, dict(lr=0.1, momentum=0.9, weight_decay=0.05))],
              2.0, [1.8, 0.05, None, 1.8, 1.0],
              description="max_norm changes per step; clips steps 1, 2 and 5, not 4; step 3, the "
                          "largest, has no clip_grad_norm_ call: step 2's factor must not carry "
                          "over to it; weight decay is added to the clipped gradient"),
    # inf norms 1.275, 0.0297, 1.321, 0.00091, 1.209
    clip_case("clip_sgd_nesterov_inf", "SGD", [(ALL, dict(lr=0.05, momentum=0.8, nesterov=True))],
              INF, 1.25,
              description="max-abs norm; clips steps 1 and 3, step 5 is 3% under max_norm"),
    # L2 norms 2.15, 0.073, 3.70, 0.0018, 0.968
    clip_case("clip_adam_wd", "Adam", [(ALL, dict(lr=1e-2, weight_decay=0.05))], 2.0, 2.0,
              description="clips steps 1 and 3; L2 weight decay is added to the clipped gradient"),
    # inf norms 2.30, 0.057, 2.32, 0.0014, 0.638
    clip_case("clip_adam_amsgrad_inf", "Adam", [(ALL, dict(lr=1e-2, amsgrad=True))], INF, 0.05,
              description="max-abs norm; clips every step but the tiny step 4"),
    # L2 norms 1.51, 0.114, 4.60, 0.0021, 0.844
    clip_case("clip_adamw_two_groups", "AdamW",
              [([0, 2], dict(lr=1e-2, weight_decay=0.1)),
               ([1, 3], dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.0))],
              2.0, 1.0, schedule={1: {"lr": [3e-3, 6e-3, 1e-3, 3e-3, 2e-3]}},
              description="one total norm over both groups; clips steps 1 and 3"),
]


def hexf(value):
    """Exact text for a float32 value: float.hex() with the mantissa's trailing zeros cut."""
    if not math.isfinite(value):
        raise ValueError("non-finite value %r in golden data" % value)
    mantissa, exponent = value.hex().split("p")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return mantissa + "p" + exponent


def hex_list(tensor):
    assert tensor.dtype == torch.float32
    return [hexf(v) for v in tensor.detach().reshape(-1).tolist()]


def cpu_capability():
    """The ATen CPU kernel flavour in use ("AVX2", "NO AVX", ...): it decides FMA contraction."""
    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if getter is not None:
        return getter()
    match = re.search(r"CPU capability usage: (.*)", torch.__config__.show())
    return match.group(1).strip() if match else "unknown"


def make_optimizer(optimizer_name, param_groups):
    cls = getattr(torch.optim, optimizer_name)
    kwargs = {}
    # foreach=False selects the per-tensor loop (the reference formulas) on every version.
    if "foreach" in inspect.signature(cls.__init__).parameters:
        kwargs["foreach"] = False
    return cls(param_groups, **kwargs)


def torch_hyperparams(optimizer_name, group):
    for key, allowed in NEUTRAL_OPTIONS.items():
        if key in group and group[key] not in allowed:
            raise RuntimeError("group option %s=%r would leave the reference path"
                               % (key, group[key]))
    return {key: json_hyper(key, group[key]) for key in HYPER_KEYS[optimizer_name]}


def json_hyper(key, value):
    """A hyperparameter as JSON: bools stay bools, betas a [beta1, beta2] pair, the rest doubles
    (repr of a Python float round-trips exactly through any correct JSON parser)."""
    if key == "betas":
        return [float(value[0]), float(value[1])]
    if isinstance(value, bool):
        return value
    return float(value)


def trajectory(spec, inits, grads, clip):
    """Runs the optimizer over the gradients. clip: None, or spec["clip"] to call
    clip_grad_norm_ before each step. Returns (hypers, per_step, expected, norms, coefs) with
    torch's float32 norm and clamped clip coefficient per step (None where not clipped)."""
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    used = sorted(i for indices, _ in spec["groups"] for i in indices)
    if used != list(range(len(params))):
        raise RuntimeError("%s: every param must be in exactly one group" % spec["name"])
    opt = make_optimizer(spec["optimizer"], [dict(params=[params[i] for i in indices], **kw)
                                             for indices, kw in spec["groups"]])

    per_step = []  # per group: {hyperparameter: [value per step]}, lr always included
    for g, group in enumerate(opt.param_groups):
        values = {"lr": [group["lr"]] * STEPS}
        for key, seq in spec["schedule"].get(g, {}).items():
            if key not in HYPER_KEYS[spec["optimizer"]] or len(seq) != STEPS:
                raise RuntimeError("%s: bad schedule for %s" % (spec["name"], key))
            values[key] = list(seq)
        per_step.append(values)
    for g, group in enumerate(opt.param_groups):
        group.update({key: seq[0] for key, seq in per_step[g].items()})
    hypers = [torch_hyperparams(spec["optimizer"], group) for group in opt.param_groups]

    expected, norms, coefs = [], [], []
    for step in range(STEPS):
        for g, group in enumerate(opt.param_groups):
            # A scheduler writes the group between steps; torch reads it at step().
            group.update({key: seq[step] for key, seq in per_step[g].items()})
        for p, grad in zip(params, grads[step]):
            p.grad = grad.clone()
        max_norm = clip["max_norm"][step] if clip is not None else None
        if max_norm is None:
            norms.append(None)
            coefs.append(None)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, clip["norm_type"])
            assert norm.dtype == torch.float32 and norm.dim() == 0
            norms.append(norm.item())
            # The factor torch multiplied the gradients by, recomputed exactly as it does.
            coefs.append(torch.clamp(max_norm / (norm + 1e-6), max=1.0).item())
        opt.step()
        expected.append([p.detach().clone() for p in params])
    return hypers, per_step, expected, norms, coefs


def check_clip_case(spec, expected, norms, unclipped):
    """The properties the format promises for a clip case (see the module docstring)."""
    name, clip = spec["name"], spec["clip"]
    if clip["norm_type"] not in (2.0, INF) or len(clip["max_norm"]) != STEPS:
        raise RuntimeError("%s: norm_type must be 2 or inf, max_norm one per step" % name)
    clipped = []
    for step, (max_norm, norm) in enumerate(zip(clip["max_norm"], norms)):
        if max_norm is None:
            continue
        if not (max_norm > 0 and abs(norm - max_norm) >= CLIP_MARGIN * max_norm):
            raise RuntimeError("%s step %d: norm %r is within %g of max_norm %r: pick another"
                               % (name, step + 1, norm, CLIP_MARGIN, max_norm))
        clipped.append(norm > max_norm)
    if not (any(clipped) and not all(clipped)):
        raise RuntimeError("%s: needs both clipped and unclipped steps" % name)
    effect = max(((a - b).abs() / torch.clamp(b.abs(), min=1.0)).max().item()
                 for step_a, step_b in zip(unclipped, expected) for a, b in zip(step_a, step_b))
    if not effect >= CLIP_MIN_EFFECT:
        raise RuntimeError("%s: clipping changes the params by only %g relative" % (name, effect))
    return effect


def run_case(spec):
    seed = zlib.crc32(spec["name"].encode())  # per case, stable when cases are added or reordered
    gen = torch.Generator().manual_seed(seed)
    inits = [torch.randn(n, generator=gen, dtype=torch.float32) * 0.5 for n in PARAM_NUMELS]
    # Per-element magnitudes over 4 decades so some gradients are tiny against eps.
    elem_scales = [torch.pow(10.0, -4.0 * torch.rand(n, generator=gen)) for n in PARAM_NUMELS]
    grads = []
    for step in range(STEPS):
        grads.append([(torch.randn(n, generator=gen, dtype=torch.float32) * STEP_SCALES[step]
                       * elem_scales[i]).to(torch.float32)
                      for i, n in enumerate(PARAM_NUMELS)])

    clip = spec["clip"]
    hypers, per_step, expected, norms, coefs = trajectory(spec, inits, grads, clip)
    data = {
        "format": FORMAT if clip is None else CLIP_FORMAT,
        "case": spec["name"],
        "description": spec["description"],
        "optimizer": spec["optimizer"],
        "float_encoding": "float32 values as float.hex() strings",
        "seed": seed,
        "steps": STEPS,
        "params": [{"name": "p%d" % i, "numel": n, "init": hex_list(inits[i])}
                   for i, n in enumerate(PARAM_NUMELS)],
        "groups": [{"params": list(indices), "hyperparams": hypers[g],
                    "per_step": {key: [json_hyper(key, v) for v in seq]
                                 for key, seq in per_step[g].items()}}
                   for g, (indices, _) in enumerate(spec["groups"])],
        "grads": [[hex_list(t) for t in step_grads] for step_grads in grads],
        "expected": [[hex_list(p) for p in step_params] for step_params in expected],
    }
    if clip is not None:
        unclipped = trajectory(spec, inits, grads, None)[2]
        check_clip_case(spec, expected, norms, unclipped)
        data["clip"] = {"norm_type": "inf" if clip["norm_type"] == INF else float(clip["norm_type"]),
                        "max_norm": [None if m is None else float(m) for m in clip["max_norm"]]}
        data["total_norm"] = [None if v is None else hexf(v) for v in norms]
        data["clip_coef"] = [None if v is None else hexf(v) for v in coefs]
    return data




def main(argv):
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                               "data")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=default_out, help="output folder (default: tests/data)")
    args = parser.parse_args(argv)
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)

    torch.set_num_threads(1)  # no intra-op split can change how elements are grouped
    # (index file, format, cases): plain cases are named anything but clip_*, clip cases clip_*,
    # so golden_<case>.json never collides and each index owns its files.
    sets = (("golden_index.json", FORMAT, CASES), ("golden_clip_index.json", CLIP_FORMAT, CLIP_CASES))
    for index_file, _, specs in sets:
        for spec in specs:
            is_clip = spec["clip"] is not None
            if (spec["name"].startswith("clip_") != is_clip or spec["name"] in ("index", "clip_index")
                    or is_clip != (specs is CLIP_CASES)):
                raise RuntimeError("case %r: clip cases (and only they) are named clip_*, in "
                                   "CLIP_CASES" % spec["name"])
    written = set()
    for index_file, fmt, specs in sets:
        names = []
        for spec in specs:
            write_json(os.path.join(out, "golden_%s.json" % spec["name"]), run_case(spec))
            names.append(spec["name"])
        written.update(names)
        write_json(os.path.join(out, index_file), {
            "format": fmt,
            "generator": "tools/gen_golden.py",
            "torch_version": torch.__version__,
            "cpu_capability": cpu_capability(),
            "cases": names,
        })
        print("gen_golden.py: wrote %d %s cases to %s (torch %s, CPU capability %s)"
              % (len(names), "clip" if specs is CLIP_CASES else "optimizer", out,
                 torch.__version__, cpu_capability()))
    # Drop files of cases that no longer exist so the folder matches the indexes (the
    # averagers' golden files belong to gen_golden_averaging.py).
    for stale in os.listdir(out):
        m = re.fullmatch(r"golden_(.+)\.json", stale)
        if m and not stale.startswith("golden_averaging_") and m.group(1) not in written and stale not in [index for index, _, _ in sets]:
            os.remove(os.path.join(out, stale))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
