"""Scenarios of the torch.distributed backend, one process per rank:
`python ranks.py SCENARIO RANK WORLD STORE`. Each prints `PASS <scenario>` and the backend's stats
as one JSON line (`STATS {...}`); any failed expectation raises (non-zero exit).

Every rank's input is drawn from a seed of (rank, case), so every rank computes the whole job's
inputs and checks its result against torch's own reduction of them (the reference shares no code
with the backend)."""

import json
import os
import re
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: expect.py
from expect import Failed, check, expect_error  # noqa: E402

import stratac.distributed as sd  # noqa: E402  (registers the backend)
from stratac.host.errors import StrataRuntimeError, StrataUsageError  # noqa: E402

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
          torch.float64, torch.complex64]


def data(rank: int, case: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input of a case: small integers, exact in every dtype and in every sum."""
    g = torch.Generator().manual_seed(rank * 1000 + case)
    v = torch.randint(0, 7, (n,), generator=g)
    if dtype.is_complex:
        return torch.complex(v.float(), (v % 3).float()).to(dtype)
    return v.to(dtype)


def reference(op, xs: list[torch.Tensor]) -> torch.Tensor:
    s = torch.stack([x.to(torch.complex128 if x.is_complex() else torch.float64) for x in xs])
    name = {R.SUM: "sum", R.AVG: "avg", R.MAX: "max", R.MIN: "min", R.PRODUCT: "prod"}[op]
    if name == "avg":
        return (s.sum(0) / len(xs)).to(xs[0].dtype)
    if name in ("max", "min"):
        return getattr(s, name)(0).values.to(xs[0].dtype)
    return getattr(s, name)(0).to(xs[0].dtype)


def collectives(rank, world):
    """Every collective over dtypes, ops, sizes (odd ones too), sync and async, in place and into
    lists; each result against torch's reduction of every rank's inputs."""
    case = 0
    for dtype in DTYPES:
        for n in (1, 33, 1000):
            for op in (R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT):
                if op == R.AVG and not (dtype.is_floating_point or dtype.is_complex):
                    continue
                if dtype.is_complex and op in (R.MAX, R.MIN, R.PRODUCT):
                    continue
                case += 1
                xs = [data(r, case, n, dtype) for r in range(world)]
                x = xs[rank].clone()
                work = dist.all_reduce(x, op=op, async_op=bool(case % 2))
                if case % 2:
                    check(work.is_completed() or not isinstance(work, sd.Work), ("async work completed", type(work), dtype, n, op))
                    check(work.wait(), "wait returns True")
                    check(work.get_future().value()[0].data_ptr() == x.data_ptr(), "the future holds the tensor")
                want = reference(op, xs)
                tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) and op == R.AVG else 0
                check(torch.allclose(x.to(torch.complex128 if dtype.is_complex else torch.float64),
                                     want.to(torch.complex128 if dtype.is_complex else torch.float64),
                                     rtol=tol, atol=tol), ("all_reduce", dtype, n, op, x[:4], want[:4]))
            case += 1
            xs = [data(r, case, n, dtype) for r in range(world)]
            root = case % world
            b = xs[rank].clone()
            dist.broadcast(b, src=root)
            check(torch.equal(b, xs[root]), ("broadcast", dtype, n))
            case += 1
            xs = [data(r, case, n, dtype) for r in range(world)]
            outs = [torch.empty_like(xs[0]) for _ in range(world)]
            dist.all_gather(outs, xs[rank])
            check(all(torch.equal(o, x) for o, x in zip(outs, xs)), ("all_gather", dtype, n))
            big = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(big, xs[rank])
            check(torch.equal(big, torch.cat(xs)), ("all_gather_into_tensor", dtype, n))
            case += 1
            xs = [data(r, case, n * world, dtype) for r in range(world)]
            a2a = torch.empty(n * world, dtype=dtype)
            dist.all_to_all_single(a2a, xs[rank])
            want = torch.cat([x[rank * n:(rank + 1) * n] for x in xs])
            check(torch.equal(a2a, want), ("all_to_all_single", dtype, n))
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, list(xs[rank].split(n)))
            check(torch.equal(torch.cat(outs), want), ("all_to_all", dtype, n))
            if dtype.is_complex or dtype == torch.float64:
                continue
            for op in (R.SUM, R.MAX, R.MIN):
                case += 1
                xs = [data(r, case, n * world, dtype) for r in range(world)]
                rs = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(rs, xs[rank], op=op)
                check(torch.equal(rs, reference(op, xs)[rank * n:(rank + 1) * n]), ("reduce_scatter", dtype, n, op))
                outs = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(outs, list(xs[rank].split(n)), op=op)
                check(torch.equal(outs, rs), ("reduce_scatter list", dtype, n, op))
                case += 1
                xs = [data(r, case, n, dtype) for r in range(world)]
                y = xs[rank].clone()
                root = case % world
                dist.reduce(y, dst=root, op=op)
                # torch defines the result on the root only (gloo writes partial sums elsewhere)
                check(rank != root or torch.equal(y, reference(op, xs)), ("reduce", dtype, n, op))
                check(rank == root or dtype not in sd.collectives.COMPUTE_DTYPES or torch.equal(y, xs[rank]),
                      ("stratac's reduce leaves the other ranks' tensors as they were", dtype, n, op))
    # unequal splits: rank r sends (p + r) % 3 rows of 5 to rank p
    for dtype in (torch.float32, torch.int64, torch.uint8):
        case += 1
        send = [[(p + r) % 3 for p in range(world)] for r in range(world)]
        xs = [data(r, case, sum(send[r]) * 5, dtype).view(-1, 5) for r in range(world)]
        recv = [send[s][rank] for s in range(world)]
        out = torch.empty(sum(recv), 5, dtype=dtype)
        dist.all_to_all_single(out, xs[rank], recv, send[rank])
        want = torch.cat([xs[s].split(send[s])[rank] for s in range(world)])
        check(torch.equal(out, want), ("all_to_all_single splits", dtype))
        outs = [torch.empty(send[s][rank] * 5, dtype=dtype) for s in range(world)]
        dist.all_to_all(outs, [t.reshape(-1) for t in xs[rank].split(send[rank])])
        check(torch.equal(torch.cat(outs), want.reshape(-1)), ("all_to_all lists", dtype))
    dist.barrier()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "name": "x" * rank})
    check(objs == [{"rank": r, "name": "x" * r} for r in range(world)], objs)
    st = sd.stats()
    check(st["kernels"]["all_reduce"] > 0 and "allreduce float64: ReduceOp.SUM: the kernels reduce float32, "
          "float16, bfloat16 and int32 only" not in st["fallback"], st)
    fell = st["fallback"]
    check(all(("float64" in k or "int64" in k or "uint8" in k or "complex" in k or "PRODUCT" in k)
              for k in fell), ("only what no kernel reduces falls back", fell))


def subgroups(rank, world):
    """Groups side by side: the world, a pair, the world given in reverse order (torch sorts a
    group's ranks); each its own communicator; calls alternate between them."""
    pair = dist.new_group([0, 1])
    rev = dist.new_group(list(reversed(range(world))))
    for it in range(6):
        x = torch.full((100 + it,), float(rank + 1))
        dist.all_reduce(x)
        check(bool((x == world * (world + 1) / 2).all()), ("world", it))
        if rank < 2:
            y = torch.full((7,), float(rank + it))
            dist.all_reduce(y, group=pair, op=R.MAX)
            check(bool((y == 1 + it).all()), ("pair", it, y))
        z = [torch.empty(3) for _ in range(world)]
        dist.all_gather(z, torch.full((3,), float(rank)), group=rev)
        check(all(bool((t == g).all()) for g, t in enumerate(z)), ("reversed", it, z))
        b = torch.full((4,), float(rank))
        dist.broadcast(b, src=world - 1, group=rev)
        check(bool((b == world - 1).all()), ("broadcast in reversed", b))


def zero_copy(rank, world):
    """A tensor of stratac.distributed.empty is run on as it is: no staging bytes."""
    x = sd.empty(4096)
    before = sd.stats()
    for it in range(3):
        x.fill_(rank + it)
        dist.all_reduce(x)
        check(bool((x == sum(r + it for r in range(world))).all()), it)
    after = sd.stats()
    check(after["zero_copy"].get("all_reduce", 0) - before["zero_copy"].get("all_reduce", 0) == 3, after)
    check(after["staged_bytes"].get("all_reduce", 0) == before["staged_bytes"].get("all_reduce", 0), after)
    out = sd.empty(world, 4096)
    dist.all_gather_into_tensor(out, x)
    check(bool((out == x).all()), "gathered")
    sd.free(out)
    sd.free(x)
    for it in range(2):         # a new tensor where a freed one was: the call takes the new one
        z = sd.empty(4096)
        z.fill_(it + rank)
        dist.all_reduce(z)
        check(bool((z == sum(it + r for r in range(world))).all()), ("after free", it))
        sd.free(z)
    y = torch.ones(10)                          # not on the heap: staged, counted
    dist.all_reduce(y)
    check(sd.stats()["staged_bytes"]["all_reduce"] >= 80, sd.stats())


def fallback_error(rank, world):
    """STRATAC_FALLBACK=error: a call no schedule takes is refused by name, on every rank."""
    expect_error(StrataUsageError, "allreduce of float64 has no stratac schedule (ReduceOp.PRODUCT",
                 dist.all_reduce, torch.ones(3, dtype=torch.float64), op=R.PRODUCT)
    expect_error(StrataUsageError, "send of float32 has no stratac schedule", dist.send, torch.ones(2),
                 dst=(rank + 1) % world)
    x = torch.ones(3)
    dist.all_reduce(x)                          # and what has a schedule still runs
    check(bool((x == world).all()), x)
    check(not sd.stats()["fallback"], sd.stats())


def bad_input(rank, world):
    """Arguments that cannot be right are refused by name on every rank, nothing written, and the
    group goes on working."""
    x = torch.ones(6)
    expect_error(StrataUsageError, f"the output list has {world + 1} tensors; the group has {world} ranks",
                 dist.all_gather, [torch.empty(6) for _ in range(world + 1)], x)
    expect_error(StrataUsageError, "output block 1 is torch.float32 of 5 elements",
                 dist.all_gather, [torch.empty(6), torch.empty(5)] + [torch.empty(6)] * (world - 2), x)
    big = torch.zeros(world * 6 + 1)
    expect_error(StrataUsageError, f"it must hold world x input = {world} x 6", dist.all_gather_into_tensor, big, x)
    check(bool((big == 0).all()), "nothing written")
    expect_error(StrataUsageError, "the output is torch.float16 and the input torch.float32",
                 dist.all_gather_into_tensor, torch.empty(world * 6, dtype=torch.float16), x)
    expect_error(StrataUsageError, "input_split_sizes [1] must have",
                 dist.all_to_all_single, torch.empty(world), torch.ones(world), [1] * world, [1])
    # split sizes that disagree between ranks: rank 0 splits unequally where its peers split
    # equally, so it calls another schedule than they do: every rank is refused, naming both calls
    send = [1] * world
    recv = [2] + [1] * (world - 2) + [0] if rank == 0 else [1] * world
    out = torch.full((world, 1), -1.0)
    expect_error(StrataUsageError, "the ranks made different calls", dist.all_to_all_single, out,
                 torch.ones(world, 1), recv, send)
    check(bool((out == -1).all()), "nothing written")
    # every rank splits unequally, and rank 0's output sizes are not what the others send it: the
    # counts the ranks exchanged say so on rank 0
    send = [2] + [1] * (world - 1)
    recv = [3] + [2] * (world - 2) + [1] if rank == 0 else [1] * world
    out = torch.empty(sum(recv), 1)
    if rank == 0:
        expect_error(StrataUsageError, f"rank 0 expected {recv} rows from the ranks",
                     dist.all_to_all_single, out, torch.ones(sum(send), 1), recv, send)
    else:
        dist.all_to_all_single(out, torch.ones(sum(send), 1), recv, send)
    # a symmetric tensor at other heap offsets on different ranks (one rank's on the heap, the
    # other's staged): the ranks' agreement refuses the call on every rank, nothing written
    own = sd.empty(16)
    own.fill_(rank + 5)
    mine = own if rank == 0 else torch.full((16,), float(rank + 5))
    expect_error(StrataUsageError, "on symmetric tensors at different heap offsets", dist.broadcast, mine, src=0)
    check(bool((mine == rank + 5).all()), "nothing written")
    sd.free(own)
    # a rank that sends no rows at all (its input [0, 3]); blocks that differ between ranks in the
    # list form; the same call of each again, right
    send = [0] * world if rank == 0 else [1] * world
    recv = [0] + [1] * (world - 1)
    for _ in range(2):
        out = torch.full((sum(recv), 3), -1.0)
        dist.all_to_all_single(out, torch.full((sum(send), 3), float(rank)), recv, send)
        check(torch.equal(out, torch.cat([torch.full((recv[s], 3), float(s)) for s in range(world)])), out)
        outs = [torch.empty(2 + s) for s in range(world)]
        dist.all_to_all(outs, [torch.full((2 + rank,), float(rank * 10 + p)) for p in range(world)])
        check(all(torch.equal(o, torch.full((2 + s,), float(s * 10 + rank))) for s, o in enumerate(outs)), outs)
    # a tensor of a device the backend does not serve: torch's dispatcher names the device
    expect_error(RuntimeError, "meta", dist.all_reduce, torch.empty(3, device="meta"))
    y = torch.full((5,), float(rank))
    dist.all_reduce(y)
    check(bool((y == world * (world - 1) / 2).all()), y)


def unwaited(rank, world):
    """Async work never waited on, then the group destroyed: every rank is told which calls."""
    x = torch.ones(8)
    work = dist.all_reduce(x, async_op=True)            # noqa: F841 (never waited on, on purpose)
    done = dist.all_reduce(torch.ones(2), async_op=True)
    done.wait()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.destroy_process_group()
    said = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    check(len(said) == 1 and f"rank {rank}: the process group was destroyed with 1 async_op work(s) never "
          "waited on: allreduce" in said[0], said)
    check(bool((x == world).all()), "its result is complete on the CPU target")


def unequal_calls(rank, world):
    """A rank that does not call: its peer's call fails within the group's timeout, naming it, at
    a group's first call (the heap's bootstrap) and at a later one (a kernel's barrier); a group
    whose heap could not be set up refuses its later calls with the first error."""
    sub = dist.new_group(list(range(world)), timeout=timedelta(seconds=4))   # a group's own timeout
    x = torch.ones(4)
    dist.all_reduce(x, group=sub)
    check(bool((x == world).all()), x)
    if rank != 0:
        time.sleep(12)      # alive, not calling: rank 0's waits time out (not "rank 1 is gone")
        return

    def lonely(what, group, pattern):
        try:
            dist.all_reduce(torch.ones(8), group=group)
        except StrataRuntimeError as exc:
            check(re.search(pattern, str(exc)), (what, str(exc)))
        else:
            raise Failed(f"{what}: a call rank 1 never made completed on rank 0")
    lonely("first call", None, r"store barrier 1 timed out after 4.0 s: 1 of 2 ranks arrived; not arrived: 1$")
    lonely("the same group again", None, r"could not be set up .*not arrived: 1")
    lonely("later call", sub, r"ranks that have not arrived at this barrier: 1\b")


def user_schedule(rank, world):
    """stratac.distributed.use(FILE): the file's schedules run the contracts it implements."""
    pg = dist.distributed_c10d._get_default_group()
    x = torch.full((300,), float(rank))
    dist.all_reduce(x)
    check(bool((x == world * (world - 1) / 2).all()), x)
    check(pg._group.selector(sd.collectives.ir.ContractKind.ALLREDUCE).last == "allreduce_ring", "ring ran")


def explicit_store(rank, world):
    """init_process_group("cpu:stratac", store=...): a device map and a store of the caller's."""
    pg = dist.distributed_c10d._get_default_group()
    check(dist.get_backend() == "cpu:stratac" or "stratac" in dist.get_backend(), dist.get_backend())
    check(isinstance(pg, sd.ProcessGroup), type(pg))
    x = torch.full((33,), float(rank + 1))
    dist.all_reduce(x)
    check(bool((x == world * (world + 1) / 2).all()), x)


SCENARIOS = {f.__name__: f for f in (collectives, subgroups, zero_copy, fallback_error, bad_input, unequal_calls,
                                     user_schedule, unwaited, explicit_store)}


def main(scenario, rank, world, store_path):
    timeout = timedelta(seconds=4 if scenario == "unequal_calls" else 60)
    if scenario == "user_schedule":
        sd.use(Path(__file__).resolve().parents[2] / "examples" / "allreduce_ring.strata")
    if scenario == "explicit_store":
        dist.init_process_group("cpu:stratac", store=dist.FileStore(store_path, world), rank=rank,
                                world_size=world, timeout=timeout)
    else:
        dist.init_process_group("stratac", init_method=f"file://{store_path}", rank=rank, world_size=world,
                                timeout=timeout)
    SCENARIOS[scenario](rank, world)
    if scenario not in ("unequal_calls", "unwaited"):
        dist.destroy_process_group()
    print("STATS " + json.dumps(sd.stats()), flush=True)
    print(f"PASS {scenario}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
