"""python/examples/train_lm.py — a small transformer LM on synthetic sequences, trained under DDP with torch's ZeroRedundancyOptimizer and with shardopt's drop-in, under torchrun and under mpirun; writes the loss curves (PNG) and a table of step time and peak memory.

All four runs (2 ranks each), then the picture and the table::

    python python/examples/train_lm.py --out python/examples

One run, as the launchers start it (--optimizer torch|shardopt)::

    python -m torch.distributed.run --nproc_per_node 2 python/examples/train_lm.py --worker --optimizer shardopt --json run.json
    mpirun -n 2 python python/examples/train_lm.py --worker --optimizer shardopt --json run.json

Under torchrun shardopt's drop-in sends its collectives over torch's gloo group; under mpirun
over MPI. The training code is the same for both optimizers but for the one class.

Compact optimizer state (docs/compact_state.md), shardopt under mpirun at one rank (gloo has no
bf16 for DDP): fp32 state, q8 moments, and bf16 parameters with fp32 masters and with
remainder16 masters, over the same steps and batches; writes compact_state_losses.png and compact_state_results.md::

    python python/examples/train_lm.py --compare-state --steps 200 --out python/examples
"""
import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time

VOCAB, WIDTH, LAYERS, HEADS, SEQ, BATCH = 64, 192, 3, 4, 48, 8


def launch_environment():
    """(rank, world size) from torchrun's variables, or from mpirun's (Open MPI)."""
    rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    return int(rank), int(world)


def build_model(torch):
    nn = torch.nn

    class TinyLM(nn.Module):
        """Token and position embeddings, a causal transformer encoder, a linear head."""

        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, WIDTH)
            self.positions = nn.Embedding(SEQ, WIDTH)
            layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, LAYERS)
            self.head = nn.Linear(WIDTH, VOCAB)
            self.register_buffer("causal", torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1))

        def forward(self, x):
            h = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
            return self.head(self.body(h, mask=self.causal[: x.shape[1], : x.shape[1]]))

    return TinyLM()


