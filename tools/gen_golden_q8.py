#!/usr/bin/env python3
"""tools/gen_golden_q8.py — a NumPy reference of bitsandbytes' 8-bit blockwise Adam/AdamW state, writing golden vectors and the quantisation maps.

The algorithm is bitsandbytes 0.50.1's (its CPU backend, bitsandbytes/backends/cpu/ops.py
_optimizer_update_8bit_blockwise_cpu, and the default backend's quantize_blockwise /
dequantize_blockwise; Optimizer2State.init_state for the layout):
  - exp_avg through create_dynamic_map(signed=True), exp_avg_sq through
    create_dynamic_map(signed=False): 256 float32 codes each, sorted;
  - blocks of 256 elements of each parameter (the last one partial), an fp32 absmax per block;
    parameters under min_8bit_size = 4096 elements keep fp32 state (not this file's concern);
  - each step: dequantise (code[q] * absmax), update in fp32, then quantise the new moments:
    absmax = max |x| over the block; a full block scales by x * (1 / max(absmax, 1e-38)), the
    partial last block by x / max(absmax, 1e-38) (and stores that clamped absmax, where full
    blocks store the raw one); clamp to [-1, 1]; the code is torch.bucketize over the midpoints
    (code[i] + code[i+1]) / 2, right=False: ties go to the lower code;
  - fresh state is all codes 0 and absmax 0 (bitsandbytes' zeros).
The update between dequantising and quantising is the project's own rule for Adam/AdamW
(torch.optim's single-tensor float32 operations, no fused multiply-add: kernels/update_rules.hpp),
which is also bitsandbytes' operation order except that torch's vectorised CPU kernels fuse
a + alpha*b. Parameters are float32 here.

Independent of shardopt's kernels: only NumPy float32 arithmetic. The maps are computed by
bitsandbytes' create_dynamic_map (copied below) over torch.linspace where torch imports, else
by torch's scalar linspace formula in NumPy; the generator says which, and how many entries
the two give differently. bitsandbytes builds its maps with torch.linspace on the CPU, whose
vectorised kernels round some entries differently by CPU capability (generic, AVX2 and AVX-512
give three different pairs of maps, each entry within an ulp or so): this generator pins the
generic one (ATEN_CPU_CAPABILITY=default), the portable definition.

Output (default: tests/data and kernels/ of this repository):
  tests/data/golden_q8.txt   plain text, one array per line: `name count values...`; float32
                             values as 8-hex-digit bit patterns, codes as 2-hex-digit bytes,
                             scalars (`hyper` lines) as Python reprs
  kernels/q8_maps.hpp        the two maps and their midpoints as float32 bit patterns
Run: python3 tools/gen_golden_q8.py [--out-data DIR] [--out-header FILE]
"""

import argparse
import os
import sys

import numpy as np

BLOCK = 256
F32 = np.float32


def linspace_scalar_f32(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) by its scalar CPU formula."""
    s, e = F32(start), F32(end)
    step = (e - s) / F32(steps - 1)
    half = steps // 2
    out = []
    for idx in range(steps):
        out.append(s + step * F32(idx) if idx < half else e - step * F32(steps - idx - 1))
    return np.array(out, dtype=F32)


def create_dynamic_map(signed, linspace, max_exponent_bits=7, total_bits=8):
    """bitsandbytes.functional.create_dynamic_map (0.50.1), with the linspace passed in."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / F32(2.0)
        # A Python scalar times a float32 tensor: the scalar is rounded to float32 first.
        data += [float(v) for v in F32(10 ** (-(max_exponent_bits - 1) + i)) * means]
        if signed:
            data += [float(v) for v in F32(-(10 ** (-(max_exponent_bits - 1) + i))) * means]
    assert additional_items == 0  # 8 bits, 7 exponent bits: no linear region
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return np.array(data, dtype=F32)


