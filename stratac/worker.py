"""One rank of `stratac run`: started by stratac.runner as `python -m stratac.worker SPEC`.

Bootstraps torch.distributed (gloo) from the file store the runner made, builds a Communicator
(the same public API users call), runs every schedule of the file on heap tensors, checks the
results against torch, and prints one JSON line per schedule (prefix RESULT_PREFIX).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

RESULT_PREFIX = "STRATAC-RESULT "


def main(spec_text: str) -> int:
    spec = json.loads(spec_text)
    import torch
    import torch.distributed as dist

    from . import passes
    from .comm import Communicator, StrataRuntimeError, StrataUsageError
    from .diagnostics import StrataError

    torch.set_num_threads(1)
    rank, world = spec["rank"], spec["world"]
    dist.init_process_group("gloo", init_method=f"file://{spec['store']}", rank=rank,
                            world_size=world,
                            # host collectives outlast every kernel wait, so the diagnosis of a stuck
                            # wait (which rank, which flag) is what reports a hang, not gloo
                            timeout=timedelta(seconds=2 * spec["timeout"] + 30))
    comm = None
    clean = False
    try:
        comm = Communicator.from_process_group(heap_bytes=spec["heap_bytes"], timeout=spec["timeout"],
                                               segment=spec["segment"])
        opts = passes.Options(soc=spec["soc"], cores=spec["cores"])
        mod = comm.load(spec["file"], options=opts)
        bench = spec.get("bench")   # `stratac bench`: peers measured between cases (benchpeer)
        if bench:
            from . import benchpeer
            benchpeer.before_cases(bench)
        for i, case in enumerate(spec["cases"]):
            for name, fn in mod.schedules.items():
                result = _run_case(comm, fn, case, spec, rank, world)
                print(RESULT_PREFIX + json.dumps(result), flush=True)
            for rec in benchpeer.after_case(bench, i, rank, world) if bench else ():
                print(RESULT_PREFIX + json.dumps(rec), flush=True)
        clean = True
        return 0
    except StrataError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 2
    except (StrataRuntimeError, StrataUsageError) as exc:
        print(f"rank {rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    except RuntimeError as exc:  # torch.distributed: a peer went away or a collective timed out
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"rank {rank}: the job's bootstrap or a host collective failed ({_peer_state(comm)}): "
              f"{first}", file=sys.stderr, flush=True)
        return 1
    finally:
        if comm is not None:
            # after a failure the peers may be gone: no collective barrier, the runner unlinks
            comm.close(collective=clean)
        if clean:
            dist.destroy_process_group()


def _peer_state(comm) -> str:
    """Why a host collective probably failed, as far as the heap can tell."""
    try:
        if comm is not None:
            if comm._lib.strata_cpu_aborted():
                msg = comm._ffi.string(comm._lib.strata_cpu_abort_message()).decode(errors="replace")
                return f"the job was aborted: {msg.splitlines()[0] if msg else '?'}"
            dead = comm.dead_rank()
            if dead is not None:
                return dead[1]
    except Exception:   # noqa: BLE001 - only a diagnosis
        pass
    return "a peer probably stopped first"


def _run_case(comm, fn, case: dict, spec: dict, rank: int, world: int) -> dict:
    """One schedule at one dtype and size: a checked call, timed calls, a second checked call."""
    import torch
    import torch.distributed as dist

    from .ir import DType
    from .workload import Workload

    s = fn.ir
    dtype = DType.parse(case["dtype"])
    tdtype = getattr(torch, dtype.torch_name)
    if case.get("count") is not None:
        count = case["count"]
    else:
        count = Workload.count_for_bytes(s, world, case["size"], dtype.nbytes)
    wl = Workload(s, world, count, op=case.get("op") or "sum", root=case.get("root") or 0)
    heap_before = comm.heap_used
    tensors = {p.name: comm.empty(wl.numel(p), dtype=tdtype) for p in s.tensors}
    args = dict(tensors, **wl.scalars)
    blocks = spec["cores"] or s.kernel.cores

    def checked(seed: int) -> tuple[bool, str]:
        wl.fill(tensors, rank, seed)
        comm.barrier()
        fn(**args, cores=blocks)
        for p in s.tensors:
            want = wl.expected(p.name, rank, seed, tdtype)
            if want is None:
                continue
            got = tensors[p.name]
            if not torch.equal(got, want):
                bad = (got != want).nonzero()
                i = int(bad[0]) if bad.numel() else -1
                return False, (f"{p.name}[{i}] = {got[i].item()} on rank {rank}, expected "
                               f"{want[i].item()} ({bad.numel()} elements differ)")
        return True, ""

    comm.reset_counters()
    ok, why = checked(spec["seed"])
    counters = comm.counters()
    heap_bytes = comm.heap_used   # after the first call: includes a staging baseline's scratch
    for _ in range(spec["warmup"]):
        fn(**args, cores=blocks)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(spec["iters"]):
        fn(**args, cores=blocks)
    elapsed = (time.perf_counter() - t0) / max(1, spec["iters"])
    comm.barrier()
    if (spec.get("bench") or {}).get("trace"):   # `stratac bench --trace`: one more call, recorded
        from . import benchpeer
        benchpeer.traced_call(comm, lambda: fn(**args, cores=blocks), spec["bench"]["trace"],
                              f"{s.name} {wl.size_bytes(dtype.nbytes)} B", rank)
    if ok:  # still correct after back-to-back calls (flag epochs)
        ok, why = checked(spec["seed"] + 1)
    t = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    flags = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(flags)
    for p in reversed(s.tensors):
        comm.free(tensors[p.name])
    fn.release_scratch()
    return {
        "schedule": s.name, "rank": rank, "world": world, "dtype": dtype.short,
        "op": wl.reduce_op if s.contract.op else None, "root": wl.root if s.rank_params else None,
        "count": count, "size": wl.size_bytes(dtype.nbytes), "time_s": float(t.item()),
        "busbw_factor": wl.busbw_factor(), "ok": ok, "why": why,
        "ranks_wrong": int(flags.item()), "cores": blocks, "counters": counters,
        "heap_bytes": heap_bytes, "heap_user_bytes": heap_bytes - heap_before,
    }


if __name__ == "__main__":
    status = main(sys.argv[1])
    # everything is released in main's finally; skip the interpreter's teardown of torch (about
    # half a second of CPU per rank, which the runner would wait for)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
