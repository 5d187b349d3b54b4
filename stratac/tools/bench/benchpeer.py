"""The peers of `stratac bench`: the same collective measured with torch.distributed (gloo) and with
MPI (mpi4py), interleaved with stratac's own measurement at every size.

In: the bench's peer spec (the tasks of each case, the gate's directory, iterations), in a stratac
rank or in the MPI job. Out: one result record per peer collective and case (gloo's go out through
the worker's result lines, MPI's as STRATAC-PEER lines on the job's stdout), and the gate's marks.

gloo runs inside stratac's rank processes (stratac.tools.run.worker already holds a gloo process
group), right after the stratac schedules of a case. MPI runs as its own job under mpirun
(`python -m stratac.tools.bench.benchpeer SPEC`, started by mpi.MpiJob). The two jobs take turns
through a *gate*, a directory of marker files: stratac measures case i and marks `stratac-i`; the
MPI ranks, which wait for that mark, measure case i and mark `mpi-i`; stratac waits for that before
case i+1. So no two systems ever measure at the same time, and the waiting side sleeps (it polls a
file every few ms).

Every peer measurement is checked once: inputs are small integers, the expected result is
computed in float64 with numpy, and `errors` counts the ranks whose result differed.

The ranks import it and the MPI job runs it: it imports no other stratac module, and torch only in
gloo_task, so that the MPI job needs neither the compiler nor torch (--vs backend, the
torch.distributed backend "stratac" measured in the same ranks, is backendpeer, which the worker
imports and hands to after_case).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PEER_PREFIX = "STRATAC-PEER "      # the MPI job's result lines
RESULT_PREFIX = "STRATAC-RESULT "  # = worker.RESULT_PREFIX (gloo lines go out through the worker)

KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")

# what each system calls the collective (reported in the JSON as the peer's `schedule`)
GLOO_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather_into_tensor",
              "reducescatter": "reduce_scatter_tensor", "broadcast": "broadcast", "reduce": "reduce",
              "alltoall": "all_to_all_single"}
MPI_NAMES = {"allreduce": "MPI_Allreduce", "allgather": "MPI_Allgather",
             "reducescatter": "MPI_Reduce_scatter_block", "broadcast": "MPI_Bcast",
             "reduce": "MPI_Reduce", "alltoall": "MPI_Alltoall"}


# ---- the gate: turn-taking between the stratac job and the MPI job

class Gate:
    ABORT = "abort"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def mark(self, name: str, text: str = "") -> None:
        tmp = self.path / f".{name}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, self.path / name)

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def wait(self, name: str, timeout: float) -> bool:
        """True once `name` is marked; False on abort or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while not self.has(name):
            if self.has(self.ABORT) or time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return True


# ---- inputs and references (numpy, so the MPI job needs neither torch nor the compiler), computed
# in chunks from a closed form: rank r's input element i is ((5i + 3r + 1) mod 17) - 8, so a
# 256 MiB check costs a few MiB of memory, not world copies of the buffer

CHUNK = 1 << 20


def _val(r, i):
    return ((i * 5 + r * 3 + 1) % 17) - 8


def peer_input(task: dict, rank: int, lo: int = 0, hi: int | None = None):
    """Elements [lo, hi) of `rank`'s input, float64."""
    import numpy as np
    hi = task["in_numel"] if hi is None else hi
    return _val(rank, np.arange(lo, hi, dtype=np.int64)).astype(np.float64)


