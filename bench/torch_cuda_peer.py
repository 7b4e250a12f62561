#!/usr/bin/env python3
"""bench/torch_cuda_peer.py — torch's AdamW step on one GPU (fused, foreach and for-loop), timed against a device-to-device bandwidth measured in the same run: the peer of `shardopt-bench --mode step --device cuda`.

Self-contained (torch only, no shardopt). The model is the bench's: --layers L --width W gives
L x Linear(W, W) (weights and biases, torch's order; default 20 x 2000 = 80.04M params), or
--params N gives --tensors K equal params totalling N (the last takes the remainder). Every
implementation starts from the same parameters and gradients (fixed seeds), takes -w untimed
and -n timed steps, each timed with CUDA events on the current stream after a
torch.cuda.synchronize(); the median is printed.

Roofline, counted as the bench counts it (bench/src/roofline.hpp): Adam/AdamW on f32 reads
p, g, m, v and writes p, m, v, 28 bytes per element; bf16 params here have no fp32 masters
(torch's optimizers keep none), so 3 x 2 + 16 = 22 bytes. The bandwidth is the best of a
device-to-device copy (dst.copy_(src), counting read + write) over arrays far beyond the L2
cache, best of several repetitions, measured in this run.

Self-check: the implementations must agree with the for-loop one (max |difference| of the final
parameters, printed; above --tolerance the run fails with exit status 1).

Output: one line per measurement, key=value pairs, each line starting with its kind:

  torch_peer_d2d gpu=... d2d_array_mb=... d2d_copy_gbps=...
  torch_peer impl=fused|foreach|forloop optimizer=adamw dtype=f32 params=... step_ms_median=...
      gpu_event_ms_median=... achieved_gbps=... roofline_ms=... step_over_roofline=...
      max_abs_diff_vs_forloop=... check=ok|FAILED

Example: python3 bench/torch_cuda_peer.py --params 64M -n 20 -w 5
"""

import argparse
import math
import statistics
import sys
import time


def parse_size(text):
    """'64', '1K', '16M', '2G': powers of 1024, as shardopt-bench reads its sizes."""
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale != 1 else text
    try:
        value = int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 80M, got '{text}'")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got '{text}'")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=parse_size, default=0, help="total params, split into --tensors (default: the Linear model)")
    p.add_argument("--tensors", type=int, default=4, help="how many params --params is split into (default 4)")
    p.add_argument("--layers", type=int, default=20, help="Linear layers (default 20)")
    p.add_argument("--width", type=int, default=2000, help="Linear width (default 2000)")
    p.add_argument("--optimizer", choices=["adamw", "adam"], default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--impl", default="fused,foreach,forloop", help="comma-separated subset of fused,foreach,forloop")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--d2d-mb", type=int, default=0, help="MiB per bandwidth array (default max(8 x L2, 512))")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="largest |difference| from the for-loop result accepted (default 1e-5 for f32, 1e-2 for bf16)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    args = p.parse_args(argv)
    impls = [s for s in args.impl.split(",") if s]
    unknown = [s for s in impls if s not in ("fused", "foreach", "forloop")]
    if unknown or not impls:
        p.error(f"--impl expects a subset of fused,foreach,forloop, got '{args.impl}'")
    if args.iters < 1 or args.warmup < 0 or args.tensors < 1 or args.layers < 1 or args.width < 1:
        p.error("-n, --tensors, --layers and --width must be positive, -w non-negative")
    args.impls = impls
    if args.tolerance <= 0:
        args.tolerance = 1e-5 if args.dtype == "f32" else 1e-2
    return args


def model_shapes(args):
    """The bench's model: (name, shape) in registration order."""
    if args.params > 0:
        k = min(args.tensors, args.params)
        base = args.params // k
        return [(f"p{i}", (base if i + 1 < k else args.params - base * (k - 1),)) for i in range(k)]
    shapes = []
    for layer in range(args.layers):
        shapes.append((f"{layer}.weight", (args.width, args.width)))
        shapes.append((f"{layer}.bias", (args.width,)))
    return shapes


