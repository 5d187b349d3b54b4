"""The MoE sweep: a file of MoE schedules (moe_dispatch/moe_combine, alltoallv) sweeps tokens per
rank and routings instead of sizes.

In: a BenchSpec whose file holds MoE schedules (moe_file says whether it does, and refuses options
that do not fit). Out: a BenchResult with one record per dispatch/combine pair, routing and tokens:
dispatch and combine times, received bytes per rank as DeepEP counts them, algbw = received bytes /
time, and the dispatch's per-core balance (CPU model counters) beside the balance a
one-core-per-peer partition would have, computed from the same routing. No peers.

One stratac job, one runner.Case per (routing, tokens); each case runs every dispatch/combine pair
of the file (the worker: dispatch, the host's stand-in expert step, combine; checked before and
after the timed calls). A record per pair, routing and tokens joins the two phases.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from stratac.host import schedule
from stratac.host.cores import by_size as cores_by_size
from stratac.ir import DType, passes
from stratac.lang.frontend import load_source, schedules
from stratac.tools.bench import benchpeer, machine, proofs
from stratac.tools.bench.benchspec import (
    DEFAULT_SIZES,
    MOE_TOKENS,
    BenchError,
    BenchResult,
    BenchSpec,
    BenchUsageError,
)
from stratac.tools.bench.progress import Progress
from stratac.tools.options import parse_counts, parse_sizes
from stratac.tools.run import runner, workload
from stratac.verify.routing import expert_ids

_MOE_OPTIONS = (("tokens", "--tokens"), ("hidden", "--hidden"), ("topk", "--topk"),
                ("experts", "--experts"), ("routings", "--routing"), ("max_recv", "--max-recv"),
                ("capacity", "--capacity"))
PER_PEER_SOURCE = "computed from the routing (stratac.verify.routing.expert_ids), not measured"


def moe_file(spec: BenchSpec) -> list[tuple[str, str | None]] | None:
    """None for a file of collectives; for a file of MoE schedules its (dispatch, combine or None)
    pairs in file order, once the options are known to fit a MoE bench (BenchUsageError if not)."""
    scheds = schedules(load_source(spec.file))
    moe = [s.name for s in scheds if s.contract.kind.moe]
    given = [flag for key, flag in _MOE_OPTIONS if getattr(spec, key) is not None]
    if not moe:
        if given:
            raise BenchUsageError(f"{', '.join(given)} apply to MoE dispatch/combine schedules and "
                                  f"{spec.file} holds none: its collectives sweep --sizes")
        return None
    others = [s.name for s in scheds if not s.contract.kind.moe]
    if others:
        raise BenchUsageError(f"{spec.file} mixes MoE schedules ({', '.join(moe)}) with collectives "
                              f"({', '.join(others)}): MoE schedules sweep --tokens, collectives "
                              "--sizes; bench them from separate files")
    if spec.peers:
        raise BenchUsageError(f"--vs {','.join(spec.peers)}: no peer is available for MoE dispatch/"
                              "combine (neither gloo nor MPI has a routed dispatch or combine to run "
                              "side by side); drop --vs to measure stratac alone")
    if spec.trace:
        raise BenchUsageError("--trace records collectives only; MoE dispatch/combine runs record no "
                              "trace yet: drop --trace")
    if spec.sizes is not None and spec.sizes != parse_sizes(DEFAULT_SIZES):
        raise BenchUsageError(f"--sizes sweeps the bytes of a collective, and {spec.file} holds MoE "
                              "schedules: sweep --tokens (with --hidden, --topk, --experts, --routing)")
    problem = workload.layout_options_problem(scheds, spec.max_recv, spec.capacity)
    if problem:
        raise BenchUsageError(f"{spec.file}: {problem}")
    return moe_pairs(scheds)


def moe_pairs(scheds) -> list[tuple[str, str | None]]:
    """(dispatch, combine) names in file order, paired as `stratac run` pairs them
    (workload.moe_pairs); an alltoallv alone (None)."""
    try:
        items = workload.moe_pairs(scheds)
    except workload.PairingError as exc:
        raise BenchUsageError(str(exc)) from None
    return [(d.name, c.name if c else None) for d, c in (i for i in items if isinstance(i, tuple))]


def _moe_cases(spec: BenchSpec) -> list[runner.Case]:
    for r in spec.routings or ["uniform"]:
        problem = workload.moe_options_problem(spec.world, spec.topk, spec.experts, r)
        if problem:
            raise BenchUsageError(problem)
    for key, flag in _MOE_OPTIONS[1:4]:
        v = getattr(spec, key)
        if v is not None and v < 1:
            raise BenchUsageError(f"{flag} must be at least 1, got {v}")
    tokens = spec.tokens or parse_counts(MOE_TOKENS)
    return [runner.Case(dtype=spec.dtype, tokens=t, hidden=spec.hidden, topk=spec.topk,
                        experts=spec.experts, routing=r, max_recv=spec.max_recv,
                        capacity=spec.capacity)
            for r in (spec.routings or ["uniform"]) for t in tokens]


def moe_memory_needed(rspec: runner.RunSpec, compiled) -> int:
    """A generous estimate of the run's peak memory: per rank the heap, the torch reference check
    (the expected window about three times over, y in float64) and 300 MB per process."""
    heap = rspec.heap_bytes or runner.heap_bytes(rspec, compiled)
    ref = 0
    for case in rspec.cases:
        for wl in runner.moe_workloads(rspec, case, compiled):
            d = wl.dispatch
            rows = wl.shape(d, d.param(d.contract.outputs[0]))[0]
            elem = DType.parse(case.dtype).nbytes
            ref = max(ref, 3 * rows * wl.hidden * elem + 16 * wl.tokens * wl.hidden)
    return rspec.world * (heap + ref + (300 << 20))


# --two-pass-places: the name of an MoE schedule's twin built with passes.Options(join_places=False)
# (its places of rows and of their scales each scan the ids), as stratac.tools.run.worker names it
TWO_PASSES = " (two passes)"


def run(spec: BenchSpec, pairs: list[tuple[str, str | None]], echo=print) -> BenchResult:
    """The MoE bench: every (routing, tokens) case of spec on every dispatch/combine pair."""
    if spec.world < 1:
        raise BenchUsageError(f"--world must be at least 1, got {spec.world}")
    cases = _moe_cases(spec)
    tokens = sorted({c.tokens for c in cases})
    meta: dict = {"file": str(spec.file), "world": spec.world, "dtype": spec.dtype,
                  "iters": spec.iters, "warmup": spec.warmup, "cores": spec.cores, "peers": [],
                  "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0],
                  "moe": {"pairs": [{"dispatch": d, "combine": c} for d, c in pairs],
                          "tokens": tokens, "hidden": spec.hidden or workload.MOE_DEFAULTS["hidden"],
                          "topk": spec.topk or workload.MOE_DEFAULTS["topk"],
                          "experts": spec.experts or workload.MOE_DEFAULTS["experts_per_rank"] * spec.world,
                          "routings": list(spec.routings or ["uniform"]), "seed": spec.seed,
                          "per_peer": PER_PEER_SOURCE}}
    meta["torch"] = torch.__version__
    meta["copy_ceiling"] = machine.copy_ceiling(spec.ceiling_bytes)   # before anything else runs
    opts = passes.Options(soc=spec.soc, cores=spec.cores)
    opts.check()
    compiled = schedule.compile_source(load_source(spec.file), opts, worlds=[spec.world])
    meta["cores"] = spec.cores or cores_by_size(compiled[0].schedule.kernel.cores, spec.world)
    rspec = runner.RunSpec(file=spec.file, world=spec.world, cases=cases, iters=spec.iters,
                           warmup=spec.warmup, timeout=spec.timeout, check=True, seed=spec.seed,
                           soc=spec.soc, cores=spec.cores)
    rspec.heap_bytes = runner.heap_bytes(rspec, compiled)
    meta["instance_proofs"] = proofs.prove(spec.world, [
        (s, wl.sizes(s)) for case in cases for wl in runner.moe_workloads(rspec, case, compiled)
        for s in (wl.dispatch, wl.combine) if s is not None])
    need, avail = moe_memory_needed(rspec, compiled), machine.mem_available()
    if avail is not None and need > 0.8 * avail:   # an OOM kill would take other processes too
        raise BenchError(f"the largest case needs about {need / 2**30:.1f} GiB of memory ({spec.world} "
                         f"ranks: heap, reference check) but {avail / 2**30:.1f} GiB are available: "
                         f"lower the largest --tokens (now {tokens[-1]}) or --hidden")
    with tempfile.TemporaryDirectory(prefix="stratac-bench-") as tmp:
        gate = benchpeer.Gate(Path(tmp) / "gate")   # no peers: the marks only drive the progress bar
        gate.path.mkdir()
        rspec.bench = {"peers": [], "tasks": [[] for _ in cases], "gate": str(gate.path),
                       "iters": spec.iters, "warmup": spec.warmup, "peer_timeout": spec.timeout * 4,
                       "trace": None, "two_pass_places": spec.two_pass_places}
        with Progress(gate, cases, False, spec.progress):
            outcome = runner.run(rspec, echo=echo)
    meta["loadavg_after"] = os.getloadavg()[0]
    if spec.two_pass_places:   # each pair's twin built with its places not joined, run right after it
        pairs = [p for d, c in pairs for p in ((d, c), (d + TWO_PASSES, c + TWO_PASSES if c else None))]
    records = moe_records(outcome.results, pairs, spec)
    exit_code = outcome.exit_code or (1 if outcome.failures else 0)
    return BenchResult(meta, records, list(outcome.failures), exit_code)


def _core_bytes(rec: dict) -> list[int]:
    """Bytes each vector core moved in one call: aiv in + aiv out + sdma (the copies it posted)."""
    return [c["mte_in"] + c["mte_out"] + c["sdma"] for c in rec["counters"]]


def _max_mean(xs: list[int]) -> float | None:
    mean = sum(xs) / len(xs) if xs else 0
    return max(xs) / mean if mean else None


def _phase(ranks: list[dict]) -> dict:
    """One phase over all ranks: time, per-core balance (the worst rank's), engine bytes (mean)."""
    cores = [_core_bytes(r) for r in ranks]
    balances = [b for b in map(_max_mean, cores) if b is not None]
    n = len(ranks)
    engines = {k: sum(sum(c[src] for c in r["counters"]) for r in ranks) / n
               for k, src in (("aiv_in", "mte_in"), ("aiv_out", "mte_out"), ("sdma", "sdma"),
                              ("remote_read", "remote_read"), ("remote_write", "remote_write"),
                              ("sdma_posts", "sdma_posts"), ("sdma_sqes", "sdma_sqes"))}
    t = ranks[0]["time_s"]
    return {"time_us": t * 1e6 if t and t > 0 else None,
            "max_mean": max(balances) if balances else None,
            "max_bytes": max((max(c) for c in cores if c), default=0),
            "engines": engines, "core_bytes": cores}


def per_peer_bytes(routing: str, world: int, tokens: int, topk: int, experts: int, row_bytes: int,
                   seed: int) -> list[list[int]]:
    """[source rank][destination rank]: the bytes a one-core-per-peer partition puts on rank
    source's core for destination (every row it routes there, the rank itself included), from the
    routing alone: stratac.verify.routing.expert_ids, expert e owned by rank e // (experts / world)."""
    local = experts // world
    out = []
    for r in range(world):
        ids = expert_ids(routing, r, tokens, topk, experts, seed)
        owners = ids[ids >= 0].astype(np.int64) // local
        out.append([int(n) * row_bytes for n in np.bincount(owners, minlength=world)])
    return out


def moe_records(results: list[dict], pairs: list[tuple[str, str | None]], spec: BenchSpec) -> list[dict]:
    """One record per dispatch/combine pair, routing and tokens (both phases joined)."""
    elem = DType.parse(spec.dtype).nbytes
    pair_of = {}
    for i, (d, c) in enumerate(pairs):
        pair_of[d] = pair_of[c] = i
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in results:
        m = r.get("moe")
        if not m or r["schedule"] not in pair_of:
            continue
        key = (pair_of[r["schedule"]], m["routing"], m["tokens"])
        groups.setdefault(key, {"dispatch": [], "combine": []})[m["phase"]].append(r)
    routings = list(spec.routings or ["uniform"])
    out = []
    for key in sorted(groups, key=lambda k: (k[0], routings.index(k[1]) if k[1] in routings else 99, k[2])):
        d_name, c_name = pairs[key[0]]
        ph = groups[key]
        dr = sorted(ph["dispatch"], key=lambda r: r["rank"])
        cr = sorted(ph["combine"], key=lambda r: r["rank"])
        if not dr:
            continue
        r0, m = dr[0], dr[0]["moe"]
        w = r0["world"]
        disp = _phase(dr)
        comb = _phase(cr) if cr else None
        errors = max(r["ranks_wrong"] for r in dr + cr)
        recv = r0["size"]
        seed = m["counters_seed"]   # the routing of the call the counters were read in
        peer = None if seed is None else per_peer_bytes(
            m["routing"], w, m["tokens"], m["topk"], m["experts"], m.get("row_bytes") or m["hidden"] * elem, seed)
        peer_bal = [b for b in map(_max_mean, peer or []) if b is not None]
        peer_max = max((max(p) for p in peer), default=0) if peer else None
        algbw = lambda ph: recv / ph["time_us"] / 1e3 if ph and ph["time_us"] else None
        out.append({
            "system": "stratac", "kind": "moe", "schedule": d_name, "dispatch": d_name,
            "combine": c_name, "world": w, "dtype": r0["dtype"], "tokens": m["tokens"],
            "hidden": m["hidden"], "topk": m["topk"], "experts": m["experts"],
            "routing": m["routing"], "capacity": m["capacity"], "window_rows": m["window_rows"],
            "cores": r0["cores"], "recv_bytes": recv,
            "dispatch_us": disp["time_us"], "combine_us": comb["time_us"] if comb else None,
            "op_us": r0["op_time_s"] * 1e6,
            "algbw": algbw(disp), "combine_algbw": algbw(comb),
            "core_max_mean": disp["max_mean"], "core_max_bytes": disp["max_bytes"],
            "combine_core_max_mean": comb["max_mean"] if comb else None,
            "per_peer_max_mean": max(peer_bal) if peer_bal else None,
            "per_peer_max_bytes": peer_max, "per_peer_cores": w, "per_peer_bytes": peer,
            "per_peer_seed": seed, "per_peer_source": PER_PEER_SOURCE,
            "busiest_ratio": (peer_max / disp["max_bytes"] if peer_max is not None and disp["max_bytes"]
                              else None),
            "errors": errors, "why": [r["why"] for r in dr + cr if r["why"]],
            "heap_bytes": max(r["heap_bytes"] for r in dr),
            "dispatch_engines": disp["engines"], "combine_engines": comb["engines"] if comb else None,
            "per_rank": [{"rank": r["rank"], "dispatch_core_bytes": disp["core_bytes"][i],
                          "combine_core_bytes": comb["core_bytes"][i] if comb and i < len(cr) else None}
                         for i, r in enumerate(dr)],
        })
    return out
