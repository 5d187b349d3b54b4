"""Scenarios run by test_comm.py, one process per rank: `python ranks.py SCENARIO RANK WORLD STORE`.
Each prints `PASS <scenario>` on success; any failed expectation raises (non-zero exit)."""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import stratac
from stratac.comm import Communicator, StrataRuntimeError, StrataUsageError

ROOT = Path(__file__).resolve().parents[2]
AR = ROOT / "examples" / "allreduce_twoshot.strata"
AG = ROOT / "examples" / "allgather_push.strata"


def expect_error(exc_type, text, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc_type as exc:
        assert text in str(exc), f"{text!r} not in {exc!r}"
        return
    raise AssertionError(f"expected {exc_type.__name__} containing {text!r}")


def inputs(world, n, seed):
    return [torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(seed * 100 + r))
            .float() for r in range(world)]


def interleaved(comm, rank, world):
    """Back-to-back calls alternating two schedules and sizes: every result right (epochs)."""
    ar, ag = comm.load(AR), comm.load(AG)
    for it in range(40):
        n = [1, 37, 1000, 4099][it % 4]
        x = comm.empty(n, dtype=torch.float32)
        xs = inputs(world, n, it)
        x.copy_(xs[rank])
        ar.allreduce_twoshot(x, op="sum", cores=3)
        assert torch.equal(x, torch.stack(xs).sum(0)), it
        out = comm.empty(n * world, dtype=torch.float32)
        x.copy_(xs[rank])
        ag.allgather_push(x, out, cores=2)
        assert torch.equal(out, torch.cat(xs)), it
        comm.free(out)
        comm.free(x)


def bad_input(comm, rank, world):
    ar = comm.load(AR)
    expect_error(StrataUsageError, "not on the symmetric heap: allocate it with comm.empty",
                 ar.allreduce_twoshot, torch.zeros(8), op="sum")
    x = comm.empty(8, dtype=torch.float64)
    expect_error(StrataUsageError, "parameter x has dtype torch.float64", ar.allreduce_twoshot, x,
                 op="sum")
    x32 = comm.empty(8, dtype=torch.float32)
    expect_error(StrataUsageError, "missing argument(s) op", ar.allreduce_twoshot, x32)
    expect_error(StrataUsageError, "op must be one of sum, max, min, got 'avg'", ar.allreduce_twoshot,
                 x32, op="avg")
    ag = comm.load(AG)
    x = comm.empty(8, dtype=torch.float32)
    out = comm.empty(8 * world + 1, dtype=torch.float32)
    expect_error(StrataUsageError, f"parameter out must have (n * world) = {8 * world} elements, got "
                 f"{8 * world + 1}", ag.allgather_push, x, out)
    y = comm.empty(8 * world, dtype=torch.float16)
    expect_error(StrataUsageError, "parameter out is torch.float16 but an earlier T parameter is "
                 "torch.float32", ag.allgather_push, x, y)
    expect_error(StrataUsageError, "missing argument(s) out", ag.allgather_push, x)
    expect_error(StrataUsageError, "has no parameter 'y'", ag.allgather_push, x, out=y, y=y)
    expect_error(StrataUsageError, "must be contiguous", ar.allreduce_twoshot,
                 comm.empty(4, 4, dtype=torch.float32).t(), op="sum")
    expect_error(StrataRuntimeError, "symmetric heap exhausted", comm.empty, 1 << 40)
    import inspect
    sig = str(inspect.signature(ag.allgather_push))
    assert sig == \
        "(x: 'sym T[n]', out: 'sym T[(n * world)]', *, cores=None)", sig


def segment_gone(comm, rank, world):
    """The segment's name is removed as soon as every rank mapped it (rank 0 removes it right
    after the bootstrap's last barrier; one more barrier and every rank sees it gone)."""
    comm.barrier()
    assert not os.path.exists("/dev/shm/" + comm.segment.lstrip("/"))
    x = comm.zeros(16)
    assert float(x.sum()) == 0.0


def closed(comm, rank, world):
    ar = comm.load(AR)
    x = comm.empty(4)
    comm.close()
    expect_error(StrataUsageError, "closed", comm.empty, 4)
    expect_error(StrataUsageError, "closed", ar.allreduce_twoshot, x, op="sum")


SCENARIOS = {f.__name__: f for f in (interleaved, bad_input, segment_gone, closed)}


def main(scenario, rank, world, store_path, mode):
    if mode == "pg":
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        comm = stratac.Communicator.from_process_group(heap_bytes=16 << 20)
    else:
        store = dist.FileStore(store_path, world)
        comm = Communicator.from_store(rank, world, store, heap_bytes=16 << 20)
    SCENARIOS[scenario](comm, rank, world)
    comm.close()
    print(f"PASS {scenario}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
