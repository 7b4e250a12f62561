#!/usr/bin/env python3
"""bench/compare_torch_zero.py — PyTorch's ZeroRedundancyOptimizer vs shardopt on the same model and world size, in one invocation, as one table.

Torch side: torch.distributed.optim.ZeroRedundancyOptimizer over the gloo backend on the CPU,
one process per rank (torch.multiprocessing), torch.set_num_threads(--threads) per rank, once
with parameters_as_bucket_view=False and once with True. The model is the one of PyTorch's
ZeroRedundancyOptimizer tutorial: --layers x Linear(--width, --width) (20 x 2000 = 80.04M
params). Gradients are synthetic and fixed (the comparison is of the optimizer step, not the
backward pass). Every timed opt.step() runs between two barriers; the time of a step is the
slowest rank's, and the table shows the median over --steps steps after --warmup steps.

shardopt side: `mpirun -np N shardopt-bench --mode step --layers L --width W ...` (the same
params in the same order, the same optimizer and lr), with the flat and the sorted_greedy
(torch's) partition, bucket-view and external storage. Its timing rule is the same.

Columns: step ms (median), optimizer-state MB per rank (largest rank), peak RSS MB (largest
rank; for torch this includes the ~hundreds of MB of the torch runtime, so "base RSS", the
high-water mark before the model exists, is shown too), and each shardopt row's ratios to
each torch variant. Needs Debian's python3-torch: run it with /usr/bin/python3 (the script
re-executes itself there when the current interpreter lacks torch).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as torch_mp
except ImportError:  # Debian's python3-torch lives with the system interpreter only.
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, *sys.argv])
    sys.exit("compare_torch_zero.py: torch is not importable; install Debian's python3-torch "
             "(apt-get install python3-torch) and run with /usr/bin/python3")


def mpi_env() -> dict:
    """mpirun as root in containers, and waiting ranks that yield the core (2-core machines)."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_bytes() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# ---- torch ---------------------------------------------------------------------------------------

def optimizer_class(name: str):
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]


