"""Where the time of one small call goes: the per-call cost breakdown of a schedule on the CPU build.

    python -m stratac.tools.bench.callprofile FILE --world 2 --size 4K [--cores N] [--iters 300]

Starts `world` rank processes (a FileStore, no process group), loads every schedule of FILE through
the public API (Communicator.from_store, comm.load) and, per schedule, after warm-up calls:

* times `iters` back-to-back calls (perf_counter around the whole call) and, inside each, the
  launcher's cffi call (the generated `strata_launch_*`, wrapped): python = call - launch;
  and the rank process's CPU time over those calls (time.process_time: every thread of it, the
  core workers and SDMA engine threads included), per call: what a call costs the machine's CPUs
  whatever the load, where the wall times move with other processes;
* profiles the Python side with cProfile over the same number of calls (the top functions by own
  time), so that the argument checks, the proof lookup and the cffi argument conversion show;
* traces `traced` more calls with the CPU model's trace (CLOCK_MONOTONIC, like time.monotonic)
  and splits the launch: handoff (launch entered -> the first core runs its kernel, which includes
  waking the core threads and filling each UB with 0xff), per-core kernel time split into waits
  (flag waits / world barrier, SyncAll, SDMA quiet) and work (stages minus waits: copies,
  reductions), and join (the last core returns -> the launcher returns).

Medians over the calls, rank 0's view (both ranks print with --all-ranks). This is a measuring tool
for docs/bench.md ("Small messages: where the time goes"), not a test. The rank processes and the
calls' set-up are callruns' (shared with `stratac bench --breakdown`, which splits a call further
with the CPU model's cost accounting).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stratac.tools.bench import callruns


def _median(xs):
    return statistics.median(xs) if xs else 0.0


def _trace_breakdown(events: list[dict], t_launch0: float, t_launch1: float) -> dict:
    """One traced call's spans (us) -> handoff, per-core kernel/wait/work, join."""
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        return {}
    waits: dict[int, float] = {}
    syncall: dict[int, float] = {}
    for e in events:
        if e.get("cat") == "wait" and e["tid"] < 1000:
            if e["name"] == "SyncAll":
                syncall[e["tid"]] = syncall.get(e["tid"], 0.0) + e["dur"]
            else:
                waits[e["tid"]] = waits.get(e["tid"], 0.0) + e["dur"]
    first = min(k["ts"] for k in kernels)
    last = max(k["ts"] + k["dur"] for k in kernels)
    per_core = [k["dur"] for k in kernels]
    work = [k["dur"] - waits.get(k["tid"], 0.0) - syncall.get(k["tid"], 0.0) for k in kernels]
    sdma = [e["dur"] for e in events if e["tid"] >= 1000]
    return {"cores": len(kernels), "handoff_us": first - t_launch0 * 1e6,
            "last_start_us": max(k["ts"] for k in kernels) - t_launch0 * 1e6,
            "flag_wait_max_us": max(waits.values(), default=0.0),
            "first_to_last_us": last - first, "join_us": t_launch1 * 1e6 - last,
            "kernel_us": _median(per_core), "kernel_max_us": max(per_core),
            "flag_wait_us": _median([waits.get(k["tid"], 0.0) for k in kernels]),
            "syncall_us": _median([syncall.get(k["tid"], 0.0) for k in kernels]),
            "work_us": _median(work), "work_max_us": max(work),
            "sdma_copy_us": sum(sdma), "sdma_copies": len(sdma)}


