"""The sweep driver, the entry point of `stratac bench`: sweep sizes for every schedule of a file on
the CPU build, optionally beside torch.distributed (gloo) and MPI, interleaved at every size.

In: a BenchSpec. Out: a BenchResult: one record per system, schedule (or peer collective) and
size, with nccl-tests figures and the copies each engine made (from the CPU model's counters). A
file of MoE schedules is handed to moe.run, which sweeps tokens and routings instead.

The flow: plan the cases (one runner.Case per size, and the collectives the peers run at each), set
up MPI and measure the copy ceiling, check the sweep fits in memory, run one stratac job through
stratac.tools.run.runner (gloo is measured inside its rank processes; MPI in its own mpirun job, the
two taking turns through a gate, see benchpeer), merge the trace, turn the result lines into records.

Metrics (DESIGN.md §7, nccl-tests): algbw = S / t, busbw = algbw x factor, GB = 1e9 B; factor
AllReduce 2(n-1)/n, AllGather/ReduceScatter/AllToAll (n-1)/n, Broadcast/Reduce 1; S is the whole
gathered/scattered buffer for AllGather/ReduceScatter, one rank's send buffer for AllToAll, the
buffer otherwise. t is the slowest rank's mean time per call over --iters calls after --warmup.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from stratac.host import schedule
from stratac.host.cores import by_size as cores_by_size
from stratac.ir import DType, elem_env, passes
from stratac.lang.frontend import load_source
from stratac.tools.bench import backendpeer, benchpeer, machine, moe, mpi, proofs, trace
from stratac.tools.bench.benchspec import (
    DEFAULT_SIZES,
    PEERS,
    BenchError,
    BenchUsageError,
    BenchResult,
    BenchSpec,
)
from stratac.tools.bench.progress import Progress
from stratac.tools.bench.report import fmt_bytes
from stratac.tools.options import parse_sizes
from stratac.tools.run import runner
from stratac.tools.run.workload import Workload, divisor_problem


def run(spec: BenchSpec, echo=print) -> BenchResult:
    """The bench of spec.file: its MoE schedules by moe.run, its collectives by size here."""
    pairs = moe.moe_file(spec)
    if pairs is not None:
        return moe.run(spec, pairs, echo)
    if spec.two_pass_places:
        raise BenchUsageError(f"--two-pass-places compares MoE dispatches whose places are joined with "
                              f"the same ones not joined; {spec.file} has no moe_dispatch schedule")
    if spec.sizes is None:
        spec.sizes = parse_sizes(DEFAULT_SIZES)
    for p in spec.peers:
        if p not in PEERS:
            raise BenchError(f"--vs {p}: the peers are {', '.join(PEERS)}")
    if spec.world < 1:
        raise BenchError(f"--world must be at least 1, got {spec.world}")
    if not 0 <= spec.root < spec.world:
        raise BenchError(f"--root {spec.root} is not a rank of a world of {spec.world}")
    meta: dict = {"file": str(spec.file), "world": spec.world, "dtype": spec.dtype, "op": spec.op,
                  "root": spec.root, "iters": spec.iters, "warmup": spec.warmup,
                  "cores": spec.cores, "peers": list(spec.peers), "cpus": os.cpu_count(),
                  "loadavg_before": os.getloadavg()[0]}
    meta["torch"] = torch.__version__
    if "backend" in spec.peers and spec.selected:
        raise BenchUsageError("--vs backend compares the backend with its own entry point (the direct "
                              "row); with --selected the file's entry points are benched: use one or "
                              "the other")
    if "mpi" in spec.peers:
        meta["mpi"] = mpi.setup_mpi(echo)
    meta["copy_ceiling"] = (machine.copy_ceiling(spec.ceiling_bytes) if spec.ceiling   # before anything else
                            else {"bytes": 0, "gbps_1_thread": 0.0, "gbps_all_threads": 0.0, "threads": 0})
    meta["selected"] = spec.selected
    pl = plan(spec)
    meta["cores"] = spec.cores or cores_by_size(pl.compiled[0].schedule.kernel.cores, spec.world)
    meta["instance_proofs"] = proofs.prove(spec.world, pl.instances)
    rspec = runner.RunSpec(file=spec.file, world=spec.world, cases=pl.cases, iters=spec.iters,
                           warmup=spec.warmup, timeout=spec.timeout, check=True, seed=spec.seed,
                           soc=spec.soc, cores=spec.cores, selected=spec.selected,
                           selection=spec.selection)
    heap = runner.heap_bytes(rspec, pl.compiled)
    need = memory_needed(spec, pl, heap)
    avail = machine.mem_available()
    if avail is not None and need > 0.8 * avail:   # an OOM kill would take other processes too
        raise BenchError(f"the largest size needs about {need / 2**30:.1f} GiB of memory ({spec.world} "
                         f"ranks: heap, reference check, peer buffers) but {avail / 2**30:.1f} GiB are "
                         f"available: lower the largest --sizes (now {fmt_bytes(pl.cases[-1].size)})")
    if "backend" in spec.peers:
        extra = meta["backend_heap"] = backend_heap(spec, pl)
        shm = os.statvfs("/dev/shm")
        if (heap + extra) * spec.world > shm.f_bavail * shm.f_frsize:
            raise BenchError(f"--vs backend: the bench's heap and the backend group's ({fmt_bytes(extra)}) "
                             f"need {fmt_bytes((heap + extra) * spec.world)} of /dev/shm for {spec.world} "
                             "ranks, more than is free: lower the largest --sizes")
    with tempfile.TemporaryDirectory(prefix="stratac-bench-") as tmp:
        results, failures, exit_code = _measure(spec, pl, rspec, Path(tmp), echo)
        if spec.trace:
            meta["trace"] = trace.write_trace(Path(tmp) / "trace", spec)
    meta["loadavg_after"] = os.getloadavg()[0]
    return BenchResult(meta, _records(results, pl, spec), failures, exit_code)


# ---------------------------------------------------------------------------------------------
# planning: cases (one per size) and the peers' tasks of each case

@dataclass
class Plan:
    compiled: list            # schedule.Compiled
    cases: list[runner.Case]
    tasks: list[list[dict]]   # per case: the distinct collectives the peers run
    largest_numel: int        # elements of the largest tensor of any case (memory_needed)
    instances: list           # (schedule, sizes and rank parameters) of every call (proofs.prove)


def plan(spec: BenchSpec) -> Plan:
    source = load_source(spec.file)
    opts = passes.Options(soc=spec.soc, cores=spec.cores)
    opts.check()
    compiled = schedule.compile_source(source, opts, worlds=[spec.world])
    if not compiled:
        raise BenchError(f"{spec.file} holds no schedule")
    problem = divisor_problem([c.schedule for c in compiled], spec.world, None, "bench")
    if problem:
        raise BenchError(problem)
    elem = DType.parse(spec.dtype).nbytes
    cases, tasks, seen_counts, largest, instances = [], [], None, 0, []
    for size in spec.sizes:
        counts = tuple(Workload.count_for_bytes(c.schedule, spec.world, size, elem) for c in compiled)
        if counts == seen_counts:   # below the smallest size a schedule can take: same case again
            continue
        seen_counts = counts
        case_tasks: dict[tuple, dict] = {}
        for c, n in zip(compiled, counts):
            s = c.schedule
            wl = Workload(s, spec.world, n, op=spec.op, root=spec.root, elem=elem)
            largest = max([largest] + [wl.numel(p) for p in s.params])
            instances.append((s, {**wl.sizes, **{x.name: spec.root for x in s.rank_params},
                                  **elem_env(s, elem)}))
            task = peer_task(s, wl, spec.world, spec.dtype, spec.op, spec.root, case=len(cases))
            case_tasks.setdefault((task["kind"], task["in_numel"], task["out_numel"]), task)
        cases.append(runner.Case(dtype=spec.dtype, size=size, op=spec.op, root=spec.root))
        tasks.append(list(case_tasks.values()))
    return Plan(compiled, cases, tasks, largest, instances)


def peer_task(s, wl: Workload, world: int, dtype: str, op: str, root: int, case: int) -> dict:
    """The collective the peers (gloo, MPI) run beside schedule `s` on workload `wl`: its kind, the
    elements of its input and output (out of place: an in-place contract's output gets its own
    buffer), the bytes S and the busbw factor, for case number `case`."""
    kind = s.contract.kind.value
    x = s.param(s.contract.inputs[0])
    out_numel = None
    if kind in ("allgather", "reducescatter", "alltoall"):
        out_numel = wl.numel(s.param(s.contract.outputs[0]))
        if s.contract.in_place:
            out_numel = {"allgather": wl.numel(x) * world, "reducescatter": wl.numel(x) // world,
                         "alltoall": wl.numel(x)}[kind]
    return {"kind": kind, "in_numel": wl.numel(x), "out_numel": out_numel, "dtype": dtype, "op": op,
            "root": root, "size": wl.size_bytes(DType.parse(dtype).nbytes), "busbw_factor": wl.busbw_factor(),
            "case": case}


def backend_heap(spec: BenchSpec, pl: Plan) -> int:
    """--vs backend: the heap per rank of the process group of backend stratac (backendpeer)."""
    return backendpeer.heap_bytes(pl.tasks, DType.parse(spec.dtype).nbytes)


def memory_needed(spec: BenchSpec, pl: Plan, heap: int) -> int:
    """A generous estimate of the run's peak memory: per rank the heap, the torch reference check
    (about 32 bytes per element of the largest tensor: int64 draws, float64 accumulator, the
    expected tensor) and the gloo buffers; with --vs backend that group's heap and plain tensors;
    per MPI rank its buffers; 300 MB per process."""
    elem = DType.parse(spec.dtype).nbytes
    n_max = pl.largest_numel
    rank = heap + 32 * n_max + (2 * n_max * elem if "gloo" in spec.peers else 0) + (300 << 20)
    if "backend" in spec.peers:
        rank += backend_heap(spec, pl) + 2 * n_max * elem
    mpi_rank = 2 * n_max * elem + (300 << 20) if "mpi" in spec.peers else 0
    return spec.world * (rank + mpi_rank)


# ---------------------------------------------------------------------------------------------
# the measurement

def _measure(spec: BenchSpec, pl: Plan, rspec: runner.RunSpec, tmp: Path,
             echo) -> tuple[list[dict], list[str], int]:
    """One stratac job over every case (gloo inside its ranks), and with --vs mpi one MPI job
    beside it; their result lines, failures and exit status. tmp holds the gate and the trace."""
    gate = benchpeer.Gate(tmp / "gate")
    gate.path.mkdir()
    rspec.bench = {"peers": list(spec.peers), "tasks": pl.tasks, "gate": str(gate.path),
                   "iters": spec.iters, "warmup": spec.warmup, "peer_timeout": spec.timeout * 4,
                   "trace": None, "agreement_cost": spec.agreement_cost,
                   "two_pass_places": spec.two_pass_places, "timeout": spec.timeout}
    if "backend" in spec.peers:
        rspec.bench["backend_heap"] = backend_heap(spec, pl)
    if spec.trace:
        rspec.bench["trace"] = str(tmp / "trace")
        Path(rspec.bench["trace"]).mkdir()
    job = mpi.MpiJob(spec.world, rspec.bench, tmp) if "mpi" in spec.peers else None
    if job:
        job.start()
    try:
        with Progress(gate, pl.cases, job is not None, spec.progress):
            outcome = runner.run(rspec, echo=echo)
    finally:
        if job:
            job.stop()
    results, failures = outcome.results, list(outcome.failures)
    if job:
        results += job.results
        failures += [job.failure] if job.failure else []
    return results, failures, outcome.exit_code or (1 if failures else 0)


# ---------------------------------------------------------------------------------------------
# records

def _min_copies(kind: str, world: int, in_place: bool) -> float:
    """Bytes the contract needs written into GM per rank (mean over ranks), per payload byte S."""
    w = world
    if w == 1 and in_place:
        return 0.0
    return {"allreduce": 1.0, "allgather": (w - 1) / w if in_place else 1.0,
            "reducescatter": 1 / w, "broadcast": (w - 1) / w if in_place else 1.0,
            "reduce": 1 / w, "alltoall": (w - 1) / w if in_place else 1.0}[kind]


def _min_fabric(kind: str, world: int) -> float:
    """Bytes that must cross between ranks per rank (mean over ranks), per payload byte S: nccl-tests'
    bus factor, except Broadcast and Reduce, whose factor 1 counts the root's link: (n-1) ranks
    each receive (or send) S, (n-1)/n per rank."""
    w = world
    return 2 * (w - 1) / w if kind == "allreduce" else (w - 1) / w


def _figures(size: int, time_s: float | None, factor: float) -> dict:
    if time_s is None or not time_s > 0:
        return {"time_us": None, "algbw": None, "busbw": None}
    algbw = size / time_s / 1e9
    return {"time_us": time_s * 1e6, "algbw": algbw, "busbw": algbw * factor}


UNCHECKED = " (no agreement)"   # --agreement-cost: the name of a schedule's twin built without it


def _records(results: list[dict], pl: Plan, spec: BenchSpec) -> list[dict]:
    """One record per system, schedule (or peer collective) and size."""
    scheds = {c.schedule.name: c.schedule for c in pl.compiled}
    scheds.update({f"{n}{UNCHECKED}": s for n, s in list(scheds.items())})   # --agreement-cost
    w = spec.world
    peers = [r for r in results if "system" in r]
    ours: dict[tuple, list[dict]] = {}
    for r in results:
        if "system" not in r:
            ours.setdefault((r["schedule"], r["count"], r["dtype"]), []).append(r)
    out = []
    for (name, count, dtype), ranks in ours.items():
        ranks.sort(key=lambda r: r["rank"])
        r0 = ranks[0]
        s = scheds[r0.get("form") or name]   # a selecting entry point: the form it was called in
        kind = s.contract.kind.value
        size = r0["size"]
        per_rank = []
        for r in ranks:
            ctr = r["counters"]
            tot = {k: sum(c[k] for c in ctr) for k in ("mte_in", "mte_out", "sdma", "remote_read",
                                                        "remote_write", "sdma_posts", "sdma_sqes")}
            cores = [c["mte_in"] + c["mte_out"] + c["sdma"] for c in ctr]
            mean = sum(cores) / len(cores) if cores else 0
            per_rank.append({"rank": r["rank"], "aiv_in": tot["mte_in"], "aiv_out": tot["mte_out"],
                             "sdma": tot["sdma"], "remote_read": tot["remote_read"],
                             "remote_write": tot["remote_write"],
                             "sdma_posts": tot["sdma_posts"], "sdma_sqes": tot["sdma_sqes"],
                             "core_balance": max(cores) / mean if mean else None,
                             "cores_busy": sum(1 for c in cores if c),
                             "per_core": [{"core": i, "aiv_in": c["mte_in"], "aiv_out": c["mte_out"],
                                           "sdma": c["sdma"], "sdma_posts": c["sdma_posts"],
                                           "sdma_sqes": c["sdma_sqes"]} for i, c in enumerate(ctr)],
                             "heap_bytes": r["heap_bytes"]})
        n = len(per_rank)
        mean_of = lambda k: sum(p[k] for p in per_rank) / n
        engines = {k: mean_of(k) for k in ("aiv_in", "aiv_out", "sdma", "remote_read", "remote_write",
                                           "sdma_posts", "sdma_sqes")}
        landed = engines["aiv_out"] + engines["sdma"]
        balances = [p["core_balance"] for p in per_rank if p["core_balance"] is not None]
        rec = {"system": "stratac", "schedule": name, "kind": kind, "world": w, "size": size,
               "count": count, "dtype": dtype, "op": r0["op"], "root": r0["root"],
               **_figures(size, r0["time_s"], r0["busbw_factor"]),
               "errors": r0["ranks_wrong"], "why": [r["why"] for r in ranks if r["why"]],
               "cores": r0["cores"], "cores_busy": max(p["cores_busy"] for p in per_rank),
               "engines": engines,
               "copies_per_byte": landed / size if size else None,
               "min_copies_per_byte": _min_copies(kind, w, s.contract.in_place),
               "fabric_per_byte": (engines["remote_read"] + engines["remote_write"]) / size if size else None,
               "min_fabric_per_byte": _min_fabric(kind, w),
               "core_balance": max(balances) if balances else None,
               "heap_bytes": max(p["heap_bytes"] for p in per_rank),
               "staging": bool(s.scratch), "per_rank": per_rank, "picked": r0.get("picked")}
        out.append(rec)
    for p in peers:
        rec = {"system": p["system"], "schedule": p["schedule"], "kind": p["kind"], "world": w,
               "size": p["size"], "count": p["count"], "dtype": p["dtype"],
               "op": p["op"] if p["kind"] in ("allreduce", "reducescatter", "reduce") else None,
               "root": p["root"] if p["kind"] in ("broadcast", "reduce") else None,
               **_figures(p["size"], p["time_s"], p["busbw_factor"]),
               "errors": p["errors"], "note": p["note"]}
        if p["system"] == "backend":   # the variant (direct, zero-copy, staged) and what it did
            rec.update({k: p.get(k) for k in ("variant", "picked", "staged_bytes", "zero_copy")})
        out.append(rec)
    _backend_overhead(out)
    # stratac/peer: the ratio of busbw (equivalently of the peer's time to stratac's) at that size
    index = {(r["system"], r["kind"], r["size"]): r for r in out
             if r["system"] not in ("stratac", "backend")}
    for r in out:
        if r["system"] == "stratac":
            r["ratio"] = {}
            for peer in column_peers(spec.peers):
                q = index.get((peer, r["kind"], r["size"]))
                r["ratio"][peer] = (r["busbw"] / q["busbw"] if q and q["busbw"] and r["busbw"]
                                    else None)
    order = {name: i for i, name in enumerate(scheds)}
    order.update({r["schedule"]: -1 for r in out if r.get("picked")})
    variant = {v: i for i, v in enumerate(backendpeer.VARIANTS)}
    out.sort(key=lambda r: (r["system"] != "stratac", order.get(r["schedule"], 0), r["kind"],
                            r["system"], r["size"], variant.get(r.get("variant"), 0)))
    return out


def column_peers(peers: list[str]) -> list[str]:
    """The peers with columns in each schedule's table (the backend has a table of its own)."""
    return [p for p in peers if p != "backend"]


def _backend_overhead(out: list[dict]) -> None:
    """--vs backend: each backend row's time against the direct call of the same kind and size,
    measured in the same run: overhead_us = time - direct time, x_direct = time / direct time
    (for the gloo row of that kind and size too, if gloo was measured)."""
    direct = {(r["kind"], r["size"]): r for r in out
              if r["system"] == "backend" and r.get("variant") == "direct"}
    for r in out:
        if r["system"] not in ("backend", "gloo") or r.get("variant") == "direct":
            continue
        d = direct.get((r["kind"], r["size"]))
        if d is None:
            continue
        ok = r["time_us"] is not None and d["time_us"] is not None and d["time_us"] > 0
        r["overhead_us"] = r["time_us"] - d["time_us"] if ok else None
        r["x_direct"] = r["time_us"] / d["time_us"] if ok else None
