#!/usr/bin/env python3
"""bench/compare_torch_zero.py — shardopt's optimizer step against the fastest torch (and DeepSpeed) configuration on the same model and world size, from one invocation.

Peers, one process per rank (torch.multiprocessing, gloo on the CPU, torch.set_num_threads(--threads)),
on the model of PyTorch's ZeroRedundancyOptimizer tutorial: --layers x Linear(--width, --width)
(20 x 2000 = 80.04M params), synthetic fixed gradients (the optimizer step is compared, not the
backward pass):

  torch ZeRO                 ZeroRedundancyOptimizer(optimizer_class=Adam, parameters_as_bucket_view
                             False and True): each rank updates its share, then the parameters are
                             broadcast to every rank;
  torch ZeRO fused           the same with bucket views and Adam(fused=True), where this torch has
                             a fused CPU Adam (torch >= 2.4; older ones say so and the row is skipped);
  torch replicated fused     no sharding, as under DDP: every rank steps Adam(fused=True) over the
                             whole model (the gradients are already averaged; nothing to sync);
                             torch's default Adam where there is no fused CPU Adam;
  DeepSpeedCPUAdam           the update alone (no sync) over each rank's 1/N flat partition, when
                             deepspeed is importable: ZeRO-Offload's CPU update, set against
                             shardopt's update phase (shardopt-bench --breakdown), not its step.

Every timed step runs between two barriers; a step's time is the slowest rank's; the table shows
the median over --steps steps after --warmup steps.

shardopt: `mpirun -np N shardopt-bench --mode step --layers L --width W ...` (the same params in
the same order, the same optimizer and lr) with the flat and the sorted_greedy (torch's)
partition, bucket-view and external storage, and replicated state. Its timing rule is the same.

The summary compares shardopt's flat bucket-view step with the fastest full-step peer of this run
(and with each peer), its update with DeepSpeedCPUAdam's. Columns: step ms (median), optimizer
state MB per rank (largest rank), peak RSS MB (largest rank; torch's includes its runtime, so the
high-water mark before the model exists, "base RSS", is shown too), shardopt's roofline fraction.

Runs with any torch from 1.13 on: the system interpreter with Debian's python3-torch (1.13), or
a virtual environment with torch 2.x from PyPI (faster peers: fused CPU Adam). Started with an
interpreter that lacks torch, the script re-executes itself with /usr/bin/python3.
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
             "(apt-get install python3-torch) and run with /usr/bin/python3, or torch from PyPI in a venv")

# shardopt-bench's exit status 3: the parameters were right but the roofline measurement was not.
BENCH_OK = (0, 3)


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


# ---- what this torch (and deepspeed) can do ----------------------------------------------------------

def optimizer_class(name: str):
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name]


def fused_cpu_support(name: str) -> tuple[bool, str]:
    """Whether optimizer_class(name)(..., fused=True) steps CPU tensors here: tried, not guessed
    from the version (1.13 has the argument but only for CUDA; 2.x added CPU kernels release by
    release)."""
    try:
        p = torch.zeros(8, requires_grad=True)
        p.grad = torch.ones(8)
        kwargs = {"lr": 0.1, "fused": True}
        if name == "sgd":
            kwargs["momentum"] = 0.9
        optimizer_class(name)([p], **kwargs).step()
        return True, ""
    except (TypeError, RuntimeError, ValueError) as e:
        return False, (str(e).strip().splitlines() or [type(e).__name__])[0]


def deepspeed_cpu_adam() -> tuple[object, str]:
    """DeepSpeedCPUAdam when deepspeed imports here, else None and why."""
    try:
        import deepspeed  # noqa: F401
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam, f"deepspeed {deepspeed.__version__}"
    except Exception as e:  # ImportError, or a deepspeed that cannot set up its accelerator
        return None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


# ---- torch ranks ---------------------------------------------------------------------------------

def init_rank(rank: int, world: int, port: int, cfg: dict) -> int:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return peak_rss_bytes()


def timed_steps(step, cfg: dict) -> list[float]:
    for _ in range(cfg["warmup"]):
        step()
    seconds = []
    for _ in range(cfg["steps"]):
        dist.barrier()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
        dist.barrier()
    return seconds


def state_bytes_of(optim) -> int:
    return sum(t.numel() * t.element_size() for per_param in optim.state.values()
               for t in per_param.values() if torch.is_tensor(t))


def report(rank: int, out_path: str, seconds: list[float], state_bytes: int, base_rss: int, params) -> None:
    """Slowest rank per step, largest rank for memory; rank 0 writes the JSON. `params`: the
    tensors every rank must hold alike afterwards (compared by per-tensor sums)."""
    peak_rss = peak_rss_bytes()
    times = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    memory = torch.tensor([state_bytes, peak_rss, base_rss], dtype=torch.float64)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    differing = 0
    if params:
        sums = torch.stack([p.detach().double().sum() for p in params])
        lo, hi = sums.clone(), sums.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        differing = int((lo != hi).sum())
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"step_ms": statistics.median(times.tolist()) * 1e3, "state_bytes": memory[0].item(),
                       "peak_rss_bytes": memory[1].item(), "base_rss_bytes": memory[2].item(),
                       "wrong": differing}, f)
    dist.barrier()
    dist.destroy_process_group()


def torch_rank(rank: int, world: int, port: int, cfg: dict, peer: dict, out_path: str) -> None:
    """One rank of a torch peer: ZeroRedundancyOptimizer, or the replicated optimizer."""
    base_rss = init_rank(rank, world, port, cfg)
    torch.manual_seed(0)  # the same model on every rank, as DDP would make it
    model = torch.nn.Sequential(*[torch.nn.Linear(cfg["width"], cfg["width"]) for _ in range(cfg["layers"])])
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(1)
    for p in params:  # averaged gradients are identical on every rank
        p.grad = torch.randn(p.shape, generator=generator).mul_(0.01)
    kwargs = {"lr": cfg["lr"]}
    if cfg["optimizer"] == "sgd":
        kwargs["momentum"] = cfg["momentum"]
    if peer["fused"]:
        kwargs["fused"] = True
    if peer["kind"] == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class(cfg["optimizer"]),
                                      parameters_as_bucket_view=peer["bucket_view"], **kwargs)
        local = opt.optim
    else:
        opt = local = optimizer_class(cfg["optimizer"])(params, **kwargs)
    seconds = timed_steps(opt.step, cfg)
    report(rank, out_path, seconds, state_bytes_of(local), base_rss, params)


def deepspeed_rank(rank: int, world: int, port: int, cfg: dict, peer: dict, out_path: str) -> None:
    """One rank of DeepSpeedCPUAdam's update over this rank's flat 1/N partition (no sync)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    base_rss = init_rank(rank, world, port, cfg)
    numel = cfg["layers"] * (cfg["width"] * cfg["width"] + cfg["width"])
    lo, hi = numel * rank // world, numel * (rank + 1) // world
    generator = torch.Generator().manual_seed(1 + rank)
    shard = torch.nn.Parameter(torch.empty(hi - lo).uniform_(-0.05, 0.05, generator=generator))
    shard.grad = torch.randn(hi - lo, generator=generator).mul_(0.01)
    adamw = cfg["optimizer"] == "adamw"
    opt = DeepSpeedCPUAdam([shard], lr=cfg["lr"], adamw_mode=adamw, weight_decay=0.01 if adamw else 0.0)
    seconds = timed_steps(opt.step, cfg)
    report(rank, out_path, seconds, state_bytes_of(opt), base_rss, [])


