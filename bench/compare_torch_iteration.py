#!/usr/bin/env python3
"""bench/compare_torch_iteration.py — the whole iteration (gradient averaging + optimizer step) of shardopt against torch's DDP all-reduce + ZeroRedundancyOptimizer, from one invocation.

The model, the synthetic gradients and the process set-up are those of compare_torch_zero.py
(--layers x Linear(--width, --width), one process per rank, gloo on the CPU). What is timed per
iteration, between two barriers, slowest rank:

  torch DDP + ZeRO           DDP's reducer work without the autograd hooks: the gradients live as
                             views of flat buckets of --bucket-mb MiB (DDP's gradient_as_bucket_view,
                             25 MiB by default, filled in reverse registration order as DDP does),
                             every bucket all-reduced asynchronously over gloo and divided by the
                             world size, then ZeroRedundancyOptimizer(Adam) steps (bucket views, and
                             fused=True where this torch has a fused CPU Adam);
  torch DDP + replicated     the same reduction, then every rank steps the whole model (no sync).

shardopt: `mpirun -np N shardopt-bench --mode iteration` (reduce_gradients() then step(), both
timed) at stage 1 and stage 2, with its memory rooflines from the same run.

The gradients are re-written before each iteration (a memcpy on both sides, outside the timing)
so the reduction always averages the same values and the parameters can be checked alike on
every rank afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_torch_zero as base  # noqa: E402  (re-executes under the system python when torch is missing)

torch, dist, torch_mp = base.torch, base.dist, base.torch_mp


def flat_bucket_grads(params, bucket_bytes: int) -> list:
    """DDP's gradient buckets: parameters in reverse order, a bucket closed once it holds
    bucket_bytes; each parameter's .grad becomes a view into its bucket."""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    flats = []
    for members in buckets:
        flat = torch.empty(sum(p.numel() for p in members), dtype=members[0].dtype)
        offset = 0
        for p in members:
            view = flat[offset:offset + p.numel()].view_as(p)
            view.copy_(p.grad)
            p.grad = view
            offset += p.numel()
        flats.append(flat)
    return flats