def main(argv):
    args = parse_args(argv)
    try:
        import torch  # imported here so that --help works without torch
    except ImportError as e:
        print(f"torch_cuda_peer: torch cannot be imported: {e}", file=sys.stderr)
        return 4

    if not torch.cuda.is_available():
        print("torch_cuda_peer: no CUDA device is available to torch", file=sys.stderr)
        return 4
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    props = torch.cuda.get_device_properties(device)
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)

    def timed_ms(fn, reps):
        """Each of `reps` runs of fn() between CUDA events (after a synchronize), in ms."""
        times = []
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            torch.cuda.synchronize()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return times

    # Device-to-device bandwidth, the roofline's, before the model takes memory.
    array_bytes = (args.d2d_mb << 20) if args.d2d_mb > 0 else max(8 * l2_bytes, 512 << 20)
    src = torch.zeros(array_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best_copy_ms = min(timed_ms(lambda: dst.copy_(src), 10))
    d2d_gbps = 2 * array_bytes / (best_copy_ms * 1e-3) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    print(f"torch_peer_d2d gpu={props.name.replace(' ', '_')} torch={torch.__version__} d2d_array_mb={array_bytes >> 20} "
          f"l2_mb={l2_bytes >> 20} d2d_copy_gbps={d2d_gbps:.1f}", flush=True)

    shapes = model_shapes(args)
    numel = sum(int(torch.Size(s).numel()) for _, s in shapes)
    description = (f"tensors={len(shapes)}" if args.params > 0 else f"layers={args.layers} width={args.width}")
    bytes_per_param = 28 if dtype == torch.float32 else 22
    roofline_ms = numel * bytes_per_param / (d2d_gbps * 1e9) * 1e3

    def fresh_params():
        """The same initial parameters and gradients for every implementation."""
        gen = torch.Generator(device=device)
        gen.manual_seed(1234)
        params = []
        for _, shape in shapes:
            p = (torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * 0.1 - 0.05).to(dtype)
            p.requires_grad_(True)
            p.grad = (torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * 0.02 - 0.01).to(dtype)
            params.append(p)
        return params

    kinds = {"fused": dict(fused=True), "foreach": dict(foreach=True, fused=False), "forloop": dict(foreach=False, fused=False)}
    cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    # The for-loop result is the reference of the check; run it first when it is asked for.
    order = sorted(args.impls, key=lambda s: s != "forloop")
    reference = None
    failed = False
    for impl in order:
        params = fresh_params()
        with torch.no_grad():
            initial = torch.cat([p.detach().float().reshape(-1) for p in params])
        opt = cls(params, lr=args.lr, **kinds[impl])
        for _ in range(args.warmup):
            opt.step()
        torch.cuda.synchronize()
        # Host time around each step with the device drained on both sides, and the events' time.
        wall_ms, event_ms = [], []
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(args.iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            opt.step()
            stop.record()
            torch.cuda.synchronize()
            wall_ms.append((time.perf_counter() - t0) * 1e3)
            event_ms.append(start.elapsed_time(stop))
        step_ms = statistics.median(wall_ms)
        with torch.no_grad():
            final = torch.cat([p.detach().float().reshape(-1) for p in params])
            finite = bool(torch.isfinite(final).all().item())
            if impl == "forloop":
                reference = final.cpu()
                diff = 0.0
            elif reference is not None:
                diff = float((final.cpu() - reference).abs().max().item())
            else:
                diff = float("nan")  # no for-loop run to compare with
            moved = bool((final != initial).any().item())  # the steps changed the parameters at all
        ok = finite and moved and (math.isnan(diff) or diff <= args.tolerance)
        failed = failed or not ok
        print(f"torch_peer impl={impl} optimizer={args.optimizer} dtype={args.dtype} params={numel} {description} "
              f"iters={args.iters} warmup={args.warmup} bytes_per_param={bytes_per_param} "
              f"step_ms_median={step_ms:.3f} gpu_event_ms_median={statistics.median(event_ms):.3f} "
              f"params_per_s={numel / (step_ms * 1e-3):.4g} achieved_gbps={numel * bytes_per_param / (step_ms * 1e-3) / 1e9:.1f} "
              f"d2d_copy_gbps={d2d_gbps:.1f} roofline_ms={roofline_ms:.3f} step_over_roofline={step_ms / roofline_ms:.3f} "
              f"max_abs_diff_vs_forloop={'n/a' if math.isnan(diff) else f'{diff:.3g}'} check={'ok' if ok else 'FAILED'}",
              flush=True)
        del opt, params, final, initial
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
