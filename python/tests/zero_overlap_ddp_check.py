"""python/tests/zero_overlap_ddp_check.py — torch's overlap_with_ddp pattern (python/examples/zero_overlap_ddp.py) with its two torch imports replaced by shardopt's drop-in, under torchrun (gloo) and mpirun: bitwise the non-overlapped drop-in.

    PYTHONPATH=<the package> python python/tests/zero_overlap_ddp_check.py

Runs outside mpirun (it starts the launchers itself). The example is copied with its two marked
import lines replaced by one, and the copy checked to differ there alone. At 2 ranks:
  - torch's own classes under torchrun on gloo: refused by torch (its hook requires NCCL);
  - shardopt's, under torchrun: the DDP hook (the step at the end of backward), the drop-in's
    own gradient hooks without DDP, and the plain loop (DDP, then step()): one digest of the
    parameters' bytes on every rank and in every mode, so no iteration is lost to the overlap;
  - shardopt's, under mpirun: the DDP hook and the own hooks (the overlap engine), the same digest.
Exits non-zero on a failure.
"""
import itertools
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zero_tutorial_check import CAPTURE, RANKS, mpirun, torchrun

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "zero_overlap_ddp.py"
TORCH_IMPORTS = (
    "from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step",
    "from torch.distributed.optim import ZeroRedundancyOptimizer",
)
SHARDOPT_IMPORT = "from shardopt.torch import ZeroRedundancyOptimizer, hook_with_zero_step"


def shardopt_variant(workdir):
    """The example with its two torch imports replaced by shardopt's one, written to workdir."""
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    code = [line.split("#")[0].strip() for line in lines]
    at = [code.index(statement) for statement in TORCH_IMPORTS]
    assert at[1] == at[0] + 1, "the two torch imports must be adjacent"
    changed = lines[:at[0]] + [SHARDOPT_IMPORT + "\n"] + lines[at[1] + 1:]
    assert len(changed) == len(lines) - 1 and changed[at[0] + 1:] == lines[at[1] + 1:]
    path = Path(workdir) / "zero_overlap_ddp_shardopt.py"
    path.write_text("".join(changed))
    return path


def run(name, command, output, expect_failure=False):
    """One launch; returns {rank: (params sum, digest)} from the ranks' own output files
    (output.<rank>: the launchers may interleave the ranks' lines)."""
    start = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    seconds = time.monotonic() - start
    if expect_failure:
        print(f"{name}: {seconds:.1f} s, exit status {result.returncode}", flush=True)
        return result
    if result.returncode != 0:
        print(result.stdout, flush=True)
        raise AssertionError(f"{name}: exit status {result.returncode}")
    text = "".join(Path(f"{output}.{r}").read_text() for r in range(RANKS) if Path(f"{output}.{r}").exists())
    found = re.findall(r"^rank (\d+): params sum is: (\S+) digest ([0-9a-f]{16})$", text, re.M)
    values = {int(r): (float(s), d) for r, s, d in found}
    print(f"{name}: {seconds:.1f} s, {values}", flush=True)
    assert sorted(values) == list(range(RANKS)), f"{name}: not every rank printed its parameters:\n{text}\n{result.stdout}"
    return values


def main():
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        capture = Path(workdir) / "capture.py"  # each rank's stdout into a file of its own
        capture.write_text(CAPTURE)

        launches = itertools.count()

        def launch(launcher, script, *args):
            output = str(Path(workdir) / f"out{next(launches)}")
            script_args = [str(capture), output, str(script), *args]
            return (torchrun(script_args, workdir) if launcher == "torchrun" else mpirun(script_args)), output

        runs = {}
        command, output = launch("torchrun", EXAMPLE)
        theirs = run("torch's classes, DDP hook, torchrun (gloo)", command, output, expect_failure=True)
        if theirs.returncode == 0 or "NCCL" not in theirs.stdout:
            failures.append("torch's own overlap pattern was expected to refuse gloo")
        variant = shardopt_variant(workdir)
        for launcher, modes in (("torchrun", ("ddp_hook", "own_hooks", "none")), ("mpirun", ("ddp_hook", "own_hooks"))):
            for mode in modes:
                command, output = launch(launcher, variant, "--overlap", mode)
                runs[f"{launcher} {mode}"] = run(f"shardopt, {launcher}, --overlap {mode}", command, output)
        expected = runs["torchrun none"][0][1]
        for name, values in runs.items():
            for rank, (_, digest) in values.items():
                if digest != expected:
                    failures.append(f"{name}: rank {rank}'s parameters (digest {digest}) are not the plain "
                                    f"drop-in's ({expected})")
    for failure in failures:
        print("FAILED:", failure, flush=True)
    print("zero overlap_with_ddp check:", "FAILED" if failures else "passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
