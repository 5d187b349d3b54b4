"""Scenarios of test_agreement.py, one process per rank: `python agree_ranks.py SCENARIO RANK WORLD STORE`.

In each, the ranks make calls that differ (in a size, the dtype, the op, a rank parameter, the
order of schedules, or how the kernel was built). Every rank must raise a StrataUsageError naming
every rank's call, and nothing may be written: a sentinel tensor on the heap of every rank and
every buffer of the call keep their values, and afterwards the same communicator runs an agreeing
call correctly. Prints `PASS <scenario>` on success; any failed expectation raises (non-zero exit).
"""

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: expect.py
from expect import Failed, check  # noqa: E402

import stratac  # noqa: E402
from stratac.host.errors import StrataUsageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
AR = ROOT / "examples" / "allreduce_twoshot.strata"
AG = ROOT / "examples" / "allgather_push.strata"
BC = ROOT / "examples" / "broadcast.strata"
PREFILL = ROOT / "examples" / "moe_prefill.strata"
NOTHING = "Nothing was written on any rank"


def filled(comm, n, dtype, value):
    t = comm.empty(n, dtype=dtype)
    t.copy_(torch.arange(n, dtype=torch.float64).mul(0.25).add(value).to(dtype))
    return t


def refused(comm, call, expected: list[str], buffers: list):
    """call() raises on this rank naming every expected text; the buffers and a sentinel allocated
    after them (where a push of a larger peer's call lands) keep their values."""
    sentinel = filled(comm, 4096, torch.float32, 1000.0 + comm.rank)
    before = [b.clone() for b in buffers] + [sentinel.clone()]
    try:
        call()
    except StrataUsageError as e:
        msg = str(e)
    else:
        raise Failed(f"rank {comm.rank}: the call was not refused (expected {expected[0]!r})")
    for text in expected + [NOTHING]:
        check(text in msg, f"{text!r} not in {msg!r}")
    for b, was in zip(buffers + [sentinel], before):
        check(torch.equal(b, was), f"a buffer changed: {b[:8]} (was {was[:8]})")
    comm.free(sentinel)


def agreeing_call_works(comm, world):
    """After the refusals, an agreeing call on the same communicator is right (the stamps met again)."""
    ar = comm.load(AR)
    n = 1000
    x = filled(comm, n, torch.float32, comm.rank)
    ar.allreduce_twoshot(x, op="sum")
    want = sum(torch.arange(n, dtype=torch.float64).mul(0.25).add(r) for r in range(world)).float()
    check(torch.equal(x, want), f"{x[:4]} != {want[:4]}")
    comm.free(x)


