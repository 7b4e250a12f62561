"""python/tests/support.py — what the test modules share: expecting a shardopt.Error, their script mode (under mpirun without pytest), and torch.distributed over the mpirun ranks."""
import sys
import traceback

import shardopt


def raises(call, code="invalid_argument"):
    """The shardopt.Error that call() raises (failing the test if it does not)."""
    try:
        call()
    except shardopt.Error as e:
        assert e.code == code, (e.code, str(e))
        return str(e)
    raise AssertionError("no shardopt.Error was raised")


def run_tests(namespace: dict, rank: int) -> int:
    """Every callable test_* of `namespace` in name order; a failure is reported and the rest go on,
    since the other ranks run the same collectives. Returns the exit status."""
    tests = [v for k, v in sorted(namespace.items()) if k.startswith("test_") and callable(v)]
    passed = failed = 0
    for test in tests:
        try:
            test()
            passed += 1
        except Exception:
            failed += 1
            print(f"rank {rank}: {test.__name__} FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    print(f"rank {rank}: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def init_gloo_over_mpi_ranks(rank: int, world: int):
    """torch.distributed (gloo) over the ranks mpirun started, at a port this job's id picks (every
    rank alike); a no-op where it is already initialised (the test modules share one process)."""
    import os

    import torch.distributed as dist

    if dist.is_initialized():
        return
    job = int(os.environ.get("OMPI_MCA_ess_base_jobid", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + job % 20000))
    dist.init_process_group("gloo", rank=rank, world_size=world)
