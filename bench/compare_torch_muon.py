#!/usr/bin/env python3
"""bench/compare_torch_muon.py — shardopt's Muon step (whole-matrix owners) against torch.optim.Muon replicated, as DDP users run it, from one invocation.

The model: --layers x Linear(--width, --width); the weights are Muon's (hidden matrices), the
biases AdamW's, both with lr --lr and each optimizer's torch defaults otherwise. Fixed synthetic
gradients: the optimizer step is compared, not the backward pass.

  torch replicated   --world processes (torch.multiprocessing, gloo), torch.set_num_threads(--threads)
                     each; every rank steps torch.optim.Muon over all the weights and AdamW over
                     all the biases (the gradients are already all-reduced; nothing to sync): each
                     rank orthogonalises every matrix. With --precision f32 torch's
                     _zeropower_via_newtonschulz is replaced by the same iteration in float32 (what
                     tools/gen_golden_muon.py does for the fp32 reference); bf16 is torch's own.
  shardopt           mpirun -np --world shardopt-bench --mode step --algorithm muon (the same
                     shapes, --muon-precision as --precision, --blas-threads = --threads): each
                     matrix is owned whole by one rank, which orthogonalises it; the sync then
                     sends each matrix from its owner.

Every timed step runs between two barriers; a step's time is the slowest rank's; the median over
--steps steps after --warmup is reported. The last line: shardopt's step over torch's.

shardopt-bench prints blas_core, the kernel OpenBLAS runs, and blas_core_at_load, the one it
picked for this CPU. An OpenBLAS older than the CPU falls back to a generic kernel (0.3.21 on an
Emerald Rapids picks "Prescott", 4-5x slower sgemm); shardopt then switches it to the kernel the CPU
runs (SkylakeX there) before its first product (docs/muon.md). --openblas-coretype NAME sets
OPENBLAS_CORETYPE for shardopt's ranks, which shardopt keeps (e.g. Prescott, to measure the fallback).

Needs torch >= 2.9 (torch.optim.Muon): run it with an interpreter that has one, e.g. a
virtual environment with torch from PyPI.
"""
from __future__ import annotations

import argparse
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

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from torch_muon_f32 import muon_newton_schulz  # noqa: E402  (tools/: shared with gen_golden_muon.py)


