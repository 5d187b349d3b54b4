"""The bench's results in words: the nccl-tests style table, the copies table and the MoE tables,
and the JSON file.

In: a BenchResult (meta and records, as the sweeps made them). Out: the lines the CLI prints, and
--json's file, {"meta": ..., "results": ...}. fmt_bytes is here because every message of the bench
names a size the way the table does.
"""

from __future__ import annotations

import json
from pathlib import Path

from stratac.tools.bench.benchspec import BenchResult


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.4g}{unit}"
        n /= 1024
    return str(n)


def fmt_ratio(x: float | None) -> str:
    """2 decimals, or 2 significant digits below 0.1 (so a small ratio does not read 0.00x)."""
    if x is None:
        return "n/a"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _f(v, spec: str, width: int) -> str:
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}{spec}}"


def proofs_note(meta: dict) -> list[str]:
    """The header line on what proving the sweep's instances cost (tools/bench/proofs.py)."""
    p = meta.get("instance_proofs")
    if p is None:
        return []
    return [(f"# instance proofs (a call's first use of a world, sizes and rank parameters verifies "
             f"that instance; verdicts are cached beside the builds): {p['instances']} instances, "
             f"{p['seconds']:.2f} s in this run, the costliest {p['max_seconds']:.2f} s when proven, "
             f"{p['cached']} read from the cache")]


def table(res: BenchResult) -> list[str]:
    if res.meta.get("moe"):
        return moe_table(res)
    m = res.meta
    listed = m["peers"]
    peers = [p for p in listed if p != "backend"]   # columns; the backend has a table of its own
    lines = [f"# stratac bench {m['file']}  world {m['world']}  dtype {m['dtype']}  op {m['op']}  "
             f"cores {m['cores']}  iters {m['iters']}  warmup {m['warmup']}  ({m['cpus']} CPUs, load "
             f"average {m['loadavg_before']:.1f} before, {m['loadavg_after']:.1f} after)"]
    c = m["copy_ceiling"]
    lines.append(f"# copy ceiling (torch copy_ of {fmt_bytes(c['bytes'])}): "
                 f"{c['gbps_1_thread']:.2f} GB/s on 1 thread, {c['gbps_all_threads']:.2f} GB/s on "
                 f"{c['threads']} threads")
    lines.append(f"# peers: {', '.join(listed) or 'none'}"
                 + (f"  (gloo: torch.distributed {m['torch']} in stratac's rank processes)" if "gloo" in peers else "")
                 + (f"  (mpi: {m['mpi']}, mpirun -np {m['world']})" if "mpi" in peers else "")
                 + ("  (backend: dist.* on a process group of torch.distributed backend stratac in "
                    "stratac's rank processes, table at the end)" if "backend" in listed else ""))
    lines += proofs_note(m)
    lines.append("# time: median over the timed calls of each call's slowest rank; algbw = size/time, busbw = algbw x factor "
                 "(GB/s, nccl-tests); ratio = stratac busbw / peer busbw; #wrong = ranks whose "
                 "result differed from the reference; engine bytes: per rank and call, mean over ranks")
    peer_recs = {(r["system"], r["kind"], r["size"]): r for r in res.records if r["system"] != "stratac"}
    notes: list[str] = []
    by_sched: dict[str, list[dict]] = {}
    for r in res.records:
        if r["system"] == "stratac":
            by_sched.setdefault(r["schedule"], []).append(r)
    for name, recs in by_sched.items():
        lines.append("#")
        lines.append(f"# {name}: {recs[0]['kind']}, world {m['world']}"
                     + ("  (staging baseline: copies through a scratch buffer)" if recs[0]["staging"] else ""))
        head1 = f"# {'':>10} {'':>11} {'':>5} {'':>5} {'':>4} {'stratac':^35}"
        for p in peers:
            head1 += f" | {p:^36}"
        head1 += f" | {'engine bytes per rank and call':^44}"
        head2 = (f"# {'size':>10} {'count':>11} {'type':>5} {'redop':>5} {'root':>4} {'time(us)':>10} "
                 f"{'algbw':>7} {'busbw':>7} {'#wrong':>7}")
        for p in peers:
            head2 += f" | {'time(us)':>10} {'busbw':>7} {'#wrong':>6} {'ratio':>8}"
        head2 += f" | {'aiv in':>10} {'aiv out':>10} {'sdma':>10} {'copies/B':>9} {'cores':>5}"
        lines += [head1, head2]
        for r in recs:
            e = r["engines"]
            row = (f"  {r['size']:>10} {r['count']:>11} {r['dtype']:>5} {r['op'] or '-':>5} "
                   f"{'-' if r['root'] is None else r['root']:>4} {_f(r['time_us'], '.1f', 10)} "
                   f"{_f(r['algbw'], '.3f', 7)} {_f(r['busbw'], '.3f', 7)} {r['errors']:>7}")
            for p in peers:
                q = peer_recs.get((p, r["kind"], r["size"]))
                if q is None or q["time_us"] is None:
                    why = q["note"] if q else "not measured"
                    if f"# {p}: {why}" not in notes:
                        notes.append(f"# {p}: {why}")
                    row += f" | {'n/a':>10} {'n/a':>7} {'-':>6} {'-':>8}"
                    continue
                row += (f" | {q['time_us']:>10.1f} {q['busbw']:>7.3f} {q['errors']:>6} "
                        f"{fmt_ratio(r['ratio'].get(p)):>8}")
            row += (f" | {e['aiv_in']:>10.0f} {e['aiv_out']:>10.0f} {e['sdma']:>10.0f} "
                    f"{_f(r['copies_per_byte'], '.2f', 9)} {r['cores']:>5}")
            lines.append(row)
        if recs[0].get("picked"):
            lines.append("#   picked: " + ", ".join(f"{fmt_bytes(r['size'])} {r['picked']}" for r in recs))
    lines += notes
    lines += backend_table(res)
    lines += copies_table(res)
    return lines