def torch_linspace():
    # torch's vectorised linspace rounds differently per CPU capability (AVX2 and AVX-512 give
    # other last bits in some entries): the generic build's values are the portable definition.
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
    try:
        import torch
    except ImportError:
        return None, None

    def linspace(start, end, steps):
        return torch.linspace(start, end, steps, dtype=torch.float32).numpy()

    return linspace, f"torch {torch.__version__} (ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']})"


def midpoints(code):
    return ((code[:-1] + code[1:]) / F32(2)).astype(F32)


def quantise(x, code, bounds):
    """One parameter's fp32 values -> (codes, absmax per block)."""
    n = x.size
    codes = np.zeros(n, dtype=np.uint8)
    absmax = np.zeros((n + BLOCK - 1) // BLOCK, dtype=F32)
    for b in range(absmax.size):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        block = x[lo:hi]
        am = np.max(np.abs(block)).astype(F32)
        clamped = max(am, F32(1e-38))
        if hi - lo == BLOCK:
            scaled = block * (F32(1.0) / clamped)
            absmax[b] = am
        else:
            scaled = block / clamped
            absmax[b] = clamped
        scaled = np.clip(scaled, F32(-1), F32(1)).astype(F32)
        codes[lo:hi] = np.searchsorted(bounds, scaled, side="left").astype(np.uint8)
    return codes, absmax


def dequantise(codes, absmax, code):
    scale = np.repeat(absmax, BLOCK)[: codes.size]
    return (code[codes.astype(np.int64)] * scale).astype(F32)


def adam_step(p, g, m, v, h, t):
    """kernels/update_rules.hpp's AdamRule in float32, scalars in double as Python does."""
    beta1, beta2 = F32(h["beta1"]), F32(h["beta2"])
    omb1, omb2 = F32(1.0 - h["beta1"]), F32(1.0 - h["beta2"])
    eps = F32(h["eps"])
    grad = -g if h["maximize"] else g
    param = p
    if h["decoupled"]:
        param = param * F32(1.0 - h["lr"] * h["weight_decay"])
    elif h["weight_decay"] != 0.0:
        grad = grad + F32(h["weight_decay"]) * param
    m_new = m * beta1
    m_new = m_new + omb1 * grad
    v_new = v * beta2
    v_new = v_new + (omb2 * grad) * grad
    bc1 = 1.0 - h["beta1"] ** t
    bc2 = 1.0 - h["beta2"] ** t
    neg_step = F32(-(h["lr"] / bc1))
    bc2_sqrt = F32(np.sqrt(bc2))
    denom = np.sqrt(v_new) / bc2_sqrt + eps
    return (param + (neg_step * m_new) / denom).astype(F32), m_new.astype(F32), v_new.astype(F32)


def hexes(a):
    return " ".join(f"{int(u):08x}" for u in a.view(np.uint32))


def byte_hexes(a):
    return " ".join(f"{int(u):02x}" for u in a)


def run_case(name, n, steps, hyper, seed, maps, out):
    signed, unsigned = maps
    bounds_s, bounds_u = midpoints(signed), midpoints(unsigned)
    rng = np.random.default_rng(seed)
    p = rng.uniform(-1, 1, n).astype(F32)
    q1 = np.zeros(n, dtype=np.uint8)
    q2 = np.zeros(n, dtype=np.uint8)
    a1 = np.zeros((n + BLOCK - 1) // BLOCK, dtype=F32)
    a2 = np.zeros_like(a1)
    out.append(f"case {name}")
    out.append(f"numel 1 {n}")
    out.append(f"steps 1 {steps}")
    for key in ("lr", "beta1", "beta2", "eps", "weight_decay"):
        out.append(f"hyper_{key} 1 {hyper[key]!r}")
    out.append(f"hyper_decoupled 1 {int(hyper['decoupled'])}")
    out.append(f"hyper_maximize 1 {int(hyper['maximize'])}")
    out.append(f"init {n} {hexes(p)}")
    for t in range(1, steps + 1):
        # Gradients of several magnitudes per block, so absmax and the maps' range both matter.
        g = (rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-4, 0, a1.size), BLOCK)[:n]).astype(F32)
        m = dequantise(q1, a1, signed)
        v = dequantise(q2, a2, unsigned)
        p, m, v = adam_step(p, g, m, v, hyper, t)
        q1, a1 = quantise(m, signed, bounds_s)
        q2, a2 = quantise(v, unsigned, bounds_u)
        out.append(f"grad {n} {hexes(g)}")
        out.append(f"param {n} {hexes(p)}")
        out.append(f"exp_avg_codes {n} {byte_hexes(q1)}")
        out.append(f"exp_avg_absmax {a1.size} {hexes(a1)}")
        out.append(f"exp_avg_sq_codes {n} {byte_hexes(q2)}")
        out.append(f"exp_avg_sq_absmax {a2.size} {hexes(a2)}")
    out.append("end")