def synthetic_batch(torch, step, rank):
    """Arithmetic sequences mod VOCAB (a random start and stride each): the next token follows
    from the previous two, so the loss falls from ln(VOCAB) towards 0 as the model learns."""
    g = torch.Generator().manual_seed(100003 * step + rank)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 8, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.optimizer == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer
    else:
        from shardopt.torch import ZeroRedundancyOptimizer

    rank, world = launch_environment()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = build_model(torch)
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    # One rank needs no gradient averaging (and gloo has no bf16 for DDP's broadcasts).
    ddp = DDP(model) if world > 1 else model
    compact = {}
    if args.optimizer == "shardopt":
        compact = dict(state_precision=args.state_precision, master=args.master)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=args.lr, weight_decay=0.01,
                                  **compact)
    communicator = "torch.distributed (gloo)" if args.optimizer == "torch" else opt._zero.communicator.backend
    losses, iteration_s, step_s = [], [], []
    for step in range(args.steps):
        start = time.perf_counter()
        x, y = synthetic_batch(torch, step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x).float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        before_step = time.perf_counter()
        opt.step()
        end = time.perf_counter()
        iteration_s.append(end - start)
        step_s.append(end - before_step)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # the loss over every rank's batch, for the curve
        losses.append(mean_loss.item() / world)
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])  # kB on Linux
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        steady = slice(min(5, args.steps - 1), None)  # the first steps warm up allocators and caches
        result = dict(
            optimizer=args.optimizer,
            dtype=args.dtype,
            state_precision=args.state_precision,
            master=args.master,
            state_bytes=opt._zero.memory_report().state_bytes if args.optimizer == "shardopt" else None,
            master_bytes=opt._zero.memory_report().master_bytes if args.optimizer == "shardopt" else None,
            launcher="mpirun" if "OMPI_COMM_WORLD_SIZE" in os.environ else "torchrun",
            communicator=communicator,
            ranks=world,
            params=sum(p.numel() for p in model.parameters()),
            losses=losses,
            iteration_ms=1000 * sum(iteration_s[steady]) / len(iteration_s[steady]),
            step_ms=1000 * sum(step_s[steady]) / len(step_s[steady]),
            peak_rss_mb=peak.item(),
        )
        with open(args.json, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


# ---- the driver: four launches, then the picture and the table -------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher, optimizer, args, workdir, dtype="f32", state_precision="fp32", master="fp32"):
    out = os.path.join(workdir, f"{launcher}-{optimizer}-{dtype}-{state_precision}-{master}.json")
    worker_args = [os.path.abspath(__file__), "--worker", "--optimizer", optimizer, "--json", out,
                   "--steps", str(args.steps), "--lr", str(args.lr), "--dtype", dtype,
                   "--state-precision", state_precision, "--master", master]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # torchrun's default, for both launchers alike
    if launcher == "torchrun":
        # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 cannot parse their default ("0").
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--monitor_interval", "1",
                   "--redirects", "1", "--tee", "1", "--log_dir", tempfile.mkdtemp(dir=workdir), *worker_args]
    else:
        command = ["mpirun", "-n", str(args.ranks), "--oversubscribe", "-x", "OMP_NUM_THREADS", "-x",
                   "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", sys.executable, *worker_args]
    print(f"== {optimizer} under {launcher}", flush=True)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {("torch", "torchrun"): ("tab:blue", "-"), ("shardopt", "torchrun"): ("tab:orange", "--"),
              ("torch", "mpirun"): ("tab:green", "-"), ("shardopt", "mpirun"): ("tab:red", ":")}
    for r in results:
        color, style = styles[(r["optimizer"], r["launcher"])]
        name = "torch ZeroRedundancyOptimizer" if r["optimizer"] == "torch" else "shardopt drop-in"
        ax.plot(r["losses"], color=color, linestyle=style, label=f"{name}, {r['launcher']} ({r['communicator']})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_yscale("log")
    ax.set_title(f"Tiny transformer LM, {results[0]['params'] / 1e6:.1f}M params, DDP over {results[0]['ranks']} ranks, AdamW")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results):
    import torch

    lines = [
        f"One run each, {results[0]['ranks']} ranks on one machine ({cpu_name()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS=1), torch {torch.__version__}, {results[0]['params']:,} parameters, "
        f"{len(results[0]['losses'])} steps (times: mean over the steps after the 5th).",
        "",
        "| launcher | optimizer | communicator | iteration (ms) | optimizer.step() (ms) | peak RSS per rank (MB) | final loss |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        name = "torch ZeroRedundancyOptimizer" if r["optimizer"] == "torch" else "shardopt drop-in"
        lines.append(f"| {r['launcher']} | {name} | {r['communicator']} | {r['iteration_ms']:.1f} | {r['step_ms']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['losses'][-1]:.4f} |")
    return "\n".join(lines) + "\n"


def driver(args):
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [launch(launcher, optimizer, args, workdir)
                   for launcher in ("torchrun", "mpirun") for optimizer in ("torch", "shardopt")]
    png = os.path.join(args.out, "loss_curves.png")
    md = os.path.join(args.out, "train_lm_results.md")
    plot(results, png)
    text = table(results)
    with open(md, "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {png} and {md}")


# The compact-state runs: (parameter dtype, state_precision, master), and the run each is set against.
COMPACT_RUNS = [("f32", "fp32", "fp32"), ("f32", "q8", "fp32"), ("bf16", "fp32", "fp32"), ("bf16", "fp32", "remainder16"),
                ("bf16", "q8", "remainder16")]
COMPACT_BASELINE = {"f32": ("f32", "fp32", "fp32"), "bf16": ("bf16", "fp32", "fp32")}


def compare_state(args):
    os.makedirs(args.out, exist_ok=True)
    args.ranks = 1  # gloo cannot broadcast bf16 parameters for DDP; one rank needs no DDP
    with tempfile.TemporaryDirectory() as workdir:
        results = [launch("mpirun", "shardopt", args, workdir, *run) for run in COMPACT_RUNS]
    by_run = {(r["dtype"], r["state_precision"], r["master"]): r for r in results}
    lines = [
        f"shardopt drop-in under mpirun, {results[0]['ranks']} ranks on one machine ({cpu_name()}, {os.cpu_count()} cores, "
        f"OMP_NUM_THREADS=1), AdamW lr {args.lr}, {results[0]['params']:,} parameters, {args.steps} steps, the same "
        "batches. Bytes per parameter: memory_report() of rank 0 over its shard (params under 4096 elements keep "
        "fp32 moments). Each step's batch differs, so the last step's loss is noisy: the mean of the last 20 steps "
        "is set beside it. Against: the same parameter dtype with fp32 state and fp32 masters.",
        "",
        "| parameters | state | master | state B/param | master B/param | final loss | against fp32 | mean of the last 20 | against fp32 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def tail(r):
        return sum(r["losses"][-20:]) / len(r["losses"][-20:])

    for r in results:
        base = by_run[COMPACT_BASELINE[r["dtype"]]]
        shard = r["params"] / r["ranks"]
        lines.append(f"| {r['dtype']} | {r['state_precision']} | {r['master']} | {r['state_bytes'] / shard:.2f} | "
                     f"{r['master_bytes'] / shard:.2f} | {r['losses'][-1]:.4f} | "
                     f"{100 * (r['losses'][-1] / base['losses'][-1] - 1):+.1f}% | {tail(r):.4f} | "
                     f"{100 * (tail(r) / tail(base) - 1):+.1f}% |")
    text = "\n".join(lines) + "\n"
    md = os.path.join(args.out, "compact_state_results.md")
    with open(md, "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "compact_state_losses.json"), "w") as f:
        json.dump(results, f)
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not available: no PNG (the numbers are in compact_state_losses.json)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(r["losses"], label=f"{r['dtype']} params, {r['state_precision']} state, {r['master']} master")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_yscale("log")
    ax.set_title(f"Tiny transformer LM, AdamW, compact optimizer state ({results[0]['ranks']} ranks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "compact_state_losses.png"), dpi=110)
    print(f"wrote {md} and compact_state_losses.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="one training run (as torchrun/mpirun start it)")
    parser.add_argument("--optimizer", choices=("torch", "shardopt"), default="shardopt")
    parser.add_argument("--json", help="worker: where rank 0 writes its results")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ranks", type=int, default=2, help="driver: ranks per run")
    parser.add_argument("--out", default=".", help="driver: where the PNG and the table go")
    parser.add_argument("--compare-state", action="store_true", help="driver: the compact-state runs instead")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32", help="worker: the model's parameters")
    parser.add_argument("--state-precision", choices=("fp32", "q8"), default="fp32", help="worker: shardopt's moments")
    parser.add_argument("--master", choices=("fp32", "remainder16"), default="fp32", help="worker: bf16 masters")
    args = parser.parse_args()
    if args.worker:
        worker(args)
    elif args.compare_state:
        compare_state(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