def sizes(comm, rank, world, a=900, b=1152):
    ar = comm.load(AR)
    n = a if rank == 0 else b
    x = filled(comm, n, torch.float32, rank)
    refused(comm, lambda: ar.allreduce_twoshot(x, op="sum"),
            [f"rank 0 called allreduce_twoshot(n={a}, f32, sum), rank 1 allreduce_twoshot(n={b}, f32, sum)"],
            [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def sizes_1000_1024(comm, rank, world):
    sizes(comm, rank, world, 1000, 1024)


def dtypes(comm, rank, world):
    ar = comm.load(AR)
    x = filled(comm, 1024, torch.float32 if rank == 0 else torch.float16, rank)
    refused(comm, lambda: ar.allreduce_twoshot(x, op="sum"),
            ["rank 0 called allreduce_twoshot(n=1024, f32, sum), rank 1 allreduce_twoshot(n=1024, f16, sum)"],
            [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def ops(comm, rank, world):
    ar = comm.load(AR)
    x = filled(comm, 1024, torch.float32, rank)
    op = "sum" if rank == 0 else "max"
    refused(comm, lambda: ar.allreduce_twoshot(x, op=op),
            ["rank 0 called allreduce_twoshot(n=1024, f32, sum), rank 1 allreduce_twoshot(n=1024, f32, max)"],
            [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def roots(comm, rank, world):
    """A rank parameter: each rank names itself the root of a broadcast."""
    bc = comm.load(BC)
    x = filled(comm, 1024, torch.float32, rank)
    refused(comm, lambda: bc.broadcast(x, root=rank),
            ["rank 0 called broadcast(n=1024, f32, root=0), rank 1 broadcast(n=1024, f32, root=1)"], [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def order(comm, rank, world):
    """Rank 0 calls allgather then allreduce, rank 1 the other way round: both calls are refused
    on both ranks, and named the same way on both."""
    ar, ag = comm.load(AR), comm.load(AG)
    x = filled(comm, 1024, torch.float32, rank)
    out = filled(comm, 1024 * world, torch.float32, 7.0)
    gather = (lambda: ag.allgather_push(x, out))
    reduce = (lambda: ar.allreduce_twoshot(x, op="sum"))
    first, second = (gather, reduce) if rank == 0 else (reduce, gather)
    refused(comm, first, ["as call 1 of this communicator: rank 0 called allgather_push(n=1024, f32), "
                          "rank 1 allreduce_twoshot(n=1024, f32, sum)"], [x, out])
    refused(comm, second, ["as call 2 of this communicator: rank 0 called allreduce_twoshot(n=1024, f32, sum), "
                           "rank 1 allgather_push(n=1024, f32)"], [x, out])
    comm.free(out)
    comm.free(x)
    agreeing_call_works(comm, world)


def builds(comm, rank, world):
    """The same call from kernels built differently: rank 1 compiled the schedule with other
    default cores (the same kernel sources, so one cached library, but another manifest), then from
    a copy of the source one comment line longer (other kernel sources)."""
    from stratac.ir import passes
    x = filled(comm, 1024, torch.float32, rank)
    same = "every rank called allreduce_twoshot(n=1024, f32, sum), but from kernels built differently"
    ar = comm.load(AR, options=passes.Options(cores=2 if rank == 0 else 4))
    refused(comm, lambda: ar.allreduce_twoshot(x, op="sum"), [same], [x])
    text = AR.read_text(encoding="utf-8")
    ar = comm.load(text if rank == 0 else "# one line longer\n" + text, name="allreduce_twoshot.strata")
    refused(comm, lambda: ar.allreduce_twoshot(x, op="sum"), [same], [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def three_ranks(comm, rank, world):
    """World 3, rank 2 alone with another size: every rank raises, naming ranks 0, 1 together."""
    ar = comm.load(AR)
    n = 1200 if rank == 2 else 900
    x = filled(comm, n, torch.float32, rank)
    refused(comm, lambda: ar.allreduce_twoshot(x, op="sum"),
            ["ranks 0, 1 called allreduce_twoshot(n=900, f32, sum), rank 2 allreduce_twoshot(n=1200, f32, sum)"],
            [x])
    comm.free(x)
    agreeing_call_works(comm, world)


def absent(comm, rank, world):
    """Rank 1 makes no call at all: rank 0's call ends at its wait's deadline naming rank 1, with no
    write to rank 1 (its sentinel unchanged)."""
    from stratac.host.errors import StrataRuntimeError
    ar = comm.load(AR)
    x = filled(comm, 1024, torch.float32, rank)
    sentinel = filled(comm, 4096, torch.float32, 1000.0 + rank)
    before = sentinel.clone()
    if rank == 0:
        try:
            ar.allreduce_twoshot(x, op="sum")
        except StrataRuntimeError as e:
            msg = str(e)
        else:
            raise Failed("rank 0: the call returned although rank 1 never made it")
        check("barrier slot of rank 1" in msg and "ranks that have not arrived at this barrier: 1" in msg, msg)
    dist.barrier()   # rank 1 stays until rank 0's wait has ended
    check(torch.equal(sentinel, before), "rank 1's sentinel changed")
    return False     # the pool is aborted: close without the collective barrier


def masks(comm, rank, world):
    """World 3: rank 0 takes rank 2 for dead and masks it; ranks 1 and 2 pass no mask. Ranks 0
    and 1 pass the agreement and raise at once, naming both calls; rank 0 never announces itself
    to rank 2 (it masks it), so rank 2 raises at its wait's deadline, naming every rank's call from
    their records. Nothing is written on any rank."""
    from stratac.host.errors import StrataUsageError
    T, H, K, E = 4, 8, 2, 2 * world
    mod = comm.load(PREFILL)
    x = filled(comm, T * H, torch.float32, rank).view(T, H)
    ids = comm.empty(T, K, dtype=torch.int32)
    ids.copy_(torch.tensor([[0, E - 1]] * T, dtype=torch.int32))
    counts = comm.zeros(world, E, dtype=torch.int32)
    win = comm.zeros(world * T * K, H, dtype=torch.float32)
    sentinel = filled(comm, 4096, torch.float32, 1000.0 + rank)
    before = sentinel.clone()
    live = [True, True, False] if rank == 0 else None
    dist.barrier()
    try:
        mod.moe_prefill_dispatch(x, ids, counts, win, active=live)
    except StrataUsageError as e:
        msg = str(e)
    else:
        raise Failed(f"rank {rank}: the call was not refused")
    mine = "moe_prefill_dispatch(tokens=4, hidden=8, topk=2, experts=6, f32"
    check(f"rank 0 called {mine}, active=[1,1,0])" in msg and f"{mine})" in msg, msg)
    if rank == 2:
        check("so this rank waited until the deadline" in msg and "barrier slot of rank 0" in msg, msg)
    else:
        check(NOTHING in msg, msg)
    dist.barrier()   # every rank's call has ended
    check(torch.equal(sentinel, before) and int(counts.abs().sum()) == 0 and int(win.abs().sum()) == 0,
          "something was written")
    return False     # rank 2's wait aborted the pool: close without the collective barrier


SCENARIOS = {f.__name__: f for f in (sizes, sizes_1000_1024, dtypes, ops, roots, order, builds, three_ranks,
                                     absent, masks)}


def main(scenario, rank, world, store_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    comm = stratac.Communicator.from_process_group(heap_bytes=16 << 20,
                                                   timeout=3 if scenario in ("absent", "masks") else 20)
    clean = SCENARIOS[scenario](comm, rank, world)
    comm.close(collective=clean is not False)
    print(f"PASS {scenario}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