BACKEND_ROWS = ("direct", "zero-copy", "staged", "gloo")


def backend_table(res: BenchResult) -> list[str]:
    """--vs backend: per kind, the collective through torch.distributed over backend stratac
    (zero-copy and staged) and over gloo, against the direct call of the entry point the backend
    runs, all measured in the same run; overhead = time - direct time."""
    recs = [r for r in res.records if r["system"] == "backend"]
    if not recs:
        return []
    m = res.meta
    gloo = {(r["kind"], r["size"]): r for r in res.records if r["system"] == "gloo"}
    lines = ["#", "# torch.distributed backend \"stratac\" (--vs backend): the backend's own cost per call, "
             "measured in the same run",
             "#   direct: the entry point the backend runs for the contract (its Selector over the "
             "library's schedules, stratac.distributed.collectives), called on tensors of the group's heap",
             "#   zero-copy: the dist.* call on those same tensors (stratac.distributed.empty); staged: the "
             "dist.* call on plain torch tensors, copied into the group's heap and back",
             "#   gloo: the same dist.* call over backend gloo (--vs gloo); direct, zero-copy and staged "
             "alternate call by call on one process group",
             "#   picked: the schedule the entry point ran; staged(B): bytes the backend copied in and out "
             "per call; overhead(us) = time - direct time; x direct = time / direct time"]
    kinds: dict[str, list[dict]] = {}
    for r in recs:
        kinds.setdefault(r["kind"], []).append(r)
    for kind, rows in kinds.items():
        lines.append("#")
        lines.append(f"# {kind}, world {m['world']}, {m['dtype']}"
                     + (f", op {rows[0]['op']}" if rows[0]["op"] else "")
                     + (f", root {rows[0]['root']}" if rows[0]["root"] is not None else ""))
        lines.append(f"# {'size':>10} {'row':<9} {'call':<28} {'picked':<20} {'time(us)':>10} {'#wrong':>6} "
                     f"{'staged(B)':>10} {'overhead(us)':>12} {'x direct':>8}")
        by_size: dict[int, dict[str, dict]] = {}
        for r in rows:
            by_size.setdefault(r["size"], {})[r["variant"]] = r
        for size, at in by_size.items():
            if (kind, size) in gloo:
                at["gloo"] = gloo[(kind, size)]
            for v in BACKEND_ROWS:
                r = at.get(v)
                if r is None:
                    continue
                staged = "-" if r.get("staged_bytes") is None else str(r["staged_bytes"])
                over = r.get("overhead_us")
                errors = "-" if r["errors"] is None else str(r["errors"])
                lines.append(f"  {size:>10} {v:<9} {r['schedule']:<28} {r.get('picked') or '-':<20} "
                             f"{_f(r['time_us'], '.1f', 10)} {errors:>6} {staged:>10} "
                             f"{'-' if v == 'direct' else 'n/a' if over is None else f'{over:+.1f}':>12} "
                             f"{'-' if v == 'direct' else fmt_ratio(r.get('x_direct')):>8}")
    for r in recs:
        if r.get("note"):
            note = f"# backend: {r['note']}"
            if note not in lines:
                lines.append(note)
    return lines