def torch_rank(rank: int, world: int, port: int, cfg: dict, bucket_view: bool, out_path: str) -> None:
    """One rank of the torch run; rank 0 writes the results to out_path as JSON."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base_rss = peak_rss_bytes()

    torch.manual_seed(0)  # the same model on every rank, as DDP would make it
    model = torch.nn.Sequential(*[torch.nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])])
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(1)
    for p in params:  # averaged gradients are identical on every rank
        p.grad = torch.randn(p.shape, generator=generator).mul_(0.01)
    kwargs = {"lr": cfg["lr"]}
    if cfg["optimizer"] == "sgd":
        kwargs["momentum"] = cfg["momentum"]
    opt = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class(cfg["optimizer"]),
                                  parameters_as_bucket_view=bucket_view, **kwargs)

    for _ in range(cfg["warmup"]):
        opt.step()
    seconds = []
    for _ in range(cfg["steps"]):
        dist.barrier()
        start = time.perf_counter()
        opt.step()
        seconds.append(time.perf_counter() - start)
        dist.barrier()
    peak_rss = peak_rss_bytes()

    state_bytes = sum(t.numel() * t.element_size()
                      for per_param in opt.optim.state.values()
                      for t in per_param.values() if torch.is_tensor(t))
    # Slowest rank per step; largest rank for memory.
    times = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    memory = torch.tensor([state_bytes, peak_rss, base_rss], dtype=torch.float64)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    # Every rank must hold the same parameters after the sync: compare per-param sums.
    sums = torch.stack([p.detach().double().sum() for p in params])
    lo, hi = sums.clone(), sums.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    differing = int((lo != hi).sum())
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"step_ms": statistics.median(times.tolist()) * 1e3,
                       "state_bytes": memory[0].item(), "peak_rss_bytes": memory[1].item(),
                       "base_rss_bytes": memory[2].item(), "wrong": differing,
                       "numel": sum(p.numel() for p in params)}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(cfg: dict, bucket_view: bool, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        context = torch_mp.spawn(torch_rank, args=(cfg["world"], free_port(), cfg, bucket_view, out_path),
                                 nprocs=cfg["world"], join=False)
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in context.processes:
                    p.kill()
                raise TimeoutError(f"torch run (bucket_view={bucket_view}) took longer than {timeout_s:.0f} s")
        with open(out_path) as f:
            return json.load(f)


# ---- shardopt --------------------------------------------------------------------------------------

def run_shardopt(cfg: dict, bench: Path, partition: str, storage: str, timeout_s: float) -> dict:
    mpirun = shutil.which("mpirun") or "mpirun"
    cmd = [mpirun, "-np", str(cfg["world"])]
    if cfg["world"] > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [str(bench), "--mode", "step", "--layers", str(cfg["layers"]), "--width", str(cfg["width"]),
            "--optimizer", cfg["optimizer"], "--lr", str(cfg["lr"]), "--momentum", str(cfg["momentum"]),
            "--partition", partition, "--storage", storage, "--threads", str(cfg["threads"]),
            "-n", str(cfg["steps"]), "-w", str(cfg["warmup"]), "-c", "1"]
    if cfg.get("stream_mb"):
        cmd += ["--stream-mb", str(cfg["stream_mb"])]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=timeout_s)
    line = next((l for l in proc.stdout.splitlines() if "step_ms_median=" in l), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    return {"step_ms": float(fields["step_ms_median"]), "state_bytes": float(fields["state_bytes_per_rank"]),
            "peak_rss_bytes": float(fields["peak_rss_mb"]) * 2**20,
            "base_rss_bytes": float(fields["base_rss_mb"]) * 2**20,
            "wrong": int(fields["wrong"]), "numel": int(fields["params"]),
            "roofline_fraction": float(fields["roofline_fraction"]), "line": line}


# ---- main ------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks on both sides (default 2)")
    parser.add_argument("--layers", type=int, default=20, help="Linear layers (default 20)")
    parser.add_argument("--width", type=int, default=2000, help="features per layer (default 2000)")
    parser.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (the tutorial's 0.01)")
    parser.add_argument("--momentum", type=float, default=0.9, help="sgd momentum (default 0.9)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank (default 1)")
    parser.add_argument("--bench", type=Path, default=REPO / "build" / "tools" / "shardopt-bench",
                        help="the shardopt-bench binary (default build/tools/shardopt-bench)")
    parser.add_argument("--stream-mb", type=int, default=0, help="passed to shardopt-bench (default: its own)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per run (default 900)")
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")
    args = parser.parse_args()
    if not args.bench.exists():
        sys.exit(f"compare_torch_zero.py: {args.bench} does not exist; build it first "
                 "(cmake -S . -B build && cmake --build build --target shardopt-bench) or pass --bench")

    cfg = {"world": args.world, "layers": args.layers, "width": args.width, "optimizer": args.optimizer,
           "lr": args.lr, "momentum": args.momentum, "steps": args.steps, "warmup": args.warmup,
           "threads": args.threads, "stream_mb": args.stream_mb}
    numel = args.layers * (args.width * args.width + args.width)
    print(f"# world={args.world} model={args.layers} x Linear({args.width}, {args.width}) params={numel} "
          f"optimizer={args.optimizer} lr={args.lr} steps={args.steps} (after {args.warmup} warmup) "
          f"threads/rank={args.threads} torch={torch.__version__}", flush=True)

    rows = []  # (name, result)
    for bucket_view in (False, True):
        name = f"torch ZeRO bucket_view={bucket_view}"
        print(f"# running {name} ...", flush=True)
        rows.append((name, run_torch(cfg, bucket_view, args.timeout)))
    for partition, storage in (("flat", "bucket_view"), ("sorted_greedy", "bucket_view"), ("sorted_greedy", "external")):
        name = f"shardopt {partition} / {storage}"
        print(f"# running {name} ...", flush=True)
        rows.append((name, run_shardopt(cfg, args.bench, partition, storage, args.timeout)))

    mb = 1 / 2**20
    print()
    print(f"{'implementation':<38} {'step ms':>9} {'state MB/rank':>14} {'peak RSS MB':>12} "
          f"{'base RSS MB':>12} {'roofline':>9} {'wrong':>6}")
    for name, r in rows:
        roof = f"{r['roofline_fraction']:.2f}" if "roofline_fraction" in r else "-"
        print(f"{name:<38} {r['step_ms']:>9.1f} {r['state_bytes'] * mb:>14.1f} {r['peak_rss_bytes'] * mb:>12.1f} "
              f"{r['base_rss_bytes'] * mb:>12.1f} {roof:>9} {r['wrong']:>6}")

    torch_rows = [(n, r) for n, r in rows if n.startswith("torch")]
    print("\nratios, shardopt / torch (below 1: shardopt is faster or smaller):")
    header = "".join(f"{'vs ' + n.replace('torch ZeRO ', 'torch '):>34}" for n, _ in torch_rows)
    print(f"{'':<38}{header}")
    print(f"{'':<38}" + f"{'step':>14}{'state':>10}{'peak RSS':>10}" * len(torch_rows))
    for name, r in rows:
        if not name.startswith("shardopt"):
            continue
        cells = "".join(f"{r['step_ms'] / t['step_ms']:>14.3f}{r['state_bytes'] / t['state_bytes']:>10.3f}"
                        f"{r['peak_rss_bytes'] / t['peak_rss_bytes']:>10.3f}" for _, t in torch_rows)
        print(f"{name:<38}{cells}")
    for name, r in rows:
        if "line" in r:
            print(f"# {name}: {r['line']}")

    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["implementation", "world", "layers", "width", "params", "optimizer", "steps", "warmup",
                             "threads", "step_ms_median", "state_mb_per_rank", "peak_rss_mb", "base_rss_mb",
                             "roofline_fraction", "wrong"])
            for name, r in rows:
                writer.writerow([name, args.world, args.layers, args.width, r["numel"], args.optimizer, args.steps,
                                 args.warmup, args.threads, f"{r['step_ms']:.3f}", f"{r['state_bytes'] * mb:.2f}",
                                 f"{r['peak_rss_bytes'] * mb:.1f}", f"{r['base_rss_bytes'] * mb:.1f}",
                                 f"{r['roofline_fraction']:.3f}" if "roofline_fraction" in r else "", r["wrong"]])
        print(f"# wrote {args.csv}")
    return 0 if all(r["wrong"] == 0 for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