def run_peer(cfg: dict, peer: dict, timeout_s: float) -> dict:
    target = deepspeed_rank if peer["kind"] == "deepspeed" else torch_rank
    # DeepSpeedCPUAdam threads with OpenMP: the children inherit this (spawned processes).
    os.environ["OMP_NUM_THREADS"] = str(cfg["threads"])
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        context = torch_mp.spawn(target, args=(cfg["world"], free_port(), cfg, peer, out_path),
                                 nprocs=cfg["world"], join=False)
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in context.processes:
                    p.kill()
                raise TimeoutError(f"{peer['name']} took longer than {timeout_s:.0f} s")
        with open(out_path) as f:
            result = json.load(f)
    result["numel"] = cfg["layers"] * (cfg["width"] * cfg["width"] + cfg["width"])
    return result


# ---- shardopt --------------------------------------------------------------------------------------

def run_shardopt(cfg: dict, bench: Path, partition: str, storage: str, mode: str, timeout_s: float) -> dict:
    mpirun = shutil.which("mpirun") or "mpirun"
    cmd = [mpirun, "-np", str(cfg["world"])]
    if cfg["world"] > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [str(bench), "--mode", "step", "--layers", str(cfg["layers"]), "--width", str(cfg["width"]),
            "--optimizer", cfg["optimizer"], "--lr", str(cfg["lr"]), "--momentum", str(cfg["momentum"]),
            "--partition", partition, "--storage", storage, "--mode", mode, "--threads", str(cfg["threads"]),
            "-n", str(cfg["steps"]), "-w", str(cfg["warmup"]), "-c", "1", "--breakdown"]
    if cfg.get("stream_mb"):
        cmd += ["--stream-mb", str(cfg["stream_mb"])]
    proc = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=timeout_s)
    lines = proc.stdout.splitlines()
    line = next((l for l in lines if "step_ms_median=" in l), None)
    breakdown = next((l for l in lines if l.startswith("breakdown:")), "")
    if proc.returncode not in BENCH_OK or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    parts = dict(re.findall(r"(\S+?)=(\S+)", breakdown))
    return {"step_ms": float(fields["step_ms_median"]), "state_bytes": float(fields["state_bytes_per_rank"]),
            "peak_rss_bytes": float(fields["peak_rss_mb"]) * 2**20,
            "base_rss_bytes": float(fields["base_rss_mb"]) * 2**20,
            "wrong": int(fields["wrong"]), "numel": int(fields["params"]),
            "roofline_fraction": float(fields["roofline_fraction"]),
            "roofline_status": fields.get("roofline_status", "?"),
            "update_ms": float(parts["update_ms_median"]) if "update_ms_median" in parts else None,
            "line": line, "breakdown": breakdown}