def copies_table(res: BenchResult) -> list[str]:
    """Copies and engines at the largest size: per engine, per payload byte, against the minimum."""
    ours = [r for r in res.records if r["system"] == "stratac"]
    if not ours:
        return []
    top = max(r["size"] for r in ours)
    at = [r for r in ours if r["size"] == top] or ours
    lines = ["#", f"# copies and engines at {fmt_bytes(top)} (bytes per payload byte S, per rank and "
             "call, mean over ranks; CPU model counters)",
             "#   copies/B = (aiv out + sdma) / S, the bytes landed in GM; min = what the contract "
             "must land; fabric/B = (remote read + remote write) / S; min = what must cross between ranks",
             f"# {'schedule':<28} {'aiv in/B':>8} {'aiv out/B':>9} {'sdma/B':>7} {'copies/B':>8} "
             f"{'min':>5} {'extra/B':>7} {'fabric/B':>8} {'min':>5} {'core max/mean':>13} {'heap/rank':>10}"]
    for r in at:
        s, e = r["size"], r["engines"]
        extra = r["copies_per_byte"] - r["min_copies_per_byte"]
        lines.append(f"  {r['schedule']:<28} {e['aiv_in'] / s:>8.2f} {e['aiv_out'] / s:>9.2f} "
                     f"{e['sdma'] / s:>7.2f} {r['copies_per_byte']:>8.2f} {r['min_copies_per_byte']:>5.2f} "
                     f"{extra:>7.2f} {r['fabric_per_byte']:>8.2f} {r['min_fabric_per_byte']:>5.2f} "
                     f"{_f(r['core_balance'], '.2f', 13)} {fmt_bytes(r['heap_bytes']):>10}")
        if len({(p["aiv_in"], p["aiv_out"], p["sdma"]) for p in r["per_rank"]}) > 1:
            for p in r["per_rank"]:
                lines.append(f"    rank {p['rank']:<21} {p['aiv_in'] / s:>8.2f} {p['aiv_out'] / s:>9.2f} "
                             f"{p['sdma'] / s:>7.2f} {(p['aiv_out'] + p['sdma']) / s:>8.2f}")
    for kind in sorted({r["kind"] for r in at}):
        same = [r for r in at if r["kind"] == kind]
        best = min(same, key=lambda r: r["copies_per_byte"])
        for r in same:
            if r["staging"] and r is not best:
                d = r["copies_per_byte"] - best["copies_per_byte"]
                lines.append(f"# {r['schedule']} lands {r['copies_per_byte']:.2f} B per payload byte, "
                             f"{best['schedule']} {best['copies_per_byte']:.2f}: the staging copies are "
                             f"{d:.2f} B/B more ({d * s:.0f} bytes per rank and call at this size), "
                             f"and {fmt_bytes(r['heap_bytes'] - best['heap_bytes'])} more heap per rank")
    return lines