def mpi_env(coretype: str | None) -> dict:
    """mpirun as root in containers, and waiting ranks that yield the core (2-core machines)."""
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rank(rank: int, world: int, port: int, cfg: dict, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with muon_newton_schulz(cfg["precision"]):
        time_torch_steps(rank, world, cfg, out_path)
    dist.destroy_process_group()


def time_torch_steps(rank: int, world: int, cfg: dict, out_path: str) -> None:
    gen = torch.Generator().manual_seed(1234)  # the same model and gradients on every rank
    w = cfg["width"]
    weights = [torch.nn.Parameter(torch.randn(w, w, generator=gen) * 0.05) for _ in range(cfg["layers"])]
    biases = [torch.nn.Parameter(torch.randn(w, generator=gen) * 0.05) for _ in range(cfg["layers"])]
    for p in weights + biases:
        p.grad = torch.randn(p.shape, generator=gen) * 0.01
    muon = torch.optim.Muon(weights, lr=cfg["lr"])
    adamw = torch.optim.AdamW(biases, lr=cfg["lr"])

    def step():
        muon.step()
        adamw.step()

    for _ in range(cfg["warmup"]):
        step()
    seconds = []
    for _ in range(cfg["steps"]):
        dist.barrier()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
        dist.barrier()
    everyone = [None] * world
    dist.all_gather_object(everyone, seconds)
    if rank == 0:
        slowest = [max(rank_seconds[i] for rank_seconds in everyone) for i in range(cfg["steps"])]
        with open(out_path, "w") as f:
            json.dump({"step_ms": statistics.median(slowest) * 1e3}, f)


def run_torch(cfg: dict, timeout_s: float) -> dict:
    os.environ["OMP_NUM_THREADS"] = str(cfg["threads"])
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        context = torch_mp.spawn(torch_rank, args=(cfg["world"], free_port(), cfg, out_path),
                                 nprocs=cfg["world"], join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for p in context.processes:
                        p.kill()
                    raise TimeoutError(f"torch's replicated Muon took longer than {timeout_s:.0f} s")
        except torch_mp.ProcessExitedException as e:
            # torch 2.15's gloo sometimes aborts a rank in its teardown ("terminate called
            # without an active exception") after every timed step: rank 0 wrote the result
            # before destroy_process_group(), so it stands; without it the run failed.
            if not os.path.exists(out_path):
                raise
            print(f"# note: torch's ranks ended abnormally after their timed steps ({e}); "
                  "the result rank 0 wrote before teardown is used", file=sys.stderr)
        with open(out_path) as f:
            return json.load(f)


def run_shardopt(cfg: dict, bench: Path, timeout_s: float) -> dict:
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(cfg["world"])]
    if cfg["world"] > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [str(bench), "--mode", "step", "--algorithm", "muon", "--layers", str(cfg["layers"]),
            "--width", str(cfg["width"]), "--lr", str(cfg["lr"]), "--muon-precision", cfg["precision"],
            "--blas-threads", str(cfg["threads"]), "--threads", str(cfg["threads"]),
            "--partition", cfg["partition"], "-n", str(cfg["steps"]), "-w", str(cfg["warmup"]),
            "-c", "1" if cfg["check"] else "0"]
    proc = subprocess.run(cmd, env=mpi_env(cfg["coretype"]), capture_output=True, text=True, timeout=timeout_s)
    line = next((l for l in proc.stdout.splitlines() if "step_ms_median=" in l), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    return {"cmd": " ".join(cmd), "line": line, "fields": fields, "step_ms": float(fields["step_ms_median"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--precision", choices=["bf16", "f32", "both"], default="both")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank, torch's and OpenBLAS's")
    ap.add_argument("--partition", choices=["flat", "sorted_greedy"], default="flat")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--check", type=int, choices=[0, 1], default=1,
                    help="shardopt-bench's self-check against one rank (doubles its run time)")
    ap.add_argument("--openblas-coretype", default=None, help="OPENBLAS_CORETYPE for shardopt's ranks")
    ap.add_argument("--bench", type=Path, default=REPO / "build" / "tools" / "shardopt-bench")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()
    if not hasattr(torch.optim, "Muon"):
        sys.exit(f"torch {torch.__version__} has no torch.optim.Muon (torch >= 2.9 has)")
    if not args.bench.exists():
        sys.exit(f"{args.bench} not found: build the shardopt-bench target (or pass --bench)")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# torch {torch.__version__}, world {args.world}, {args.layers} x {args.width}x{args.width} Muon + "
          f"{args.layers} biases AdamW, {args.threads} thread(s) per rank, load average {' '.join(load)}")
    failed = False
    for precision in (["bf16", "f32"] if args.precision == "both" else [args.precision]):
        cfg = {"world": args.world, "layers": args.layers, "width": args.width, "lr": args.lr,
               "precision": precision, "threads": args.threads, "partition": args.partition,
               "steps": args.steps, "warmup": args.warmup, "check": args.check == 1,
               "coretype": args.openblas_coretype}
        ours = run_shardopt(cfg, args.bench, args.timeout)
        theirs = run_torch(cfg, args.timeout)
        f = ours["fields"]
        ratio = ours["step_ms"] / theirs["step_ms"]
        print(f"# {ours['cmd']}" + (f"  (OPENBLAS_CORETYPE={args.openblas_coretype})" if args.openblas_coretype else ""))
        print(f"precision={precision} blas_core={f['blas_core']} blas_core_at_load={f.get('blas_core_at_load', '?')} bf16_products={f.get('bf16_products', '?')} shardopt_step_ms={ours['step_ms']:.1f} "
              f"newton_schulz_ms={float(f['newton_schulz_ms_median']):.1f} update_ms={float(f['update_ms_median']):.1f} "
              f"sync_ms={float(f['sync_ms_median']):.1f} "
              f"sync_last_owner_ms={float(f.get('sync_last_owner_ms_median', 'nan')):.1f} "
              f"update_spread_ms={float(f.get('update_spread_ms_median', 'nan')):.1f} wrong={f['wrong']} "
              f"torch_replicated_step_ms={theirs['step_ms']:.1f} shardopt_over_torch={ratio:.3f} "
              f"target=0.6 {'met' if ratio <= 0.6 else 'MISSED'}")
        failed = failed or f["wrong"] not in ("0", "N/A")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