# ---- main ------------------------------------------------------------------------------------------

def peers_for(args) -> list[dict]:
    """The peer configurations this torch and deepspeed can run; prints a line for each one left out."""
    peers = [{"name": "torch ZeRO bucket_view=False", "kind": "zero", "bucket_view": False, "fused": False},
             {"name": "torch ZeRO bucket_view=True", "kind": "zero", "bucket_view": True, "fused": False}]
    fused, why = fused_cpu_support(args.optimizer)
    opt_name = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}[args.optimizer]
    if fused:
        peers.append({"name": f"torch ZeRO bucket_view=True {opt_name}(fused)", "kind": "zero",
                      "bucket_view": True, "fused": True})
        peers.append({"name": f"torch replicated {opt_name}(fused)", "kind": "replicated", "bucket_view": False,
                      "fused": True})
    else:
        print(f"# skipped: torch ZeRO and replicated with {opt_name}(fused=True): torch {torch.__version__} "
              f"has no fused CPU {opt_name} ({why}); the replicated peer runs the default {opt_name}", flush=True)
        peers.append({"name": f"torch replicated {opt_name}", "kind": "replicated", "bucket_view": False,
                      "fused": False})
    if args.optimizer in ("adam", "adamw") and not args.no_deepspeed:
        cpu_adam, why = deepspeed_cpu_adam()
        if cpu_adam is None:
            print(f"# skipped: DeepSpeedCPUAdam (deepspeed is not importable here: {why})", flush=True)
        else:
            print(f"# building DeepSpeed's cpu_adam op if it is not cached yet ({why}) ...", flush=True)
            p = torch.nn.Parameter(torch.zeros(8))
            p.grad = torch.ones(8)
            cpu_adam([p], lr=0.1).step()  # the JIT build happens here, once, outside any timing
            peers.append({"name": "DeepSpeedCPUAdam (update only)", "kind": "deepspeed", "bucket_view": False,
                          "fused": False})
    elif args.optimizer == "sgd":
        print("# skipped: DeepSpeedCPUAdam (an Adam update; --optimizer sgd)", flush=True)
    return peers


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
    parser.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeedCPUAdam out")
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
          f"threads/rank={args.threads} torch={torch.__version__} cpu_capability="
          f"{getattr(getattr(torch.backends, 'cpu', None), 'get_cpu_capability', lambda: '?')()}", flush=True)

    rows = []  # (name, kind, result): "peer" (a full step), "peer-update", "shardopt" or "shardopt-world1"
    for peer in peers_for(args):
        print(f"# running {peer['name']} ...", flush=True)
        kind = "peer-update" if peer["kind"] == "deepspeed" else "peer"
        rows.append((peer["name"], kind, run_peer(cfg, peer, args.timeout)))
    for partition, storage, mode in (("flat", "bucket_view", "sharded"), ("sorted_greedy", "bucket_view", "sharded"),
                                     ("sorted_greedy", "external", "sharded"), ("flat", "bucket_view", "replicated")):
        name = f"shardopt {partition} / {storage}" if mode == "sharded" else "shardopt replicated"
        print(f"# running {name} ...", flush=True)
        rows.append((name, "shardopt", run_shardopt(cfg, args.bench, partition, storage, mode, args.timeout)))
    if args.world > 1:
        # The same model on one rank, to say whether sharding over N ranks beats not sharding at all.
        name = "shardopt flat / bucket_view, world 1"
        print(f"# running {name} ...", flush=True)
        rows.append((name, "shardopt-world1", run_shardopt({**cfg, "world": 1}, args.bench, "flat", "bucket_view",
                                                           "sharded", args.timeout)))

    mb = 1 / 2**20
    print()
    print(f"{'implementation':<44} {'step ms':>9} {'state MB/rank':>14} {'peak RSS MB':>12} "
          f"{'base RSS MB':>12} {'roofline':>9} {'wrong':>6}")
    for name, kind, r in rows:
        roof = f"{r['roofline_fraction']:.2f}" if "roofline_fraction" in r else "-"
        roof += {"measurement_error": "!", "cache_resident": "c"}.get(r.get("roofline_status", ""), "")
        step = f"{r['step_ms']:.1f}" + ("*" if kind == "peer-update" else "")
        print(f"{name:<44} {step:>9} {r['state_bytes'] * mb:>14.1f} {r['peak_rss_bytes'] * mb:>12.1f} "
              f"{r['base_rss_bytes'] * mb:>12.1f} {roof:>9} {r['wrong']:>6}")
    if any(kind == "peer-update" for _, kind, _ in rows):
        print("(* the update alone, no parameter sync: compared with shardopt's update phase below)")
    if any(r.get("roofline_status") == "measurement_error" for _, _, r in rows):
        print("(! roofline fraction above 1.05: a measurement error of that run, not a result)")
    if any(r.get("roofline_status") == "cache_resident" for _, _, r in rows):
        print("(c the step's data fit in the last-level cache: not DRAM-bound, the fraction is not judged)")

    peers = [(n, r) for n, kind, r in rows if kind == "peer"]
    ours = [(n, r) for n, kind, r in rows if kind == "shardopt"]
    print("\nstep ratios, shardopt / peer (below 1: shardopt is faster):")
    print(f"{'':<44}" + "".join(f"{n.replace('torch ', ''):>36}" for n, _ in peers))
    for name, r in ours:
        print(f"{name:<44}" + "".join(f"{r['step_ms'] / t['step_ms']:>36.3f}" for _, t in peers))

    fastest_name, fastest = min(peers, key=lambda nr: nr[1]["step_ms"])
    head_name, head = ours[0]
    ratio = head["step_ms"] / fastest["step_ms"]
    print(f"\nfastest peer: {fastest_name}, {fastest['step_ms']:.1f} ms/step")
    print(f"{head_name}: {head['step_ms']:.1f} ms/step = {ratio:.3f} x the fastest peer's time "
          f"({'%.2fx faster' % (1 / ratio) if ratio < 1 else '%.2fx slower' % ratio}); state/rank "
          f"{head['state_bytes'] / fastest['state_bytes']:.2f}x, peak RSS {head['peak_rss_bytes'] / fastest['peak_rss_bytes']:.2f}x")
    if head.get("update_ms"):
        print(f"{head_name}: step / its update phase = {head['step_ms'] / head['update_ms']:.3f} "
              f"(update {head['update_ms']:.1f} ms of the {head['step_ms']:.1f} ms step)")
    for name, kind, r in rows:
        if kind == "shardopt-world1":
            w = head["step_ms"] / r["step_ms"]
            print(f"world {args.world} / world 1: {head_name} {head['step_ms']:.1f} ms vs {r['step_ms']:.1f} ms = "
                  f"{w:.3f}x ({'%.2fx faster' % (1 / w) if w < 1 else '%.2fx slower' % w} at world {args.world})")
    for name, kind, r in rows:
        if kind == "peer-update" and head.get("update_ms"):
            u = head["update_ms"] / r["step_ms"]
            print(f"update alone: {head_name} {head['update_ms']:.1f} ms vs {name} {r['step_ms']:.1f} ms = {u:.3f}x "
                  f"({'%.2fx faster' % (1 / u) if u < 1 else '%.2fx slower' % u})")
    for name, kind, r in rows:
        if kind.startswith("shardopt"):
            print(f"# {name}: {r['line']}")
            if r["breakdown"]:
                print(f"# {name}: {r['breakdown']}")

    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["implementation", "kind", "world", "layers", "width", "params", "optimizer", "steps",
                             "warmup", "threads", "torch", "step_ms_median", "state_mb_per_rank", "peak_rss_mb",
                             "base_rss_mb", "roofline_fraction", "roofline_status", "wrong"])
            for name, kind, r in rows:
                writer.writerow([name, kind, args.world, args.layers, args.width, r["numel"], args.optimizer,
                                 args.steps, args.warmup, args.threads, torch.__version__, f"{r['step_ms']:.3f}",
                                 f"{r['state_bytes'] * mb:.2f}", f"{r['peak_rss_bytes'] * mb:.1f}",
                                 f"{r['base_rss_bytes'] * mb:.1f}",
                                 f"{r['roofline_fraction']:.3f}" if "roofline_fraction" in r else "",
                                 r.get("roofline_status", ""), r["wrong"]])
        print(f"# wrote {args.csv}")
    return 0 if all(r["wrong"] == 0 for _, _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