def moe_table(res: BenchResult) -> list[str]:
    m = res.meta
    mo = m["moe"]
    lines = [f"# stratac bench {m['file']}  world {m['world']}  dtype {m['dtype']}  cores {m['cores']}  "
             f"iters {m['iters']}  warmup {m['warmup']}  ({m['cpus']} CPUs, load average "
             f"{m['loadavg_before']:.1f} before, {m['loadavg_after']:.1f} after)"]
    c = m["copy_ceiling"]
    lines.append(f"# copy ceiling (torch copy_ of {fmt_bytes(c['bytes'])}): "
                 f"{c['gbps_1_thread']:.2f} GB/s on 1 thread, {c['gbps_all_threads']:.2f} GB/s on "
                 f"{c['threads']} threads")
    lines.append(f"# MoE dispatch/combine, tokens per rank swept, routings {', '.join(mo['routings'])}; "
                 "peers: none (neither gloo nor MPI has a routed dispatch/combine)")
    lines += proofs_note(m)
    lines.append("# recv: bytes each rank receives in dispatch, mean over ranks (DeepEP's count: routed "
                 "(token, expert) rows x hidden x element size); time: median over the timed calls of each call's slowest rank; "
                 "algbw = recv / time (GB/s, GB = 1e9 B); op: the whole operation, dispatch + the host's "
                 "stand-in expert step + combine, timed the same way; max/mean: bytes of the busiest vector core "
                 "(aiv in + aiv out + sdma, CPU model counters) over the mean of all cores, worst rank; "
                 "#wrong: ranks whose counts, window or combined y differed from torch")
    by_pair: dict[str, list[dict]] = {}
    for r in res.records:
        by_pair.setdefault(r["dispatch"], []).append(r)
    for d_name, recs in by_pair.items():
        c_name = recs[0]["combine"]
        lines.append("#")
        lines.append(f"# {d_name}" + (f" + {c_name}" if c_name else " (dispatch only)")
                     + f", world {m['world']}")
        head1 = (f"# {'':>6} {'':>6} {'':>4} {'':>7} {'':>8} {'':>10} | {'dispatch':^26} | {'combine':^26} "
                 f"| {'whole':^10} |")
        head2 = (f"# {'tokens':>6} {'hidden':>6} {'topk':>4} {'experts':>7} {'routing':>8} {'recv(B)':>10} "
                 f"| {'time(us)':>10} {'algbw':>7} {'max/mean':>8} | {'time(us)':>10} {'algbw':>7} "
                 f"{'max/mean':>8} | {'op(us)':>10} | {'#wrong':>6}")
        lines += [head1, head2]
        for r in recs:
            comb = (f"{_f(r['combine_us'], '.1f', 10)} {_f(r['combine_algbw'], '.3f', 7)} "
                    f"{_f(r['combine_core_max_mean'], '.2f', 8)}" if r["combine"] else
                    f"{'-':>10} {'-':>7} {'-':>8}")
            lines.append(f"  {r['tokens']:>6} {r['hidden']:>6} {r['topk']:>4} {r['experts']:>7} "
                         f"{r['routing']:>8} {r['recv_bytes']:>10} | {_f(r['dispatch_us'], '.1f', 10)} "
                         f"{_f(r['algbw'], '.3f', 7)} {_f(r['core_max_mean'], '.2f', 8)} | {comb} | "
                         f"{_f(r['op_us'], '.1f', 10)} | {r['errors']:>6}")
        lines += moe_balance_table(res, recs)
    for r in res.records:
        for why in r["why"]:
            lines.append(f"# wrong: {r['dispatch']} tokens {r['tokens']} {r['routing']}: {why}")
    return lines


def moe_balance_table(res: BenchResult, recs: list[dict]) -> list[str]:
    """Dispatch's per-core balance: stratac's partition (measured) against one core per peer
    (computed from the same routing)."""
    m = res.meta
    w, cores = m["world"], recs[0]["cores"]
    idle = f"{w} of the {cores} cores busy, max/mean over those {w}" if cores > w else \
        f"{w} cores, one per destination rank"
    lines = ["#",
             f"# core balance of {recs[0]['dispatch']}, world {w}, {cores} cores: bytes per core, the "
             "busiest core over the mean, worst rank",
             f"#   stratac: MEASURED, CPU model counters of one checked dispatch call (aiv in + aiv out "
             f"+ sdma per core): the routed rows split evenly over all {cores} cores",
             "#   one core per peer: COMPUTED FROM THE ROUTING, NOT MEASURED: the partition of HCCL and "
             "the SHMEM examples, core p of rank r carries every row r routes to rank p (rows x hidden "
             f"x element size, the same routing draw as the counters); {idle}",
             "#   busiest x = the one-core-per-peer partition's busiest core / stratac's busiest core, "
             "in bytes (the busiest core bounds the call)",
             f"# {'':>6} {'':>8} | {'stratac (measured)':^20} | {'one core per peer (computed)':^30}",
             f"# {'tokens':>6} {'routing':>8} | {'max/mean':>8} {'busiest(B)':>11} | {'max/mean':>8} "
             f"{'busiest(B)':>11} {'busiest x':>9}"]
    for r in recs:
        lines.append(f"  {r['tokens']:>6} {r['routing']:>8} | {_f(r['core_max_mean'], '.2f', 8)} "
                     f"{r['core_max_bytes']:>11} | {_f(r['per_peer_max_mean'], '.2f', 8)} "
                     f"{_f(r['per_peer_max_bytes'], 'd', 11)} {_f(r['busiest_ratio'], '.2f', 9)}")
    return lines


def write_json(res: BenchResult, path: str) -> None:
    Path(path).write_text(json.dumps({"meta": res.meta, "results": res.records}, indent=1) + "\n")