def peer_expected(task: dict, rank: int, world: int, lo: int = 0, hi: int | None = None):
    """Elements [lo, hi) of the reference result on `rank` (float64), or None where the contract
    says nothing."""
    import numpy as np
    kind, root = task["kind"], task["root"]
    out_numel = task["out_numel"] if task["out_numel"] is not None else task["in_numel"]
    hi = out_numel if hi is None else hi
    j = np.arange(lo, hi, dtype=np.int64)

    def red(i):
        acc = _val(0, i)
        for r in range(1, world):
            v = _val(r, i)
            acc = {"sum": acc + v, "max": np.maximum(acc, v), "min": np.minimum(acc, v)}[task["op"]]
        return acc.astype(np.float64)

    if kind == "allreduce":
        return red(j)
    if kind == "allgather":
        n = task["in_numel"]
        return _val(j // n, j % n).astype(np.float64)
    if kind == "reducescatter":
        return red(rank * task["out_numel"] + j)
    if kind == "broadcast":
        return _val(root, j).astype(np.float64)
    if kind == "reduce":
        return red(j) if rank == root else None
    m = task["in_numel"] // world   # alltoall: block p of my output is block `rank` of p's input
    return _val(j // m, rank * m + j % m).astype(np.float64)


def fill_input(x, task: dict, rank: int, convert) -> None:
    """x[:] = rank's input, chunk by chunk; convert(float64 chunk) -> x's element type."""
    for lo in range(0, task["in_numel"], CHUNK):
        hi = min(lo + CHUNK, task["in_numel"])
        x[lo:hi] = convert(peer_input(task, rank, lo, hi))


def check_output(got, task: dict, rank: int, world: int, to_f64) -> bool:
    """True if `got` (the output buffer) equals the reference; to_f64(chunk) -> float64 array."""
    import numpy as np
    for lo in range(0, len(got), CHUNK):
        hi = min(lo + CHUNK, len(got))
        want = peer_expected(task, rank, world, lo, hi)
        if want is None:
            return True
        if not np.array_equal(to_f64(got[lo:hi]), want):
            return False
    return True


def _timed(call, barrier, iters: int, warmup: int) -> list[float]:
    """This rank's time of each of `iters` back-to-back calls, after `warmup` calls and a barrier
    (the median over calls of the slowest rank's time is what is reported, as for stratac)."""
    for _ in range(warmup):
        call()
    barrier()
    out = []
    for _ in range(max(1, iters)):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _record(system: str, task: dict, world: int, time_s: float | None, errors: int | None,
            note: str = "", name: str | None = None) -> dict:
    return {"system": system, "kind": task["kind"], "world": world, "dtype": task["dtype"],
            "op": task["op"], "root": task["root"], "count": task["in_numel"], "size": task["size"],
            "busbw_factor": task["busbw_factor"], "time_s": time_s, "errors": errors, "note": note,
            "case": task["case"],
            "schedule": name or (GLOO_NAMES if system == "gloo" else MPI_NAMES)[task["kind"]],
            # the keys stratac.tools.run.runner reads from every result line
            "rank": 0, "ok": True, "why": ""}


# ---- gloo, inside stratac's rank processes

def gloo_task(task: dict, rank: int, world: int, iters: int, warmup: int) -> dict | None:
    """Measures one collective with torch.distributed on the worker's gloo process group; returns
    rank 0's record (None on the other ranks)."""
    import torch
    import torch.distributed as dist

    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
             "i32": torch.int32}[task["dtype"]]
    kind, root = task["kind"], task["root"]
    op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[task["op"]]
    x = torch.empty(task["in_numel"], dtype=dtype)
    out = torch.empty(task["out_numel"], dtype=dtype) if task["out_numel"] is not None else None
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    call = {
        "allreduce": lambda: dist.all_reduce(x, op=op),
        "allgather": lambda: gather(out, x),
        "reducescatter": lambda: scatter(out, x, op=op),
        "broadcast": lambda: dist.broadcast(x, src=root),
        "reduce": lambda: dist.reduce(x, dst=root, op=op),
        "alltoall": lambda: dist.all_to_all_single(out, x),
    }[kind]
    note = ""
    try:
        fill_input(x, task, rank, lambda a: torch.from_numpy(a).to(dtype))
        call()
        got = out if out is not None else x
        wrong = int(not check_output(got, task, rank, world, lambda t: t.to(torch.float64).numpy()))
        calls = _timed(call, dist.barrier, iters, warmup)
    except RuntimeError as exc:   # gloo refuses a dtype or an op: say which, keep going
        wrong, calls = 0, [float("nan")] * max(1, iters)
        note = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
    per_call = torch.tensor(calls, dtype=torch.float64)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)   # each call's slowest rank
    flags = torch.tensor([float(per_call.median()), wrong, 1.0 if note else 0.0], dtype=torch.float64)
    dist.all_reduce(flags[1:])
    if rank != 0:
        return None
    used = {"allgather": gather, "reducescatter": scatter}.get(kind)
    name = getattr(used, "__name__", None)   # all_gather_single, or the older name where it lacks it
    if flags[2] > 0:
        return _record("gloo", task, world, None, None, note or "failed on another rank", name)
    return _record("gloo", task, world, float(flags[0]), int(flags[1]), name=name)


def after_case(bench: dict, index: int, rank: int, world: int, more=None) -> list[dict]:
    """Called by stratac.tools.run.worker after the stratac schedules of case `index`: the gloo
    measurements of that case, then more() (the worker passes backendpeer's measurements of the
    case with --vs backend), then the hand-over to the MPI job and the wait for it."""
    out = []
    if "gloo" in bench["peers"]:
        for task in bench["tasks"][index]:
            rec = gloo_task(task, rank, world, bench["iters"], bench["warmup"])
            if rec is not None:
                out.append(rec)
    if more is not None:   # --vs backend: dist.* over backend stratac, beside its direct call
        out += more()
    gate = Gate(bench["gate"])
    if rank == 0:
        gate.mark(f"stratac-{index}")
    if "mpi" in bench["peers"]:
        gate.wait(f"mpi-{index}", bench["peer_timeout"])   # on abort or timeout: go on alone
    return out


def before_cases(bench: dict) -> None:
    """Called by stratac.tools.run.worker before its first case: the MPI job must be up (started,
    imported, MPI_Init done) so that its start-up does not run beside stratac's first measurement."""
    if "mpi" in bench["peers"]:
        Gate(bench["gate"]).wait("mpi-ready", bench["peer_timeout"])


# ---- trace: one recorded call per schedule and case (stratac bench --trace)

HOST_TID = 999   # the track of the whole call, as the host saw it


