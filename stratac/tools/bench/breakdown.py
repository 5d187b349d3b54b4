"""`stratac bench FILE --breakdown`: where the time of one call goes, per schedule and size, with the
CPU model's deliberate costs as named terms.

In: the file, world, sizes, dtype, op, cores, calls. Out: per schedule, size and rank, the median
over the calls of each term of the call's wall time (Breakdown.rows) and the lines of its table.

Each rank (callruns: its own process, the public API) makes `warmup` calls, then `iters` pairs in
turns, back to back: a call with the CPU model's cost accounting off (their median wall time is
printed beside, so that what the accounting costs shows), then a call with it on
(strata_cpu_costs_enable). Of each accounted call
it takes, on CLOCK_MONOTONIC: the call entered and returned (Python), the launcher's cffi call
entered and returned (callruns.LaunchTimer), and from the model (strata_cpu_read_costs) LaunchBlocks'
entry and every core's start, kernel start (after its UB refill), end and exclusive time per
activity. The terms of one call, on its critical core (the core of the rank that returns last):

    python before | handoff | core start | UB refill | flag waits | SyncAll | SDMA quiet | SQE cost |
    SQE overrun | MTE2 | MTE3 | SDMA run by the core | D-cache | ledger checks | remainder | join |
    python after

(the SQE spin split into the charge and the time past it, when other fibres of the thread ran)
add up to the call's wall time by construction, each measured on its own clock reads except the
remainder (the critical core's time in none of the named activities: vector ops, scalar code,
fibre switches); a negative remainder would mean two terms counted the same time. The table prints
each term's mean over the calls nearest the median wall time (the fifth of them closest to it, at
least 3; per-term medians would not add up: a call's terms move together), their sum (the mean
wall time of those calls), the median wall time of all the calls and the difference.

Deliberate costs of the NPU model (runtime/README.md), each with the figure the model charges: the
SQE cost (its spin; charged = sdma_sqe_us x SQEs, quiets included), the UB refill ("UB holds
garbage": bytes refilled), UB staging (the GM->UB leg of the vector cores' copies, MTE2: bytes),
the D-cache (scalar GM through the modelled cache: calls). "less deliberate" is the sum less those
four terms of the critical core. Beside the terms, per engine, every core of the rank: MTE2/MTE3
bytes and time, SDMA bytes, SQEs, its engine threads' and the cores' copy time; and the own work of
every core (everything but its waits, the SQE spin as charged) plus its engine threads' copies,
with the deliberate part of it: what the rank's threads had to run, where the critical core mostly
waits for the others.

With `--vs mpi`, an mpirun job (benchpeer.mpi_main) measures each schedule's collective at the same
bytes after each size, the two jobs taking turns through benchpeer's gate; MPI's time is printed
beside stratac's, compared the same way (each call's slowest rank), as run and less the deliberate
terms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from stratac.tools.bench import benchpeer, callruns

# (key, label, deliberate): the additive terms of a call, in time order
TERMS = (
    ("python_before", "python before launch", False),
    ("handoff", "launch handoff (cffi, LaunchBlocks, core threads woken)", False),
    ("core_start", "core start (first core -> critical core starts)", False),
    ("ub_refill", "UB refill with 0xff", True),
    ("flag_wait", "waits: flags and barriers", False),
    ("syncall", "waits: SyncAll", False),
    ("quiet", "waits: SDMA quiet", False),
    ("sqe", "SQE cost charged (sdma_sqe_us per SQE and quiet)", True),
    ("sqe_overrun", "SQE spin past its charge (other fibres ran)", False),
    ("mte_in", "UB staging: MTE2 GM->UB copies", True),
    ("mte_out", "MTE3 UB->GM copies", False),
    ("sdma_by_core", "SDMA copies run by the core's waits", False),
    ("dcache", "D-cache (scalar GM, flushes)", True),
    ("ledger", "rule checks: SDMA ledger", False),
    ("remainder", "remainder (vector ops, scalar code, fibres)", False),
    ("join", "join/teardown (critical core ends -> launcher returns)", False),
    ("python_after", "python after launch", False),
)
DELIBERATE = tuple(k for k, _, d in TERMS if d)
CORE_ACTIVITIES = ("flag_wait", "syncall", "quiet", "sqe", "mte_in", "mte_out", "sdma_by_core", "dcache",
                   "ledger")
# per-call figures beside the terms (not added): bytes, counts and whole-rank engine times
FIGURES = ("wall", "wall_plain", "cores", "threads", "sqe_us", "crit_core", "crit_sqe_charged",
           "crit_sqe_charges", "crit_ub_refill_bytes", "crit_mte_in_bytes", "crit_dcache_ops",
           "rank_mte_in_bytes", "rank_mte_out_bytes", "rank_mte_in_s", "rank_mte_out_s", "rank_sdma_bytes",
           "rank_sdma_sqes", "rank_sdma_posts", "rank_sdma_engine_s", "rank_sdma_by_core_s",
           "rank_sqe_charged", "rank_sqe_s", "rank_busy_s", "rank_deliberate_s")


class BreakdownError(Exception):
    """What the breakdown cannot do, in one message."""


def call_terms(call: tuple[float, float], launch: tuple[float, float], cores: list[dict],
               lcost: dict, counters: list[dict]) -> dict:
    """One call's terms (s) and figures, from its Python timestamps, the model's per-core costs
    and the counters of that call alone."""
    tc0, tc1 = call
    tl0, tl1 = launch
    crit_i = max(range(len(cores)), key=lambda i: cores[i]["end"])
    crit = cores[crit_i]
    t = {"python_before": tl0 - tc0,
         "handoff": min(c["start"] for c in cores) - tl0,
         "core_start": crit["start"] - min(c["start"] for c in cores),
         "ub_refill": crit["kernel"] - crit["start"]}
    for k in CORE_ACTIVITIES:
        t[k] = crit[k]
    # the spin yields to the other fibres of its thread and ends at its first look past the charge:
    # the charge is the deliberate cost, the rest is other cores' work
    t["sqe"], t["sqe_overrun"] = crit["sqe_charged"], crit["sqe"] - crit["sqe_charged"]
    t["remainder"] = (crit["end"] - crit["kernel"]) - sum(crit[k] for k in CORE_ACTIVITIES)
    t["join"] = tl1 - crit["end"]
    t["python_after"] = tc1 - tl1
    sqe_us = lcost["sqe_us"]
    ctr = counters[crit_i] if crit_i < len(counters) else {}
    f = {"wall": tc1 - tc0, "cores": len(cores), "threads": lcost["threads"], "sqe_us": sqe_us,
         "crit_core": crit_i, "crit_sqe_charged": crit["sqe_charged"],
         "crit_sqe_charges": crit["sqe_charged"] * 1e6 / sqe_us if sqe_us > 0 else 0.0,
         "crit_ub_refill_bytes": crit["ub_refill_bytes"], "crit_mte_in_bytes": ctr.get("mte_in", 0),
         "crit_dcache_ops": crit["dcache_ops"],
         "rank_mte_in_bytes": sum(c["mte_in"] for c in counters),
         "rank_mte_out_bytes": sum(c["mte_out"] for c in counters),
         "rank_mte_in_s": sum(c["mte_in"] for c in cores), "rank_mte_out_s": sum(c["mte_out"] for c in cores),
         "rank_sdma_bytes": sum(c["sdma"] for c in counters),
         "rank_sdma_sqes": sum(c["sdma_sqes"] for c in counters),
         "rank_sdma_posts": sum(c["sdma_posts"] for c in counters),
         "rank_sdma_engine_s": sum(c["sdma_engine"] for c in cores),
         "rank_sdma_by_core_s": sum(c["sdma_by_core"] for c in cores),
         "rank_sqe_charged": sum(c["sqe_charged"] for c in cores), "rank_sqe_s": sum(c["sqe"] for c in cores)}
    # every core's own work (not its waits; its SQE spin as charged: the spin lets the thread's other
    # cores run), and the engine threads' copies: what the rank's threads had to run in the call
    own = [(c["kernel"] - c["start"]) + c["mte_in"] + c["mte_out"] + c["sdma_by_core"] + c["dcache"] + c["ledger"]
           + c["sqe_charged"] + (c["end"] - c["kernel"] - sum(c[k] for k in CORE_ACTIVITIES)) for c in cores]
    f["rank_busy_s"] = sum(own) + f["rank_sdma_engine_s"]
    f["rank_deliberate_s"] = sum((c["kernel"] - c["start"]) + c["mte_in"] + c["dcache"] + c["sqe_charged"]
                                 for c in cores)
    return {"terms": t, "figures": f}


def _read_costs(comm) -> tuple[list[dict], dict]:
    from stratac.codegen import abi
    lib, ffi = comm._lib, comm._ffi
    buf = ffi.new("double[]", abi.MAX_CORES * len(abi.COSTS))
    lbuf = ffi.new("double[]", len(abi.LAUNCH_COSTS))
    n = lib.strata_cpu_read_costs(buf, abi.MAX_CORES, lbuf)
    cores = [{k: buf[i * len(abi.COSTS) + j] for j, k in enumerate(abi.COSTS)} for i in range(n)]
    return cores, {k: lbuf[j] for j, k in enumerate(abi.LAUNCH_COSTS)}


def rank_main(spec: dict) -> None:
    from stratac.ir import passes
    comm = callruns.open_comm(spec, "breakdown")
    mod = comm.load(spec["file"], options=passes.Options(soc=spec["soc"]) if spec.get("soc") else None)
    gate = benchpeer.Gate(spec["gate"]) if spec.get("gate") else None
    if gate is not None and not _agreed(gate, "mpi-ready", spec["rank"], spec["peer_timeout"]):
        gate = None   # the MPI job did not start: the breakdown goes on alone (the job's failure is reported)
    out = []
    for case, size in enumerate(spec["sizes"]):
        iters = spec["iters"] if size < spec["large"] else spec["iters_large"]
        for name, fn in mod.schedules.items():
            count, args, tensors = callruns.workload_args(comm, fn, spec["world"], size, spec["dtype"],
                                                         spec["op"], spec["root"])
            kw = {} if spec["cores"] is None else {"cores": spec["cores"]}
            timer = callruns.LaunchTimer(fn)
            for _ in range(spec["warmup"]):
                fn(**args, **kw)
            comm.barrier()
            plain, calls = [], []
            try:
                # in turns: a call without the accounting, one with it, back to back as MPI's are (a
                # barrier before each would time the wake-up of core threads parked in it: about 1 ms
                # per call at 1 MiB, world 2)
                for _ in range(iters):
                    t0 = time.monotonic()
                    fn(**args, **kw)
                    plain.append(time.monotonic() - t0)
                    comm.reset_counters()
                    timer.times.clear()
                    comm._lib.strata_cpu_costs_enable(1)
                    t0 = time.monotonic()
                    fn(**args, **kw)
                    t1 = time.monotonic()
                    comm._lib.strata_cpu_costs_enable(0)
                    cores, lcost = _read_costs(comm)
                    calls.append(call_terms((t0, t1), timer.times[-1], cores, lcost, comm.counters()))
            finally:
                comm._lib.strata_cpu_costs_enable(0)
                timer.restore()
            comm.barrier()
            out.append({"schedule": name, "rank": spec["rank"], "size": size, "count": count, "iters": iters,
                        "wall_plain": plain, "calls": calls})
            callruns.free_tensors(comm, fn, tensors)
        if gate is not None:   # this size is done on every rank: the MPI job measures it now
            comm.barrier()
            if spec["rank"] == 0:
                gate.mark(f"stratac-{case}")
            if not _agreed(gate, f"mpi-{case}", spec["rank"], spec["peer_timeout"]):
                gate = None    # the MPI job failed or hangs: the other sizes go on without it
    callruns.emit(out)
    comm.close()


def _agreed(gate: benchpeer.Gate, mark: str, rank: int, timeout: float) -> bool:
    """Whether the MPI job made `mark` in time, as rank 0 saw it: rank 0 waits and writes its
    verdict, the other ranks read it, so that the ranks go on taking turns, or stop, together."""
    verdict = gate.path / f"seen-{mark}"
    if rank == 0:
        gate.mark(verdict.name, "1" if gate.wait(mark, timeout) else "0")
    else:
        deadline = time.monotonic() + timeout + 60
        while not verdict.exists():   # not gate.wait: an abort mark must not end this wait early
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
    return verdict.read_text() == "1"


@dataclass
class Breakdown:
    meta: dict
    rows: list[dict] = field(default_factory=list)   # per schedule, size, rank: medians
    failures: list[str] = field(default_factory=list)
    status: int = 0


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else 0.0


def middle(calls: list[dict]) -> list[dict]:
    """The calls nearest the median wall time: the fifth of them (at least 3, all when there are
    fewer) whose wall time is closest to the median, in value (a loaded machine's calls come in
    clusters: the median's neighbours by rank may lie in another one)."""
    k = max(3, len(calls) // 5)
    if len(calls) <= k:
        return list(calls)
    med = _median([c["figures"]["wall"] for c in calls])
    return sorted(calls, key=lambda c: abs(c["figures"]["wall"] - med))[:k]


def summarize(rec: dict) -> dict:
    """A rank's calls of one schedule and size -> each term averaged over the calls nearest the
    median wall time (middle; a median per term would not add up: the terms of one call move together),
    the sum of those (their mean wall time), the median wall time of all the calls and the
    difference; per-term medians and minima beside (s, bytes)."""
    calls = rec["calls"]
    mid = middle(calls)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    terms = {k: mean([c["terms"][k] for c in mid]) for k, _, _ in TERMS}
    figs = {k: _median([c["figures"].get(k) for c in calls]) for k in FIGURES if k != "wall_plain"}
    figs["wall_plain"] = _median(rec["wall_plain"])
    exact = [c["figures"]["wall"] - sum(c["terms"].values()) for c in calls]   # per call: 0 up to rounding
    total = sum(terms.values())
    deliberate = sum(terms[k] for k in DELIBERATE)
    return {"schedule": rec["schedule"], "rank": rec["rank"], "size": rec["size"], "count": rec["count"],
            "calls": len(calls), "middle_calls": len(mid), "terms": terms, "figures": figs, "sum": total,
            "wall": figs["wall"], "difference": figs["wall"] - total, "less_deliberate": total - deliberate,
            "deliberate": deliberate,
            "median_terms": {k: _median([c["terms"][k] for c in calls]) for k, _, _ in TERMS},
            "min_terms": {k: min(c["terms"][k] for c in calls) for k, _, _ in TERMS},
            "max_exact_error": max(abs(e) for e in exact)}


def run(file: str, world: int, sizes: list[int], dtype: str = "f32", op: str = "sum", root: int = 0,
        cores: int | None = None, iters: int = 20, warmup: int = 5, iters_large: int | None = None,
        large: int = 16 << 20, timeout: float = 120.0, soc: str | None = None, ceiling: bool = True,
        peers: tuple[str, ...] = (), echo=print) -> Breakdown:
    """Measures the breakdown of every schedule of FILE at every size (ranks started here); with
    `ceiling`, the copy ceiling first (machine.copy_ceiling: one thread and all of torch's); with
    peers ("mpi", the only one), the same collectives under mpirun, taking turns with stratac's
    ranks size by size (benchpeer's gate), each row's time beside stratac's."""
    bad = [p for p in peers if p != "mpi"]
    if bad:
        raise BreakdownError(f"--breakdown measures only mpi beside stratac, not {', '.join(bad)}: run the "
                             "sweep (without --breakdown) for gloo and backend")
    if not Path(file).is_file():
        raise BreakdownError(f"{file}: no such file")
    from stratac.lang.frontend import load_source, schedules
    found = schedules(load_source(file))
    from stratac.tools.run.workload import divisor_problem
    problem = divisor_problem(found, world, None, "bench --breakdown")
    if problem:
        raise BreakdownError(problem)
    moe = [s.name for s in found if s.contract.kind.moe]
    if moe:
        raise BreakdownError(f"--breakdown measures collectives at --sizes; {file} holds MoE schedules "
                             f"({', '.join(moe)}), whose calls take routed tokens: bench them without "
                             "--breakdown")
    iters_large = iters if iters_large is None else iters_large
    from stratac.tools.bench import machine, mpi
    version = mpi.setup_mpi(echo) if peers else None
    copy_ceiling = machine.copy_ceiling() if ceiling else None   # before anything else runs
    # no build here: each rank's comm.load proves and its first call builds (the cache publishes one
    # build under a lock, the others wait for it); a build in this process first would prove every
    # schedule twice
    heap = callruns.heap_bytes(file, world, sizes, dtype)
    meta = {"file": file, "world": world, "sizes": sizes, "dtype": dtype, "op": op, "cores": cores,
            "iters": iters, "iters_large": iters_large, "large": large, "warmup": warmup,
            "heap_per_rank": heap, "cpus": _cpus(), "load_before": _load(), "copy_ceiling": copy_ceiling,
            "mpi": version}
    tasks, task_of = (_peer_tasks(found, world, sizes, dtype, op, root,
                                  lambda n: iters if n < large else iters_large) if peers else ([], {}))
    with tempfile.TemporaryDirectory(prefix="stratac-breakdown-") as tmp:
        gate = None
        if peers:
            gate = Path(tmp) / "gate"
            gate.mkdir()
        specs = [{"file": str(Path(file).resolve()), "rank": r, "world": world, "store": f"{tmp}/store",
                  "heap": heap, "timeout": timeout, "sizes": sizes, "dtype": dtype, "op": op, "root": root,
                  "cores": cores, "iters": iters, "iters_large": iters_large, "large": large,
                  "warmup": warmup, "soc": soc, "tmp": tmp, "gate": gate and str(gate),
                  "peer_timeout": timeout * 4} for r in range(world)]
        job = None
        if peers:
            # its first wait covers the ranks' proofs and builds and the first size: the run's deadline
            job = mpi.MpiJob(world, {"tasks": tasks, "gate": str(gate), "iters": iters, "warmup": warmup,
                                     "peer_timeout": timeout * (2 + len(sizes)) * 4}, Path(tmp))
            job.start()
        try:
            results, status, errors = callruns.run_ranks("stratac.tools.bench.breakdown", specs,
                                                         timeout=timeout * (2 + len(sizes)) * 4)
        finally:
            if job:
                job.stop()
    meta["load_after"] = _load()
    if job and job.failure:
        errors.append(job.failure)
    bd = Breakdown(meta=meta, failures=errors, status=1 if status or errors else 0)
    for rank_records in results:
        for rec in rank_records:
            bd.rows.append(summarize(rec))
    bd.rows.sort(key=lambda r: (sizes.index(r["size"]), r["rank"]))
    if job:
        _beside_mpi(bd, results, job.results, task_of)
    if not bd.rows and not bd.failures:
        bd.failures.append("no rank reported a breakdown")
        bd.status = 1
    return bd


def _peer_tasks(found, world: int, sizes: list[int], dtype: str, op: str, root: int, iters_at):
    """The MPI job's tasks, one case per size (the distinct collectives of the file's schedules at
    that size, each timed over as many calls as stratac's at that size, iters_at(size)), and the
    task key of each (schedule, size)."""
    from stratac.ir import DType
    from stratac.tools.bench.sweep import peer_task
    from stratac.tools.run.workload import Workload
    elem = DType.parse(dtype).nbytes
    tasks, task_of = [], {}
    for case, size in enumerate(sizes):
        distinct: dict[tuple, dict] = {}
        for s in found:
            wl = Workload(s, world, Workload.count_for_bytes(s, world, size, elem), op=op, root=root)
            t = dict(peer_task(s, wl, world, dtype, op, root, case), iters=iters_at(size))
            key = (case, t["kind"], t["in_numel"])
            distinct.setdefault(key, t)
            task_of[(s.name, size)] = key
        tasks.append(list(distinct.values()))
    return tasks, task_of


def _beside_mpi(bd: Breakdown, results: list, peer: list[dict], task_of: dict) -> None:
    """Puts MPI's time of the same collective and bytes beside each row of rank 0 (row["mpi"]), with
    stratac's time as run compared the way MPI's is: the median over calls of each call's slowest
    rank (calls with the accounting off), and that less the deliberate terms of the rank that has
    the fewest of them."""
    by_key = {(r["case"], r["kind"], r["count"]): r for r in peer}
    plain: dict[tuple, list[list[float]]] = {}
    for rank_records in results:
        for rec in rank_records:
            plain.setdefault((rec["schedule"], rec["size"]), []).append(rec["wall_plain"])
    for row in bd.rows:
        if row["rank"] != 0:
            continue
        got = by_key.get(task_of.get((row["schedule"], row["size"])))
        walls = plain.get((row["schedule"], row["size"]), [])
        slowest = _median([max(call) for call in zip(*walls)]) if walls else 0.0
        least = min((r["deliberate"] for r in bd.rows
                     if r["schedule"] == row["schedule"] and r["size"] == row["size"]), default=0.0)
        row["mpi"] = {"schedule": got["schedule"] if got else None,
                      "time_s": got["time_s"] if got else None,
                      "errors": got["errors"] if got else None, "note": got["note"] if got else "",
                      "slowest_s": slowest, "slowest_less_deliberate_s": slowest - least}
        wrong = (f"mpi: {got['schedule']} at {row['size']} B gave a wrong result on {got['errors']} rank(s)"
                 if got and got["errors"] else None)
        if wrong and wrong not in bd.failures:   # one line per collective, not per schedule
            bd.failures.append(wrong)
            bd.status = 1


def _cpus() -> int:
    import os
    return len(os.sched_getaffinity(0))


def _load() -> float:
    import os
    return os.getloadavg()[0]


def _us(s: float) -> str:
    return f"{s * 1e6:10.1f}"


def _row(label: str, cells: list[str], w: int) -> str:
    return f"  {label:<58}" + "".join(c.rjust(w) for c in cells)


def table(bd: Breakdown, all_ranks: bool = False) -> list[str]:
    """The breakdown as text: per size and rank, a row per term, a column per schedule."""
    from stratac.tools.bench.report import fmt_bytes as b
    m = bd.meta
    fewer = (f" ({m['iters_large']} from {b(m['large'])})"
             if m["iters_large"] != m["iters"] and any(n >= m["large"] for n in m["sizes"]) else "")
    head = (f"# stratac bench {m['file']} --breakdown  world {m['world']}  dtype {m['dtype']}  op {m['op']}  "
            f"cores {m['cores'] or 'by size'}  iters {m['iters']}{fewer}  warmup {m['warmup']}  "
            f"({m['cpus']} CPUs, load average {m['load_before']:.1f} before, {m['load_after']:.1f} after)")
    how = ("# us per call with the model's cost accounting on: each term the mean over the calls nearest "
           "the median wall time (the fifth closest to it, at least 3: their mean wall time is the sum), the wall "
           "time the median of all; "
           "the terms of the critical core (the rank's core that returns last); * = a deliberate cost "
           "of the NPU model")
    lines = [head, how]
    c = m.get("copy_ceiling")
    if c:
        lines.insert(1, f"# copy ceiling (torch copy_ of {b(c['bytes'])}): {c['gbps_1_thread']:.2f} GB/s on 1 thread, "
                        f"{c['gbps_all_threads']:.2f} GB/s on {c['threads']} threads")
    ranks = sorted({r["rank"] for r in bd.rows})
    for size in m["sizes"]:
        for rank in ranks if all_ranks else ranks[:1]:
            rows = [r for r in bd.rows if r["size"] == size and r["rank"] == rank]
            if not rows:
                continue
            w = max(12, *(len(r["schedule"]) + 1 for r in rows))
            us = [{k: v * 1e6 for k, v in r["terms"].items()} for r in rows]
            fg = [r["figures"] for r in rows]
            lines.append("#")
            lines.append(f"# {b(size)} ({size} B), world {m['world']}, rank {rank}, "
                         f"{rows[0]['calls']} calls (the middle {rows[0]['middle_calls']} for the terms)")
            lines.append(f"# {'term':<58}" + "".join(r["schedule"].rjust(w) for r in rows))
            for key, label, deliberate in TERMS:
                lines.append(_row(("* " if deliberate else "  ") + label, [f"{t[key]:.1f}" for t in us], w))
            lines.append(_row("sum of the terms", [f"{r['sum'] * 1e6:.1f}" for r in rows], w))
            lines.append(_row("wall time of the call (time as run, median)",
                              [f"{r['wall'] * 1e6:.1f}" for r in rows], w))
            lines.append(_row("difference (wall - sum)", [f"{r['difference'] * 1e6:.1f}" for r in rows], w))
            lines.append(_row("difference / wall (%)",
                              [f"{100 * r['difference'] / r['wall'] if r['wall'] else 0:.2f}" for r in rows], w))
            lines.append(_row("time less the deliberate terms (sum - *)",
                              [f"{r['less_deliberate'] * 1e6:.1f}" for r in rows], w))
            lines.append(_row("wall time, cost accounting off (median)",
                              [f"{f['wall_plain'] * 1e6:.1f}" for f in fg], w))
            if any("mpi" in r for r in rows):
                lines.extend(_mpi_rows(rows, w))
            lines.append("# figures the deliberate terms charge (critical core) and the engines (every core "
                         "of the rank), per call")
            lines.append(_row("cores / threads", [f"{f['cores']:.0f} / {f['threads']:.0f}" for f in fg], w))
            lines.append(_row("* SQE cost charged (us) = charges x sdma_sqe_us",
                              [f"{f['crit_sqe_charged'] * 1e6:.1f} = {f['crit_sqe_charges']:.0f}x{f['sqe_us']:g}"
                               for f in fg], w))
            lines.append(_row("* UB refilled (bytes)", [b(f["crit_ub_refill_bytes"]) for f in fg], w))
            lines.append(_row("* UB staged GM->UB (MTE2 bytes)", [b(f["crit_mte_in_bytes"]) for f in fg], w))
            lines.append(_row("* D-cache calls", [f"{f['crit_dcache_ops']:.0f}" for f in fg], w))
            lines.append(_row("rank: MTE2 bytes / us", [f"{b(f['rank_mte_in_bytes'])} / {f['rank_mte_in_s'] * 1e6:.0f}"
                                                        for f in fg], w))
            lines.append(_row("rank: MTE3 bytes / us", [f"{b(f['rank_mte_out_bytes'])} / {f['rank_mte_out_s'] * 1e6:.0f}"
                                                        for f in fg], w))
            lines.append(_row("rank: SDMA bytes / SQEs", [f"{b(f['rank_sdma_bytes'])} / {f['rank_sdma_sqes']:.0f}"
                                                          for f in fg], w))
            lines.append(_row("rank: SDMA copy us, engine threads / run by cores",
                              [f"{f['rank_sdma_engine_s'] * 1e6:.0f} / {f['rank_sdma_by_core_s'] * 1e6:.0f}"
                               for f in fg], w))
            lines.append(_row("rank: own work of every core + engines / * of it (us)",
                              [f"{f['rank_busy_s'] * 1e6:.0f} / {f['rank_deliberate_s'] * 1e6:.0f}" for f in fg], w))
            lines.append(_row("rank: SQE cost charged / spun (us, all cores)",
                              [f"{f['rank_sqe_charged'] * 1e6:.0f} / {f['rank_sqe_s'] * 1e6:.0f}" for f in fg], w))
    return lines


def _mpi_rows(rows: list[dict], w: int) -> list[str]:
    """MPI beside rank 0's columns: its time, stratac's time compared the same way (each call's
    slowest rank, accounting off), and the ratios as run and less the deliberate terms."""
    ms = [r.get("mpi") or {} for r in rows]

    def cell(m, f):
        t = m.get("time_s")
        return f(m, t) if t else (m.get("note") or "-")
    us = lambda x: f"{x * 1e6:.1f}"
    out = ["# MPI beside it (the same collective and bytes, under mpirun after each size: "
           "the median over calls of each call's slowest rank; ratio = MPI's time / stratac's, > 1: stratac ahead)"]
    out.append(_row("mpi: the collective", [m.get("schedule") or "-" for m in ms], w))
    out.append(_row("mpi: time (us)", [cell(m, lambda m, t: us(t)) for m in ms], w))
    out.append(_row("stratac, slowest rank per call, accounting off (us)", [us(m.get("slowest_s", 0)) for m in ms], w))
    out.append(_row("  less the deliberate terms (the rank with fewest) (us)",
                    [us(m.get("slowest_less_deliberate_s", 0)) for m in ms], w))
    out.append(_row("ratio as run (MPI / stratac)",
                    [cell(m, lambda m, t: f"{t / m['slowest_s']:.2f}x" if m.get("slowest_s") else "-") for m in ms], w))
    out.append(_row("ratio less the deliberate terms",
                    [cell(m, lambda m, t: f"{t / m['slowest_less_deliberate_s']:.2f}x"
                          if m.get("slowest_less_deliberate_s", 0) > 0 else "-") for m in ms], w))
    return out


def to_json(bd: Breakdown) -> dict:
    return {"meta": bd.meta, "rows": bd.rows, "failures": bd.failures}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stratac.tools.bench.breakdown")
    ap.add_argument("--rank-spec", required=True)
    a = ap.parse_args(argv)
    rank_main(json.loads(a.rank_spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