def rank_main(spec: dict) -> None:
    comm = callruns.open_comm(spec, "prof")
    mod = comm.load(spec["file"])
    out = []
    tmp = Path(spec["tmp"])
    for name, fn in mod.schedules.items():
        count, args, tensors = callruns.workload_args(comm, fn, spec["world"], spec["size"], spec["dtype"])
        kw = {} if spec["cores"] is None else {"cores": spec["cores"]}
        timer = callruns.LaunchTimer(fn)
        launch_times = timer.times
        for _ in range(spec["warmup"]):
            fn(**args, **kw)
        comm.barrier()
        launch_times.clear()
        calls = []
        cpu0 = time.process_time()   # every thread of the rank: caller, core workers, SDMA engines
        for _ in range(spec["iters"]):
            t0 = time.monotonic()
            fn(**args, **kw)
            calls.append(time.monotonic() - t0)
        cpu_per_call = (time.process_time() - cpu0) / max(1, spec["iters"])
        launches = [b - a for a, b in launch_times]
        comm.barrier()
        # cProfile of the same calls (its own overhead inflates them: read the split, not the sum)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(spec["iters"]):
            fn(**args, **kw)
        prof.disable()
        comm.barrier()
        st = pstats.Stats(prof)
        funcs = sorted(((v[2], f"{Path(k[0]).name}:{k[1]}({k[2]})", v[1]) for k, v in st.stats.items()),
                       reverse=True)[:12]
        # traced calls
        traces = []
        for i in range(spec["traced"]):
            comm.barrier()
            launch_times.clear()
            comm._lib.strata_cpu_trace_enable(1)
            fn(**args, **kw)
            comm._lib.strata_cpu_trace_enable(0)
            path = tmp / f"r{spec['rank']}-{name}-{i}.jsonl"
            comm._lib.strata_cpu_trace_write(str(path).encode())
            events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            traces.append(_trace_breakdown(events, *launch_times[-1]))
        timer.restore()
        comm.barrier()
        keys = traces[0].keys() if traces else ()
        tb = {k: _median([t[k] for t in traces]) for k in keys}
        out.append({"schedule": name, "rank": spec["rank"], "count": count,
                    "call_us": _median(calls) * 1e6, "launch_us": _median(launches) * 1e6,
                    "cpu_us": cpu_per_call * 1e6,
                    "python_us": _median([c - lt for c, lt in zip(calls, launches)]) * 1e6,
                    "trace": tb,
                    "cprofile": [{"own_s_per_call": t / spec["iters"], "func": f, "calls_per_call":
                                  n / spec["iters"]} for t, f, n in funcs]})
        callruns.free_tensors(comm, fn, tensors)
    callruns.emit(out)
    comm.close()


def main(argv=None) -> int:
    from stratac.tools.options import byte_size
    ap = argparse.ArgumentParser(prog="python -m stratac.tools.bench.callprofile")
    ap.add_argument("file", nargs="?")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--size", type=byte_size, default=4096)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--traced", type=int, default=20)
    ap.add_argument("--all-ranks", action="store_true")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--rank-spec", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_spec:
        rank_main(json.loads(a.rank_spec))
        return 0
    if a.file is None:
        ap.error("FILE is required")
    callruns.warm_build(a.file, a.world, dtype=a.dtype)   # warm the cache before the ranks start
    with tempfile.TemporaryDirectory(prefix="stratac-prof-") as tmp:
        specs = [{"file": str(Path(a.file).resolve()), "rank": r, "world": a.world,
                  "store": f"{tmp}/store", "heap": 64 << 20 if a.size < 8 << 20 else 8 * a.size,
                  "size": a.size, "dtype": a.dtype, "cores": a.cores, "iters": a.iters,
                  "warmup": a.warmup, "traced": a.traced, "tmp": tmp} for r in range(a.world)]
        results, status, errors = callruns.run_ranks("stratac.tools.bench.callprofile", specs, timeout=600)
    results = [rec for per_rank in results for rec in per_rank]
    for e in errors:
        print(e, file=sys.stderr)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    for r in results:
        if r["rank"] != 0 and not a.all_ranks:
            continue
        t = r["trace"]
        print(f"# {r['schedule']} rank {r['rank']}: world {a.world}, {a.size} B {a.dtype}, "
              f"cores {t.get('cores')}, median of {a.iters} calls ({a.traced} traced)")
        print(f"  call {r['call_us']:9.1f} us = python {r['python_us']:8.1f} + launch {r['launch_us']:8.1f}"
              f"  (CPU time of the rank process per call, all its threads: {r['cpu_us']:.1f} us)")
        if t:
            print(f"  launch (traced): handoff {t['handoff_us']:8.1f} (last core starts at "
                  f"{t['last_start_us']:.1f})  first core start->last core end "
                  f"{t['first_to_last_us']:8.1f}  join {t['join_us']:7.1f}")
            print(f"  per core (median): kernel {t['kernel_us']:8.1f} (max {t['kernel_max_us']:.1f}) = "
                  f"flag waits {t['flag_wait_us']:8.1f} (max {t['flag_wait_max_us']:.1f}) + SyncAll {t['syncall_us']:8.1f} + work "
                  f"{t['work_us']:7.1f} (max {t['work_max_us']:.1f}); sdma {t['sdma_copies']} copies "
                  f"{t['sdma_copy_us']:.1f} us")
        print("  cProfile, own time per call:")
        for f in r["cprofile"][:8]:
            print(f"    {f['own_s_per_call'] * 1e6:8.1f} us  x{f['calls_per_call']:<5.1f} {f['func']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
