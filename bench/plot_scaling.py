#!/usr/bin/env python3
"""bench/plot_scaling.py — runs shardopt-bench's step mode over world sizes and model sizes and plots step time and optimizer-state bytes per rank.

For every world size in --worlds and model size in --params, runs
`mpirun -np W shardopt-bench --mode step --params N --mode sharded|replicated ...` (the
replicated runs are the unsharded data-parallel baseline), writes every measured line to
<out>/scaling.csv and draws <out>/scaling_vs_world.png and <out>/scaling_vs_params.png.
--from-csv redraws the plots from an earlier CSV without running anything.

World sizes above the machine's core count oversubscribe the cores (mpirun --oversubscribe):
their step times include time-slicing, so read them for the trend of the state bytes, not as
speed. Needs matplotlib (pip install matplotlib, or apt-get install python3-matplotlib).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"

try:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.path.exists(SYSTEM_PYTHON):
        # Debian's python3-matplotlib installs for the system interpreter; try it before giving up.
        probe = subprocess.run([SYSTEM_PYTHON, "-c", "import matplotlib"], capture_output=True)
        if probe.returncode == 0:
            os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON, *sys.argv])
    sys.exit("plot_scaling.py: matplotlib is missing. Install it with `pip install matplotlib` "
             "(for this interpreter) or `apt-get install python3-matplotlib` (for /usr/bin/python3).")

FIELDS = ["world", "params", "mode", "partition", "optimizer", "threads", "step_ms_median", "params_per_s",
          "state_bytes_per_rank", "peak_rss_mb", "achieved_gbps", "roofline_fraction", "roofline_status", "wrong"]
# shardopt-bench's exit status 3: the parameters were right but the roofline measurement was not
# (roofline_status=measurement_error); the row is kept, with its status.
BENCH_OK = (0, 3)


def parse_count(text: str) -> int:
    """'8M' -> 8 * 2**20, as shardopt-bench reads sizes."""
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def run_one(bench: Path, world: int, params: int, mode: str, args) -> dict:
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(world)]
    if world > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    cmd += [str(bench), "--mode", mode, "--params", str(params), "--optimizer", args.optimizer,
            "--partition", args.partition, "--threads", str(args.threads), "-n", str(args.steps),
            "-w", str(args.warmup), "-c", "1", "--stream-mb", str(args.stream_mb)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    line = next((l for l in proc.stdout.splitlines() if "step_ms_median=" in l), None)
    if proc.returncode not in BENCH_OK or line is None:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    return {k: fields.get(k, "") for k in FIELDS}


def load(path: Path) -> list[dict]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("world", "params", "state_bytes_per_rank", "wrong", "threads"):
            r[k] = int(r[k])
        for k in ("step_ms_median", "params_per_s", "peak_rss_mb", "achieved_gbps", "roofline_fraction"):
            r[k] = float(r[k])
    return rows


def label_params(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:g}M params"
    return f"{n / 2**10:g}K params" if n >= 2**10 else f"{n} params"


def plot(rows: list[dict], out: Path, cores: int) -> list[Path]:
    worlds = sorted({r["world"] for r in rows})
    sizes = sorted({r["params"] for r in rows})
    modes = [m for m in ("sharded", "replicated") if any(r["mode"] == m for r in rows)]
    style = {"sharded": "-", "replicated": "--"}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    note = f"(world > {cores} oversubscribes this machine's {cores} cores: times there include time-slicing)"
    written = []

    def series(key, mode, fixed_key, fixed, along):
        pts = sorted((r[along], r[key]) for r in rows if r["mode"] == mode and r[fixed_key] == fixed)
        return [p[0] for p in pts], [p[1] for p in pts]

    # vs world size: one line per model size.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, n in enumerate(sizes):
        for mode in modes:
            x, t = series("step_ms_median", mode, "params", n, "world")
            _, s = series("state_bytes_per_rank", mode, "params", n, "world")
            kw = dict(color=colors[i % len(colors)], linestyle=style[mode], marker="o", label=f"{label_params(n)}, {mode}")
            axes[0].plot(x, t, **kw)
            axes[1].plot(x, [b / 2**20 for b in s], **kw)
    axes[0].set(title="optimizer step time (median)", xlabel="world size (ranks)", ylabel="ms", yscale="log")
    axes[1].set(title="optimizer state per rank", xlabel="world size (ranks)", ylabel="MiB", yscale="log")
    for ax in axes:
        ax.set_xticks(worlds)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"shardopt scaling with world size {note if max(worlds) > cores else ''}", fontsize=9)
    fig.tight_layout()
    written.append(out / "scaling_vs_world.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # vs model size: one line per world size.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, w in enumerate(worlds):
        for mode in modes:
            x, t = series("step_ms_median", mode, "world", w, "params")
            _, s = series("state_bytes_per_rank", mode, "world", w, "params")
            kw = dict(color=colors[i % len(colors)], linestyle=style[mode], marker="o", label=f"world {w}, {mode}")
            axes[0].plot([v / 2**20 for v in x], t, **kw)
            axes[1].plot([v / 2**20 for v in x], [b / 2**20 for b in s], **kw)
    axes[0].set(title="optimizer step time (median)", xlabel="model size (Mi params)", ylabel="ms",
                xscale="log", yscale="log")
    axes[1].set(title="optimizer state per rank", xlabel="model size (Mi params)", ylabel="MiB",
                xscale="log", yscale="log")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"shardopt scaling with model size {note if max(worlds) > cores else ''}", fontsize=9)
    fig.tight_layout()
    written.append(out / "scaling_vs_params.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", default="1,2,3,4", help="world sizes (default 1,2,3,4)")
    parser.add_argument("--params", default="2M,8M,32M", help="model sizes, K/M/G = 2^10/20/30 (default 2M,8M,32M)")
    parser.add_argument("--modes", default="sharded,replicated", help="state modes (default both)")
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"])
    parser.add_argument("--partition", default="flat", choices=["flat", "sorted_greedy"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run (default 5)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--stream-mb", type=int, default=256, help="bandwidth-test array size (default 256)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per run")
    parser.add_argument("--bench", type=Path, default=REPO / "build" / "tools" / "shardopt-bench")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--from-csv", type=Path, help="plot this CSV instead of running")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    if args.from_csv:
        rows = load(args.from_csv)
    else:
        if not args.bench.exists():
            sys.exit(f"plot_scaling.py: {args.bench} does not exist; build shardopt-bench first or pass --bench")
        csv_path = args.out / "scaling.csv"
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for n in [parse_count(p) for p in args.params.split(",")]:
                for w in [int(v) for v in args.worlds.split(",")]:
                    for mode in args.modes.split(","):
                        row = run_one(args.bench, w, n, mode, args)
                        writer.writerow(row)
                        f.flush()
                        print(" ".join(f"{k}={row[k]}" for k in FIELDS), flush=True)
        print(f"# wrote {csv_path}")
        rows = load(csv_path)
    bad = [r for r in rows if r["wrong"] != 0]
    for path in plot(rows, args.out, os.cpu_count() or 1):
        print(f"# wrote {path}")
    if bad:
        print(f"plot_scaling.py: {len(bad)} runs reported wrong parameters", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
