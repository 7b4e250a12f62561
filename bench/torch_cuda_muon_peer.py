#!/usr/bin/env python3
"""bench/torch_cuda_muon_peer.py — torch.optim.Muon (hidden matrices) + fused AdamW (biases) on one GPU: the peer of `shardopt-bench --mode step --device cuda --algorithm muon`.

Self-contained (torch 2.9 or newer, no shardopt). The model is the bench's: --layers L x
Linear(W, W), its L weights under torch.optim.Muon (torch's defaults: lr 1e-3, weight_decay 0.1,
momentum 0.95, Nesterov, 5 Newton-Schulz steps in bf16, as torch always runs them) and its L
biases under torch.optim.AdamW(fused=True). The same initial parameters and gradients (fixed
seeds) stand for every step; -w untimed steps, then -n steps, each timed on the host with the
device drained on both sides and with CUDA events; the medians are printed, with the
Newton-Schulz flops of the model (5 x 6 W^3 per matrix) over the step's time, as the bench
prints them.

Output: one key=value line:
  torch_muon_peer gpu=... torch=... layers=L width=W step_ms_median=... gpu_event_ms_median=...
      ns_gflop_per_step=... ns_tflops_whole_step=... finite=yes|no

Example: python3 bench/torch_cuda_muon_peer.py --layers 20 --width 1024 -n 10 -w 3
"""

import argparse
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=20, help="Linear layers (default 20)")
    p.add_argument("--width", type=int, default=2000, help="Linear width (default 2000)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("-n", "--iters", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.layers < 1 or args.width < 1:
        p.error("-n, --layers and --width must be positive, -w non-negative")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        import torch  # imported here so that --help works without torch
    except ImportError as e:
        print(f"torch_cuda_muon_peer: torch cannot be imported: {e}", file=sys.stderr)
        return 4
    if not torch.cuda.is_available():
        print("torch_cuda_muon_peer: no CUDA device is available to torch", file=sys.stderr)
        return 4
    if not hasattr(torch.optim, "Muon"):
        print(f"torch_cuda_muon_peer: torch {torch.__version__} has no torch.optim.Muon (2.9 or newer)", file=sys.stderr)
        return 4
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    weights, biases = [], []
    for _ in range(args.layers):
        for shape, out in (((args.width, args.width), weights), ((args.width,), biases)):
            p = (torch.rand(shape, generator=gen, device=device) * 0.1 - 0.05).requires_grad_(True)
            p.grad = torch.rand(shape, generator=gen, device=device) * 0.02 - 0.01
            out.append(p)
    muon = torch.optim.Muon(weights, lr=args.lr)
    adamw = torch.optim.AdamW(biases, lr=args.lr, fused=True)

    def step():
        muon.step()
        adamw.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    wall_ms, event_ms = [], []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        step()
        stop.record()
        torch.cuda.synchronize()
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        event_ms.append(start.elapsed_time(stop))
    step_ms = statistics.median(wall_ms)
    ns_gflop = 5 * 6.0 * args.width ** 3 * args.layers / 1e9
    with torch.no_grad():
        finite = all(bool(torch.isfinite(p).all().item()) for p in weights + biases)
    props = torch.cuda.get_device_properties(device)
    print(f"torch_muon_peer gpu={props.name.replace(' ', '_')} torch={torch.__version__} layers={args.layers} "
          f"width={args.width} iters={args.iters} warmup={args.warmup} step_ms_median={step_ms:.3f} "
          f"gpu_event_ms_median={statistics.median(event_ms):.3f} ns_gflop_per_step={ns_gflop:.1f} "
          f"ns_tflops_whole_step={ns_gflop / step_ms:.1f} finite={'yes' if finite else 'no'}", flush=True)
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
