#!/usr/bin/env python3
"""tools/gen_golden_muon.py — writes torch.optim.Muon trajectories (torch 2.9+) as golden vectors for tests/parity.

Each case is one float32 matrix (tall, wide or square) stepped K times by torch.optim.Muon with
seeded gradients, for every combination of nesterov and adjust_lr_fn. Two files:
  golden_muon_bf16.json  torch's own Muon: its Newton-Schulz runs on a bfloat16 copy (torch's
                         default and only precision); shardopt's bf16 emulation must match it
                         within bfloat16's tolerance.
  golden_muon_f32.json   the fp32 reference: the same Muon with torch's _zeropower_via_newtonschulz
                         replaced by the identical iteration on a float32 copy (nothing else
                         changes); shardopt's f32 Newton-Schulz must match it within 1e-5 relative.
Per case: shape [rows, cols], torch's hyperparameter names and values, init, grads[step],
expected[step] (the matrix after that step) and momentum_buffer (torch's state after the last
step). Every float32 value is float.hex() text, as tools/gen_golden.py writes.

Needs torch >= 2.9 (torch.optim.Muon); run it with any interpreter that imports one, e.g. a
throw-away virtual environment:  python tools/gen_golden_muon.py [--out DIR]
"""

import argparse
import os
import sys

import torch

from golden_json import write_json
from torch_muon_f32 import muon_newton_schulz

SHAPES = {"tall": (7, 3), "wide": (4, 9), "square": (6, 6)}
ADJUST = [None, "original", "match_rms_adamw", "spectral_unclamped"]
STEPS = 3
HYPER = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "eps": 1e-7, "ns_steps": 5,
         "ns_coefficients": [3.4445, -4.775, 2.0315]}


def hexes(tensor):
    return [float(v).hex() for v in tensor.detach().reshape(-1).tolist()]


def run_case(name, shape, nesterov, adjust, seed):
    gen = torch.Generator().manual_seed(seed)
    init = torch.randn(shape, generator=gen, dtype=torch.float32)
    grads = [torch.randn(shape, generator=gen, dtype=torch.float32) for _ in range(STEPS)]
    param = torch.nn.Parameter(init.clone())
    opt = torch.optim.Muon([param], lr=HYPER["lr"], weight_decay=HYPER["weight_decay"],
                           momentum=HYPER["momentum"], nesterov=nesterov,
                           ns_coefficients=tuple(HYPER["ns_coefficients"]), eps=HYPER["eps"],
                           ns_steps=HYPER["ns_steps"], adjust_lr_fn=adjust)
    expected = []
    for g in grads:
        param.grad = g.clone()
        opt.step()
        expected.append(hexes(param))
    return {
        "name": name,
        "shape": list(shape),
        "hyper": dict(HYPER, nesterov=nesterov, adjust_lr_fn=adjust),
        "init": hexes(init),
        "grads": [hexes(g) for g in grads],
        "expected": expected,
        "momentum_buffer": hexes(opt.state[param]["momentum_buffer"]),
    }


def cases():
    seed = 20251127
    for shape_name, shape in SHAPES.items():
        for nesterov in (True, False):
            for adjust in ADJUST:
                seed += 1
                name = f"{shape_name}_{'nesterov' if nesterov else 'plain'}_{adjust or 'none'}"
                yield name, shape, nesterov, adjust, seed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
    args = parser.parse_args()
    if not hasattr(torch.optim, "Muon"):
        sys.exit(f"torch {torch.__version__} has no torch.optim.Muon (needs 2.9 or later)")
    torch.set_num_threads(1)
    for precision in ("bf16", "f32"):
        with muon_newton_schulz(precision):
            cases_run = [run_case(*c) for c in cases()]
        data = {
            "format": "shardopt-golden-muon-v1",
            "precision": precision,
            "torch_version": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "float_encoding": "float32 values as float.hex() strings",
            "steps": STEPS,
            "cases": cases_run,
        }
        write_json(os.path.join(args.out, f"golden_muon_{precision}.json"), data)


if __name__ == "__main__":
    main()
