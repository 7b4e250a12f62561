"""python/examples/train_lm.py — a small transformer LM on synthetic sequences, trained under DDP with torch's ZeroRedundancyOptimizer and with shardopt's drop-in, under torchrun and under mpirun; writes the loss curves (PNG) and a table of step time and peak memory; or (--compare-state) shardopt's drop-in with fp32 state, 8-bit moments and 16-bit master remainders over the same steps.

All four runs (2 ranks each), then the picture and the table::

    python python/examples/train_lm.py --out python/examples

The optimizer state's precision compared (five runs under mpirun, 2 ranks, 200 steps)::

    python python/examples/train_lm.py --compare-state --steps 200 --out python/examples

One run, as the launchers start it (--optimizer torch|shardopt)::

    python -m torch.distributed.run --nproc_per_node 2 python/examples/train_lm.py --worker --optimizer shardopt --json run.json
    mpirun -n 2 python python/examples/train_lm.py --worker --optimizer shardopt --json run.json

Under torchrun shardopt's drop-in sends its collectives over torch's gloo group; under mpirun
over MPI. The training code is the same for both optimizers but for the one class.
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


# --state: the model's dtype and the drop-in's compact-state keywords.
STATES = {
    "fp32": ("f32", {}),
    "q8": ("f32", dict(state_precision="q8")),
    "bf16": ("bf16", {}),
    "bf16-remainder16": ("bf16", dict(master="remainder16")),
    "bf16-q8-remainder16": ("bf16", dict(state_precision="q8", master="remainder16")),
}


def average_gradients(torch, dist, model, world):
    """DDP's average, by hand: gloo has no bf16 all-reduce (torch 1.13), so each gradient is
    summed in fp32 and written back in its own dtype."""
    for p in model.parameters():
        total = p.grad.float()
        dist.all_reduce(total)
        p.grad.copy_(total / world)


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
    dtype, compact = STATES[args.state]
    if args.optimizer == "torch" and args.state != "fp32":
        raise SystemExit("train_lm.py: --state other than fp32 is shardopt's (torch's optimizers keep fp32 state)")
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    ddp = DDP(model) if dtype == "f32" else model  # bf16: averaged by average_gradients
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
        if dtype == "bf16":
            average_gradients(torch, dist, model, world)
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
    state_bytes = torch.zeros(2, dtype=torch.float64)  # optimizer state, masters: over every rank
    if args.optimizer == "shardopt":
        report = opt.memory_report()
        state_bytes += torch.tensor([float(report.state_bytes), float(report.master_bytes)], dtype=torch.float64)
    dist.all_reduce(state_bytes)
    if rank == 0:
        steady = slice(min(5, args.steps - 1), None)  # the first steps warm up allocators and caches
        result = dict(
            optimizer=args.optimizer,
            launcher="mpirun" if "OMPI_COMM_WORLD_SIZE" in os.environ else "torchrun",
            communicator=communicator,
            ranks=world,
            params=sum(p.numel() for p in model.parameters()),
            losses=losses,
            iteration_ms=1000 * sum(iteration_s[steady]) / len(iteration_s[steady]),
            step_ms=1000 * sum(step_s[steady]) / len(step_s[steady]),
            peak_rss_mb=peak.item(),
            state=args.state,
            state_bytes=state_bytes[0].item(),
            master_bytes=state_bytes[1].item(),
        )
        with open(args.json, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


# ---- the driver: four launches, then the picture and the table -------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher, optimizer, args, workdir, state="fp32"):
    out = os.path.join(workdir, f"{launcher}-{optimizer}-{state}.json")
    worker_args = [os.path.abspath(__file__), "--worker", "--optimizer", optimizer, "--json", out,
                   "--steps", str(args.steps), "--lr", str(args.lr), "--state", state]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # torchrun's default, for both launchers alike
    if launcher == "torchrun":
        # --redirects/--tee 1: Debian's torch 1.13 on Python 3.11 cannot parse their default ("0").
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--monitor_interval", "1",
                   "--redirects", "1", "--tee", "1", "--log_dir", tempfile.mkdtemp(dir=workdir), *worker_args]
    else:
        command = ["mpirun", "-n", str(args.ranks), "--oversubscribe", "-x", "OMP_NUM_THREADS", "-x",
                   "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", sys.executable, *worker_args]
    print(f"== {optimizer} under {launcher}, state {state}", flush=True)
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


def compare_state(args):
    """shardopt's drop-in under mpirun with each --state, the same data and seeds: the loss
    curves, the final loss against fp32 state's, and the bytes of state per parameter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [launch("mpirun", "shardopt", args, workdir, state) for state in STATES]
    base_losses = results[0]["losses"]
    tail = min(10, len(base_losses))

    def final(losses):  # one step's loss is noisy (its own batch): the mean of the last steps
        return sum(losses[-tail:]) / tail

    base = final(base_losses)
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ax.plot(r["losses"], label=r["state"], linestyle="--" if "q8" in r["state"] else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over ranks)")
    ax.set_yscale("log")
    ax.set_title(f"Tiny transformer LM, {results[0]['params'] / 1e6:.1f}M params, {results[0]['ranks']} ranks, "
                 "AdamW state precision")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(args.out, "compact_loss_curves.png")
    fig.savefig(png, dpi=110)
    lines = [
        f"One run each under mpirun, {results[0]['ranks']} ranks on one machine ({cpu_name()}, {os.cpu_count()} "
        f"cores), shardopt's drop-in ZeroRedundancyOptimizer (AdamW), {results[0]['params']:,} parameters, "
        f"{len(base_losses)} steps, the same data and seeds.",
        "",
        f"| state | parameters | final loss (mean of the last {tail} steps) | vs fp32 state | max abs loss difference vs its plain run | "
        "state bytes / param | master bytes / param |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    plain = {"f32": base_losses, "bf16": results[2]["losses"]}
    for r in results:
        dtype = STATES[r["state"]][0]
        diff = max(abs(a - b) for a, b in zip(r["losses"], plain[dtype]))
        lines.append(f"| {r['state']} | {dtype} | {final(r['losses']):.4f} | {100 * (final(r['losses']) / base - 1):+.2f}% | "
                     f"{diff:.3g} | {r['state_bytes'] / r['params']:.3f} | {r['master_bytes'] / r['params']:.3f} |")
    text = "\n".join(lines) + "\n"
    md = os.path.join(args.out, "compact_state_results.md")
    with open(md, "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "compact_state_losses.json"), "w") as f:  # every step's loss, per run
        json.dump({r["state"]: r["losses"] for r in results}, f)
    print(text)
    print(f"wrote {png} and {md}")


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="one training run (as torchrun/mpirun start it)")
    parser.add_argument("--optimizer", choices=("torch", "shardopt"), default="shardopt")
    parser.add_argument("--json", help="worker: where rank 0 writes its results")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--ranks", type=int, default=2, help="driver: ranks per run")
    parser.add_argument("--out", default=".", help="driver: where the PNG and the table go")
    parser.add_argument("--state", choices=tuple(STATES), default="fp32",
                        help="worker: the model's dtype and shardopt's state precision (default fp32)")
    parser.add_argument("--compare-state", action="store_true",
                        help="driver: shardopt under mpirun with every --state instead of torch against shardopt")
    args = parser.parse_args()
    if args.worker:
        worker(args)
    elif args.compare_state:
        compare_state(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
