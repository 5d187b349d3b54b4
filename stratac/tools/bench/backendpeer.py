"""`stratac bench --vs backend`: the collectives called through torch.distributed over a process group
of backend "stratac" (stratac.distributed), against the direct call of the entry point that backend
runs, in stratac's rank processes: the backend's own cost per call, measured in one run.

In: the bench's peer spec (the tasks of each case, iterations) in a stratac rank. Out: three result
records per task (rank 0's; the worker prints them as result lines), one per *variant*:

    direct     the backend group's own Selector (stratac.distributed.collectives.Group.selector: the
               library's schedules of that contract, picked per size with this machine's table),
               called as the backend calls it, on tensors of the group's heap
    zero-copy  dist.all_reduce(x, group=pg) etc., x from stratac.distributed.empty (the same tensors
               as direct)
    staged     the same call with plain torch tensors, which the backend copies into its staging
               area on the heap and back

The three run on one process group, interleaved call by call (each timed iteration calls each
variant once, the first one rotating), so that load on the machine falls on all three alike; the
time of a variant is, as everywhere in the bench, the median over the timed calls of each call's
slowest rank. Every variant's result is checked before and after its timed calls against the
reference benchpeer computes (small integers, float64), and every dist call must have run on a
stratac kernel: the group runs with STRATAC_FALLBACK=error, and the backend's counters
(stratac.distributed.stats) give the bytes each call staged.

The process group is made at the first case (dist.new_group(backend="stratac") beside the worker's
gloo group and communicator: several communicators per process are supported), with a heap sized
for the largest case (STRATAC_HEAP_BYTES, heap_bytes below); destroy_process_group at the worker's
end releases it.

Imported only by the rank worker (stratac.tools.run.worker), when "backend" is among the peers;
benchpeer.after_case calls it between gloo and the MPI job's turn.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from stratac.tools.bench import benchpeer

VARIANTS = ("direct", "zero-copy", "staged")
DIST_NAMES = {"allreduce": "dist.all_reduce", "allgather": "dist.all_gather_into_tensor",
              "reducescatter": "dist.reduce_scatter_tensor", "broadcast": "dist.broadcast",
              "reduce": "dist.reduce", "alltoall": "dist.all_to_all_single"}
MARGIN = 16 << 20   # heap beyond the buffers: alignment, the selector's in-place buffers


def heap_bytes(tasks: list[list[dict]], elem: int) -> int:
    """The backend group's heap per rank: half staging (the backend's, heap // 2), half the
    zero-copy tensors and what the selector keeps, each room for twice the largest call's input
    plus output, rounded up to MiB."""
    need = max([(t["in_numel"] + (t["out_numel"] or 0)) * elem for ts in tasks for t in ts] or [0])
    total = 4 * need + MARGIN
    return (total + (1 << 20) - 1) >> 20 << 20


class BackendPeer:
    """One rank's process group of backend stratac and the measurement of each task on it."""

    def __init__(self, bench: dict, rank: int, world: int, corrupt):
        import torch.distributed as dist

        import stratac.distributed  # noqa: F401 (registers the backend)
        from stratac.distributed import collectives

        self.rank, self.world, self.corrupt = rank, world, corrupt
        self.iters, self.warmup = bench["iters"], bench["warmup"]
        self.stats = collectives.STATS
        # a call no schedule takes would run on gloo: refused instead, so every row is a kernel's
        os.environ["STRATAC_FALLBACK"] = "error"
        os.environ["STRATAC_HEAP_BYTES"] = str(bench["backend_heap"])
        self.pg = dist.new_group(backend="stratac", timeout=timedelta(seconds=bench["timeout"]))

    def measure(self, task: dict) -> list[dict]:
        """The three variants of one task; rank 0 returns their records, the others []."""
        import torch
        import torch.distributed as dist

        import stratac.distributed as sd
        from stratac import ir
        from stratac.host.errors import StrataUsageError

        pg, rank, world = self.pg, self.rank, self.world
        kind, root = task["kind"], task["root"]
        dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                 "i32": torch.int32}[task["dtype"]]
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[task["op"]]
        op = task["op"]
        n_in, n_out = task["in_numel"], task["out_numel"]
        heap_x = sd.empty(n_in, dtype=dtype, group=pg)
        heap_out = sd.empty(n_out, dtype=dtype, group=pg) if n_out is not None else None
        plain_x = torch.empty(n_in, dtype=dtype)
        plain_out = torch.empty(n_out, dtype=dtype) if n_out is not None else None
        sel = pg._group.selector(ir.ContractKind(kind))   # the very entry point the backend calls
        comm = pg._group.comm

        def direct(x, out):
            return {"allreduce": lambda: sel(x, op=op), "allgather": lambda: sel(x, out),
                    "reducescatter": lambda: sel(x, out, op=op), "broadcast": lambda: sel(x, root=root),
                    "reduce": lambda: sel(x, op=op, root=root), "alltoall": lambda: sel(x, out)}[kind]

        def through_dist(x, out):
            return {"allreduce": lambda: dist.all_reduce(x, op=red, group=pg),
                    "allgather": lambda: dist.all_gather_into_tensor(out, x, group=pg),
                    "reducescatter": lambda: dist.reduce_scatter_tensor(out, x, op=red, group=pg),
                    "broadcast": lambda: dist.broadcast(x, src=root, group=pg),
                    "reduce": lambda: dist.reduce(x, dst=root, op=red, group=pg),
                    "alltoall": lambda: dist.all_to_all_single(out, x, group=pg)}[kind]

        def synced(call):   # as the bench times its own calls: the call, then the device's stream
            def run():
                call()
                comm.synchronize()
            return run

        bufs = {"direct": (heap_x, heap_out), "zero-copy": (heap_x, heap_out), "staged": (plain_x, plain_out)}
        calls = {"direct": synced(direct(heap_x, heap_out)),
                 "zero-copy": synced(through_dist(heap_x, heap_out)),
                 "staged": synced(through_dist(plain_x, plain_out))}

        def checked(v: str) -> tuple[int, dict]:
            """One call of variant v on fresh inputs: (1 if wrong on this rank, what it did)."""
            x, out = bufs[v]
            benchpeer.fill_input(x, task, rank, lambda a: torch.from_numpy(a).to(dtype))
            dist.barrier()   # every rank's input written before any rank's kernel reads it
            before = self.stats.as_dict()
            calls[v]()
            after = self.stats.as_dict()
            got = out if out is not None else x
            self.corrupt({f"backend-{v}": got}, rank)
            wrong = int(not benchpeer.check_output(got, task, rank, world,
                                                   lambda t: t.to(torch.float64).numpy()))
            dist.barrier()   # every rank done reading before the next call's inputs are written
            delta = {k: sum(after[k].values()) - sum(before[k].values())
                     for k in ("kernels", "zero_copy", "staged_bytes")}
            return wrong, {"picked": sel.last, **delta}

        note = ""
        wrong = dict.fromkeys(VARIANTS, 0)
        did: dict[str, dict] = {}
        times = {v: [float("nan")] * max(1, self.iters) for v in VARIANTS}
        try:
            for v in VARIANTS:
                wrong[v], did[v] = checked(v)
            times = _interleaved(calls, dist.barrier, self.iters, self.warmup)
            for v in VARIANTS:   # still right after back-to-back calls
                w, _ = checked(v)
                wrong[v] = max(wrong[v], w)
        except StrataUsageError as exc:   # e.g. a dtype no kernel takes: said, not measured
            note = str(exc).strip().splitlines()[0][:160]
        for v in VARIANTS:
            d = did.get(v)
            if d is not None and v != "direct" and d["kernels"] != 1:
                note = note or f"{v}: the call ran {d['kernels']} stratac kernels, expected 1"
        if heap_out is not None:
            sd.free(heap_out, group=pg)
        sd.free(heap_x, group=pg)
        # each call's slowest rank, per variant; the ranks' wrong counts; whether any rank failed
        per_call = torch.tensor([times[v] for v in VARIANTS], dtype=torch.float64)
        dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
        flags = torch.tensor([wrong[v] for v in VARIANTS] + [1.0 if note else 0.0], dtype=torch.float64)
        dist.all_reduce(flags)
        if rank != 0:
            return []
        failed = flags[-1] > 0
        out = []
        for i, v in enumerate(VARIANTS):
            name = f"select:{kind}" if v == "direct" else DIST_NAMES[kind]
            d = did.get(v, {})
            if failed:
                rec = benchpeer._record("backend", task, world, None, None,
                                        note or "failed on another rank", name)
            else:
                rec = benchpeer._record("backend", task, world, float(per_call[i].median()),
                                        int(flags[i]), name=name)
            rec.update({"variant": v, "picked": d.get("picked"),
                        "staged_bytes": d.get("staged_bytes"), "zero_copy": bool(d.get("zero_copy")),
                        "ok": not failed and int(flags[i]) == 0,
                        "why": note if failed else (f"{name} ({v}): {int(flags[i])} ranks differed "
                                                    "from the reference" if int(flags[i]) else "")})
            out.append(rec)
        return out


