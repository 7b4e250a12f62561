"""python/tests/zero_tutorial_check.py — torch's ZeRO tutorial with only its import changed to shardopt's drop-in, under torchrun (gloo) and under mpirun, against torch's own run.

    PYTHONPATH=<the package> python python/tests/zero_tutorial_check.py

Runs outside mpirun (it starts the launchers itself; they must not be nested in an mpirun'd
process). python/examples/zero_tutorial.py is copied with its one import line replaced, and
that copy is checked to differ from the original in that line alone. Three runs at 2 ranks:
torch's own ZeroRedundancyOptimizer under torchrun, then shardopt's under torchrun (the
communicator over torch's gloo group must be picked) and under mpirun (MPI's must be picked).
Every rank's params_sum must equal torch's within 1e-6 relative. Exits non-zero on a failure.
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "examples" / "zero_tutorial.py"
TORCH_IMPORT = "from torch.distributed.optim import ZeroRedundancyOptimizer"
SHARDOPT_IMPORT = "from shardopt.torch import ZeroRedundancyOptimizer"
RANKS = 2
TOLERANCE = 1e-6

# Runs the script as __main__ with this rank's stdout in a file of its own (launchers may interleave
# the ranks' lines), after making shardopt's drop-in print which communicator it picked.
CAPTURE = """
import os, runpy, sys
output, script = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
sys.stdout = open(f"{output}.{rank}", "w", buffering=1)
if "from shardopt.torch import" in open(script).read():
    import shardopt.torch as drop_in
    original_init = drop_in.ZeroRedundancyOptimizer.__init__
    def announcing_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        print(f"rank {self.rank}: communicator: {self._zero.communicator.backend}", flush=True)
    drop_in.ZeroRedundancyOptimizer.__init__ = announcing_init
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shardopt_variant(workdir):
    """The tutorial with its one import replaced, written to workdir."""
    original = TUTORIAL.read_text().splitlines(keepends=True)
    assert sum(line.strip() == TORCH_IMPORT for line in original) == 1, "the tutorial must import torch's ZeRO once"
    changed = [SHARDOPT_IMPORT + "\n" if line.strip() == TORCH_IMPORT else line for line in original]
    differing = [i for i, (a, b) in enumerate(zip(original, changed)) if a != b]
    assert len(original) == len(changed) and len(differing) == 1, differing
    path = Path(workdir) / "zero_tutorial_shardopt.py"
    path.write_text("".join(changed))
    return path


def torchrun(script_args, workdir):
    # Debian's torch 1.13 on Python 3.11 cannot parse torchrun's default --redirects/--tee ("0"):
    # stdout is redirected to log files and teed to the console instead (value 1). The agent looks
    # at its workers every --monitor_interval seconds (5 by default): 1 s keeps the check short.
    logs = tempfile.mkdtemp(dir=workdir)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), "--monitor_interval", "1", "--redirects", "1", "--tee", "1", "--log_dir", logs,
            *script_args]


def mpirun(script_args):
    return ["mpirun", "-n", str(RANKS), "--oversubscribe", "-x", "MASTER_ADDR=127.0.0.1", "-x",
            f"MASTER_PORT={free_port()}", sys.executable, *script_args]


def run(name, command, output):
    """Runs one launch; returns ({rank: params_sum}, {rank: communicator}) from the ranks' output
    files (output.<rank>)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))}
    start = time.monotonic()
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        print(result.stdout, flush=True)
        raise AssertionError(f"{name}: exit status {result.returncode}")
    text = "".join(Path(f"{output}.{r}").read_text() for r in range(RANKS) if Path(f"{output}.{r}").exists())
    sums = {int(r): float(v) for r, v in re.findall(r"^rank (\d+): params sum is: (\S+)$", text, re.M)}
    comms = {int(r): c.strip() for r, c in re.findall(r"^rank (\d+): communicator: (.+)$", text, re.M)}
    print(f"{name}: {seconds:.1f} s, params sum {sums}, communicators {comms}", flush=True)
    assert sorted(sums) == list(range(RANKS)), f"{name}: not every rank printed its params sum:\n{text}\n{result.stdout}"
    return sums, comms


def main():
    with tempfile.TemporaryDirectory() as workdir:
        variant = shardopt_variant(workdir)
        capture = Path(workdir) / "capture.py"
        capture.write_text(CAPTURE)
        output = str(Path(workdir) / "torch")
        reference, comms = run("torch's ZeroRedundancyOptimizer, torchrun",
                               torchrun([str(capture), output, str(TUTORIAL)], workdir), output)
        assert not comms, comms  # torch's own run never constructs shardopt's drop-in
        expected = reference[0]
        assert all(v == expected for v in reference.values()), reference
        failures = []
        for name, launcher, backend in (
            ("shardopt, torchrun", "torchrun", "torch.distributed (gloo)"),
            ("shardopt, mpirun", "mpirun", "mpi"),
        ):
            output = str(Path(workdir) / launcher)
            script_args = [str(capture), output, str(variant)]
            command = torchrun(script_args, workdir) if launcher == "torchrun" else mpirun(script_args)
            sums, comms = run(name, command, output)
            if comms != {r: backend for r in range(RANKS)}:
                failures.append(f"{name}: picked {comms}, expected {backend} on every rank")
            for rank, value in sums.items():
                if abs(value - expected) > TOLERANCE * abs(expected):
                    failures.append(f"{name}: rank {rank}'s params sum {value!r} is not torch's {expected!r}")
        for failure in failures:
            print("FAILED:", failure, flush=True)
        print("zero tutorial check:", "FAILED" if failures else "passed", flush=True)
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