def iteration_rank(rank: int, world: int, port: int, cfg: dict, peer: dict, out_path: str) -> None:
    base_rss = base.init_rank(rank, world, port, cfg)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])])
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(1 + rank)  # each rank's own local gradients
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator).mul_(0.01)
    flats = flat_bucket_grads(params, cfg["bucket_mb"] << 20)
    originals = [f.clone() for f in flats]
    kwargs = {"lr": cfg["lr"]}
    if peer["fused"]:
        kwargs["fused"] = True
    if peer["kind"] == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, parameters_as_bucket_view=True,
                                      **kwargs)
        local = opt.optim
    else:
        opt = local = torch.optim.Adam(params, **kwargs)

    def reduce():
        works = [dist.all_reduce(f, async_op=True) for f in flats]
        for f, w in zip(flats, works):
            w.wait()
            f.div_(world)

    reduce_s, step_s = [], []
    for i in range(cfg["warmup"] + cfg["steps"]):
        for f, o in zip(flats, originals):
            f.copy_(o)
        dist.barrier()
        start = time.perf_counter()
        reduce()
        middle = time.perf_counter()
        opt.step()
        end = time.perf_counter()
        dist.barrier()
        if i >= cfg["warmup"]:
            reduce_s.append(middle - start)
            step_s.append(end - middle)
    times = torch.tensor([reduce_s, step_s], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    sums = torch.stack([p.detach().double().sum() for p in params])
    lo, hi = sums.clone(), sums.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if rank == 0:
        reduce_ms = statistics.median(times[0].tolist()) * 1e3
        step_ms = statistics.median(times[1].tolist()) * 1e3
        iteration_ms = statistics.median((times[0] + times[1]).tolist()) * 1e3
        with open(out_path, "w") as f:
            json.dump({"reduce_ms": reduce_ms, "step_ms": step_ms, "iteration_ms": iteration_ms,
                       "state_bytes": base.state_bytes_of(local), "base_rss_bytes": base_rss,
                       "wrong": int((lo != hi).sum())}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(cfg: dict, peer: dict, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        context = torch_mp.spawn(iteration_rank, args=(cfg["world"], base.free_port(), cfg, peer, out_path),
                                 nprocs=cfg["world"], join=False)
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in context.processes:
                    p.kill()
                raise TimeoutError(f"{peer['name']} took longer than {timeout_s:.0f} s")
        with open(out_path) as f:
            return json.load(f)


def run_shardopt(cfg: dict, bench: Path, stage: int, timeout_s: float) -> dict:
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(cfg["world"])]
    if cfg["world"] > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [str(bench), "--mode", "iteration", "--layers", str(cfg["layers"]), "--width", str(cfg["width"]),
            "--optimizer", "adam", "--lr", str(cfg["lr"]), "--stage", str(stage), "--threads", str(cfg["threads"]),
            "-n", str(cfg["steps"]), "-w", str(cfg["warmup"]), "-c", "1"]
    proc = subprocess.run(cmd, env=base.mpi_env(), capture_output=True, text=True, timeout=timeout_s)
    line = next((l for l in proc.stdout.splitlines() if "iteration_ms_median=" in l), None)
    if proc.returncode not in base.BENCH_OK or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    return {"reduce_ms": float(fields["reduce_ms_median"]), "step_ms": float(fields["step_ms_median"]),
            "iteration_ms": float(fields["iteration_ms_median"]), "wrong": int(fields["wrong"]),
            "reduce_roofline_ms": float(fields["reduce_roofline_ms"]),
            "step_roofline_ms": float(fields["step_roofline_ms"]), "probe_spread": float(fields["probe_spread"]),
            "line": line}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--width", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=5, help="timed iterations (default 5)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=25, help="DDP's bucket_cap_mb (default 25)")
    parser.add_argument("--bench", type=Path, default=base.REPO / "build" / "tools" / "shardopt-bench")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if not args.bench.exists():
        sys.exit(f"compare_torch_iteration.py: {args.bench} does not exist; build shardopt-bench first or pass --bench")
    cfg = {"world": args.world, "layers": args.layers, "width": args.width, "lr": args.lr, "steps": args.steps,
           "warmup": args.warmup, "threads": args.threads, "bucket_mb": args.bucket_mb, "optimizer": "adam"}
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    numel = args.layers * (args.width * args.width + args.width)
    print(f"# world={args.world} model={args.layers} x Linear({args.width}, {args.width}) params={numel} adam "
          f"iterations={args.steps} (after {args.warmup}) threads/rank={args.threads} torch={torch.__version__} "
          f"ddp_bucket_mb={args.bucket_mb}", flush=True)

    fused, why = base.fused_cpu_support("adam")
    if not fused:
        print(f"# torch {torch.__version__} has no fused CPU Adam ({why}): the peers step the default Adam", flush=True)
    suffix = " Adam(fused)" if fused else " Adam"
    rows = []
    for kind, name in (("zero", "torch DDP + ZeRO" + suffix), ("replicated", "torch DDP + replicated" + suffix)):
        print(f"# running {name} ...", flush=True)
        rows.append((name, "peer", run_torch(cfg, {"name": name, "kind": kind, "fused": fused}, args.timeout)))
    for stage in (1, 2):
        name = f"shardopt stage {stage}"
        print(f"# running {name} ...", flush=True)
        rows.append((name, "shardopt", run_shardopt(cfg, args.bench, stage, args.timeout)))

    print(f"\n{'implementation':<36} {'reduce ms':>10} {'step ms':>9} {'iteration ms':>13} {'wrong':>6}")
    for name, _, r in rows:
        print(f"{name:<36} {r['reduce_ms']:>10.1f} {r['step_ms']:>9.1f} {r['iteration_ms']:>13.1f} {r['wrong']:>6}")
    peers = [(n, r) for n, k, r in rows if k == "peer"]
    fastest_name, fastest = min(peers, key=lambda nr: nr[1]["iteration_ms"])
    print(f"\nfastest peer: {fastest_name}, {fastest['iteration_ms']:.1f} ms/iteration")
    for name, kind, r in rows:
        if kind != "shardopt":
            continue
        ratio = fastest["iteration_ms"] / r["iteration_ms"]
        lead = f"{ratio:.2f}x faster than" if ratio >= 1 else f"{1 / ratio:.2f}x slower than"
        print(f"{name}: {r['iteration_ms']:.1f} ms/iteration, {lead} the fastest peer; "
              f"reduce {r['reduce_ms']:.1f} ms = {r['reduce_ms'] / r['reduce_roofline_ms']:.2f}x its roofline, "
              f"{r['reduce_ms'] / r['step_ms']:.2f}x the step; step {r['step_ms'] / r['step_roofline_ms']:.2f}x its "
              f"roofline (probe spread {r['probe_spread']:.2f})")
    for name, kind, r in rows:
        if kind == "shardopt":
            print(f"# {name}: {r['line']}")
    return 0 if all(r["wrong"] == 0 for _, _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