def header_text(signed, unsigned, source):
    def table(name, values):
        rows = [", ".join(f"0x{int(u):08x}u" for u in values.view(np.uint32)[i:i + 6]) for i in range(0, values.size, 6)]
        return f"inline constexpr uint32_t {name}[{values.size}] = {{\n    " + ",\n    ".join(rows) + "};\n"

    return (
        "// kernels/q8_maps.hpp — bitsandbytes' dynamic quantisation maps (signed for exp_avg, unsigned for exp_avg_sq) and their midpoints, as float32 bit patterns.\n"
        "//\n"
        f"// Generated by tools/gen_golden_q8.py (maps from {source}); do not edit.\n"
        "#pragma once\n\n#include <cstdint>\n\nnamespace shardopt {\nnamespace kernels {\n\n"
        + table("kQ8SignedMap", signed) + "\n" + table("kQ8UnsignedMap", unsigned) + "\n"
        + "// (map[i] + map[i + 1]) / 2 in float32: a scaled value goes to the first code whose midpoint is\n"
        + "// not below it (torch.bucketize, right=False).\n"
        + table("kQ8SignedBounds", midpoints(signed)) + "\n" + table("kQ8UnsignedBounds", midpoints(unsigned))
        + "\n}  // namespace kernels\n}  // namespace shardopt\n"
    )


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-data", default=os.path.join(root, "tests", "data"))
    ap.add_argument("--out-header", default=os.path.join(root, "kernels", "q8_maps.hpp"))
    args = ap.parse_args()

    scalar = (create_dynamic_map(True, linspace_scalar_f32), create_dynamic_map(False, linspace_scalar_f32))
    linspace, source = torch_linspace()
    maps = scalar
    if linspace is not None:
        maps = (create_dynamic_map(True, linspace), create_dynamic_map(False, linspace))
        differ = sum(int(np.sum(a.view(np.uint32) != b.view(np.uint32))) for a, b in zip(maps, scalar))
        print(f"maps from {source}'s linspace; {differ} entries differ from the scalar linspace formula")
    else:
        source = "torch's scalar linspace formula in NumPy"
        print(f"maps from {source} (torch not importable)")
    for m in maps:
        assert np.all(np.diff(m) > 0), "a map must be strictly increasing"

    out = ["# golden_q8 v1: tools/gen_golden_q8.py, bitsandbytes 0.50.1's 8-bit blockwise state; maps from " + source]
    out.append(f"map_signed 256 {hexes(maps[0])}")
    out.append(f"map_unsigned 256 {hexes(maps[1])}")
    base = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, decoupled=True, maximize=False)
    run_case("adamw", 2 * BLOCK + 44, 20, base, 20261127, maps, out)
    run_case("adam_l2_maximize", 3 * BLOCK, 20,
             dict(base, lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1, decoupled=False, maximize=True),
             7, maps, out)
    os.makedirs(args.out_data, exist_ok=True)
    with open(os.path.join(args.out_data, "golden_q8.txt"), "w") as f:
        f.write("\n".join(out) + "\n")
    with open(args.out_header, "w") as f:
        f.write(header_text(maps[0], maps[1], source))
    print(f"wrote {os.path.join(args.out_data, 'golden_q8.txt')} and {args.out_header}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