def traced_call(comm, call, trace_dir: str, label: str, rank: int) -> None:
    """Runs `call` once with the CPU model's trace on and appends this rank's spans (Chrome trace
    events, one per line) to trace_dir/rank<r>.jsonl, plus one span for the whole call."""
    lib, ffi = comm._lib, comm._ffi
    path = Path(trace_dir) / f"rank{rank}.jsonl"
    comm.barrier()
    t0 = time.monotonic()    # CLOCK_MONOTONIC, the model's clock
    lib.strata_cpu_trace_enable(1)
    try:
        call()
    finally:
        lib.strata_cpu_trace_enable(0)
    t1 = time.monotonic()
    if lib.strata_cpu_trace_write(str(path).encode()) != 0:
        raise RuntimeError(ffi.string(lib.strata_cpu_last_error()).decode(errors="replace"))
    with open(path, "a") as f:
        f.write(json.dumps({"ph": "X", "pid": rank, "tid": HOST_TID, "ts": t0 * 1e6,
                            "dur": (t1 - t0) * 1e6, "name": label, "cat": "call", "args": {}}) + "\n")
    comm.barrier()


# ---- MPI, as its own job: mpirun -np W python -m stratac.tools.bench.benchpeer SPEC

def _mpi_dtype(MPI, dtype: str):
    return {"f32": MPI.FLOAT, "i32": MPI.INT32_T, "f16": None, "bf16": None}[dtype]


def mpi_task(MPI, comm, task: dict, iters: int, warmup: int) -> dict | None:
    import numpy as np
    rank, world = comm.Get_rank(), comm.Get_size()
    kind, root, dt = task["kind"], task["root"], task["dtype"]
    npdt = {"f32": np.float32, "i32": np.int32, "f16": np.float16, "bf16": np.uint16}[dt]
    mdt = _mpi_dtype(MPI, dt)
    reduces = kind in ("allreduce", "reducescatter", "reduce")
    if mdt is None and reduces:
        return _record("mpi", task, world, None, None, f"MPI has no {dt} reduction") if rank == 0 else None
    op = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[task["op"]]
    x = np.empty(task["in_numel"], dtype=npdt)
    out = np.empty(task["out_numel"], dtype=npdt) if task["out_numel"] is not None else None

    def buf(a):   # f16/bf16 move as bytes: data movement only (reductions were refused above)
        return [a, mdt] if mdt is not None else [a.view(np.uint8), MPI.BYTE]

    call = {
        "allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, buf(x), op=op),
        "allgather": lambda: comm.Allgather(buf(x), buf(out)),
        "reducescatter": lambda: comm.Reduce_scatter_block(buf(x), buf(out), op=op),
        "broadcast": lambda: comm.Bcast(buf(x), root=root),
        "reduce": lambda: comm.Reduce(MPI.IN_PLACE if rank == root else buf(x),
                                      buf(x) if rank == root else None, op=op, root=root),
        "alltoall": lambda: comm.Alltoall(buf(x), buf(out)),
    }[kind]
    if dt == "bf16":   # float64 <-> bfloat16 bits (small integers: exact)
        to_x = lambda a: (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        to_f64 = lambda a: (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        to_x = lambda a: a.astype(npdt)
        to_f64 = lambda a: a.astype(np.float64)
    fill_input(x, task, rank, to_x)
    call()
    wrong = int(not check_output(out if out is not None else x, task, rank, world, to_f64))
    calls = np.array(_timed(call, comm.Barrier, iters, warmup))
    slowest = np.empty_like(calls)
    comm.Allreduce(calls, slowest, op=MPI.MAX)   # each call's slowest rank
    elapsed = float(np.median(slowest))
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    return _record("mpi", task, world, elapsed, wrong) if rank == 0 else None


def mpi_main(spec: dict) -> int:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        print(f"stratac bench: mpi4py cannot be imported in the MPI job: {exc}", file=sys.stderr)
        return 2
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    gate = Gate(spec["gate"])
    if comm.Get_size() != spec["world"]:
        if rank == 0:
            print(f"stratac bench: mpirun started {comm.Get_size()} ranks, expected {spec['world']}",
                  file=sys.stderr)
        return 2
    comm.Barrier()
    if rank == 0:
        gate.mark("mpi-ready", f"{MPI.Get_library_version().strip().splitlines()[0]}")
    for i, tasks in enumerate(spec["tasks"]):
        ok = gate.wait(f"stratac-{i}", spec["peer_timeout"])
        # every rank must agree before the next collective: one that timed out stops them all
        if not comm.allreduce(int(ok), op=MPI.MIN):
            return 1
        for task in tasks:
            rec = mpi_task(MPI, comm, task, task.get("iters", spec["iters"]), spec["warmup"])
            if rec is not None:
                print(PEER_PREFIX + json.dumps(rec), flush=True)
        comm.Barrier()
        if rank == 0:
            gate.mark(f"mpi-{i}")
    return 0


if __name__ == "__main__":
    sys.exit(mpi_main(json.loads(Path(sys.argv[1]).read_text())))