def _interleaved(calls: dict, barrier, iters: int, warmup: int) -> dict[str, list[float]]:
    """This rank's time of each call of each variant: `warmup` untimed rounds, a barrier, then
    `iters` rounds of one call of each variant back to back, the first variant rotating."""
    names = list(calls)
    for _ in range(warmup):
        for v in names:
            calls[v]()
    barrier()
    out: dict[str, list[float]] = {v: [] for v in names}
    for i in range(max(1, iters)):
        for j in range(len(names)):
            v = names[(i + j) % len(names)]
            t0 = time.perf_counter()
            calls[v]()
            out[v].append(time.perf_counter() - t0)
    return out


_PEER: BackendPeer | None = None


def tasks_of_case(bench: dict, index: int, rank: int, world: int, corrupt) -> list[dict]:
    """The backend records of case `index` (rank 0's; [] on the others). The first call makes the
    process group: collective, like every call here. corrupt: the worker's test hook
    (STRATAC_TEST_CORRUPT, tests/README.md), applied to each variant's result named backend-direct,
    backend-zero-copy or backend-staged, so that a test can show a wrong result is called wrong."""
    global _PEER
    if _PEER is None:
        _PEER = BackendPeer(bench, rank, world, corrupt)
    out = []
    for task in bench["tasks"][index]:
        out += _PEER.measure(task)
    return out
