"""MoE dispatch + expert step + combine: stratac's schedules against a torch.distributed
`all_to_all_single` implementation of the same operation, same routing, results checked equal.

    python -m stratac.tools.bench.moe_vs_torch [FILE] --world 4 --tokens 128 --hidden 7168 \
        --topk 8 [--dtype bf16] [--experts E] [--iters 20] [--warmup 5]

In: a file with a dispatch/combine pair (default examples/moe_decode.strata) and the workload.
Out: per system the median over the timed calls of the slowest rank's time of the whole operation
(dispatch, the stand-in expert step of stratac.tools.run.workload, combine), and whether every
rank's y equals the reference (MoeWorkload.combined, exact). The torch side is what a user without
stratac writes on gloo: sort the routed (token, expert) rows by destination rank, exchange the row
counts, `all_to_all_single` the rows and their expert ids, apply the expert step, send the rows
back the same way, weight and sum with index_add_. Both run in the same rank processes, in turns,
each call after a host barrier (decode's precondition between a combine and the next dispatch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def rank_main(spec: dict) -> None:
    """One rank: every case of spec["cases"] in turn (its file loaded once), rank 0 printing one
    MOEVSTORCH line per case."""
    import torch
    import torch.distributed as dist

    from stratac.host.comm import Communicator

    torch.set_num_threads(1)
    rank, world = spec["rank"], spec["world"]
    dist.init_process_group("gloo", init_method=f"file://{spec['store']}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    comm = Communicator.from_process_group(heap_bytes=spec["heap"])
    mods = {}
    for case in spec["cases"]:
        if case["file"] not in mods:
            mods[case["file"]] = comm.load(case["file"])
        result = _case(comm, mods[case["file"]], {**spec, **case}, rank, world)
        if rank == 0:
            print("MOEVSTORCH " + json.dumps(result), flush=True)
    comm.close()
    dist.destroy_process_group()


def _case(comm, mod, spec: dict, rank: int, world: int) -> dict:
    """Both versions of one workload on this rank: checked against MoeWorkload.combined, then
    timed (stratac's dispatch and combine also apart)."""
    import torch
    import torch.distributed as dist

    from stratac.ir import DType
    from stratac.tools.run.worker import moe_pairs
    from stratac.tools.run.workload import MoeWorkload

    (disp, comb), = [p for p in moe_pairs(list(mod.schedules.values())) if isinstance(p, tuple)]
    tdtype = getattr(torch, DType.parse(spec["dtype"]).torch_name)
    wl = MoeWorkload.make(disp.ir, comb.ir, world, spec["tokens"], spec["hidden"], spec["topk"],
                          spec["experts"], spec["routing"])
    d, c = disp.ir.contract, comb.ir.contract
    x = comm.empty(*wl.shape(disp.ir, disp.ir.param(d.inputs[0])), dtype=tdtype)
    ids = comm.empty(*wl.shape(disp.ir, disp.ir.param(d.inputs[1])), dtype=torch.int32)
    win = comm.zeros(*wl.shape(disp.ir, disp.ir.param(d.outputs[0])), dtype=tdtype)
    counts = comm.zeros(*wl.shape(disp.ir, disp.ir.param(d.outputs[1])), dtype=torch.int32)
    weights = comm.empty(*wl.shape(comb.ir, comb.ir.param(c.inputs[2])), dtype=torch.float32)
    y = comm.empty(*wl.shape(comb.ir, comb.ir.param(c.outputs[0])), dtype=tdtype)
    seed = spec["seed"]
    x.copy_(wl.x(rank, seed, tdtype))
    ids.copy_(wl.ids(rank, seed).reshape(ids.shape))
    weights.copy_(wl.weights(rank, seed))
    want = wl.combined(rank, seed, tdtype)
    T, H, K = wl.tokens, wl.hidden, wl.topk
    local = wl.experts // world
    # what does not change between calls of the torch version (the routing is the same each call)
    flat = ids.reshape(-1).long()
    valid = flat >= 0
    phases = {"dispatch": [], "combine": []}   # stratac's phases, per timed call

    def _raw(t: torch.Tensor) -> torch.Tensor:   # gloo moves f16/bf16 rows as their bytes
        return t.view(torch.uint8) if t.element_size() == 2 else t

    def stratac_op() -> None:
        t0 = time.perf_counter()
        disp(x, ids, counts, win)
        t1 = time.perf_counter()
        wl.expert_step(win, rank, counts)
        t2 = time.perf_counter()
        comb(win, ids, weights, counts, y)
        phases["dispatch"].append(t1 - t0)
        phases["combine"].append(time.perf_counter() - t2)

    def torch_op() -> torch.Tensor:
        tok = torch.arange(T).repeat_interleave(K)[valid]
        e = flat[valid]
        dest = e // local
        order = torch.argsort(dest, stable=True)
        tok, e = tok[order], e[order]
        send_rows = x.index_select(0, tok)
        send_n = torch.bincount(dest, minlength=world)
        recv_n = torch.empty_like(send_n)
        dist.all_to_all_single(recv_n, send_n)
        rn, sn = recv_n.tolist(), send_n.tolist()
        recv_rows = torch.empty(sum(rn), H, dtype=tdtype)
        dist.all_to_all_single(_raw(recv_rows), _raw(send_rows), rn, sn)
        recv_e = torch.empty(sum(rn), dtype=torch.int64)
        dist.all_to_all_single(recv_e, e, rn, sn)
        out_rows = recv_rows * (recv_e + 1).to(tdtype).unsqueeze(1)     # the expert step
        back = torch.empty_like(send_rows)
        dist.all_to_all_single(_raw(back), _raw(out_rows), sn, rn)
        w = weights.reshape(-1)[valid][order]
        acc = torch.zeros(T, H, dtype=torch.float32)
        acc.index_add_(0, tok, back.float() * w.unsqueeze(1))
        return acc.to(tdtype)

    def timed(op, n: int) -> list[float]:
        out = []
        for _ in range(n):
            comm.barrier()
            t0 = time.perf_counter()
            op()
            out.append(time.perf_counter() - t0)
        return out

    def slowest_median(calls: list[float]) -> float:
        t = torch.tensor(calls, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)   # each call's slowest rank
        return float(t.median()) * 1e6

    result = {}
    for name, op in (("stratac", stratac_op), ("torch", torch_op)):
        comm.barrier()
        if name == "stratac":
            y.fill_(-3)
            op()
            got = y.clone()
        else:
            got = op()
        ok = bool(torch.equal(got, want))
        timed(op, spec["warmup"])
        for v in phases.values():
            v.clear()
        calls = timed(op, spec["iters"])
        flag = torch.tensor([0 if ok else 1])
        dist.all_reduce(flag)
        result[name] = {"median_us": slowest_median(calls), "ranks_wrong": int(flag)}
        if name == "stratac":
            result[name].update({f"{k}_us": slowest_median(v) for k, v in phases.items()})
    result["workload"] = {"file": Path(spec["file"]).name, "tokens": T, "hidden": H, "topk": K,
                          "experts": wl.experts, "routing": wl.routing, "dtype": spec["dtype"],
                          "world": world, "cores": {"dispatch": disp.last_cores, "combine": comb.last_cores},
                          "received_rows": wl.received_rows(seed)}
    for t in (x, ids, win, counts, weights, y):
        comm.free(t)
    return result


def heap_bytes(cases: list[dict], world: int, hidden: int, topk: int, experts: int) -> int:
    """Heap per rank for the largest case: the window of a slotted (decode) layout, experts x
    capacity (= tokens) rows, or of a packed one, world x tokens x topk rows (the larger of the two
    when the case does not say "slotted"); plus the tokens, y and metadata; at 4 bytes an element."""
    def window(c: dict) -> int:
        slotted, packed = experts * c["tokens"], world * c["tokens"] * topk
        return {True: slotted, False: packed}.get(c.get("slotted"), max(slotted, packed))
    rows = max(window(c) + 4 * c["tokens"] for c in cases)
    return rows * hidden * 4 + (8 << 20)


def measure(cases: list[dict], world: int, hidden: int, topk: int, experts: int, routing: str = "uniform",
            dtype: str = "bf16", iters: int = 20, warmup: int = 5, seed: int = 0) -> list[dict] | None:
    """Both versions of every case ({"file", "tokens"}) in one job of `world` rank processes; one
    result per case (None: a rank failed)."""
    from stratac.host import schedule
    from stratac.ir import passes
    from stratac.lang.frontend import load_source
    from stratac.targets import cpu as build
    outputs = [c.output for f in dict.fromkeys(c["file"] for c in cases)
               for c in schedule.compile_source(load_source(f), passes.Options(), worlds=[world])]
    build.build_all(outputs, [[(dtype, None)]] * len(outputs))
    heap = heap_bytes(cases, world, hidden, topk, experts)
    cases = [{**c, "file": str(Path(c["file"]).resolve())} for c in cases]
    with tempfile.TemporaryDirectory(prefix="stratac-moe-torch-") as tmp:
        procs = []
        for r in range(world):
            spec = {"rank": r, "world": world, "store": f"{tmp}/store", "heap": heap, "cases": cases,
                    "hidden": hidden, "topk": topk, "experts": experts, "routing": routing, "dtype": dtype,
                    "iters": iters, "warmup": warmup, "seed": seed}
            procs.append(subprocess.Popen([sys.executable, "-m", "stratac.tools.bench.moe_vs_torch",
                                           "--rank-spec", json.dumps(spec)], stdout=subprocess.PIPE, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1")))
        status, res = 0, []
        for p in procs:
            out, _ = p.communicate(timeout=3600)
            status |= p.returncode
            res += [json.loads(line[len("MOEVSTORCH "):]) for line in out.splitlines()
                    if line.startswith("MOEVSTORCH ")]
    return res if status == 0 and len(res) == len(cases) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stratac.tools.bench.moe_vs_torch")
    ap.add_argument("file", nargs="?", default=str(ROOT / "examples" / "moe_decode.strata"))
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--routing", default="uniform")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank-spec", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.rank_spec:
        rank_main(json.loads(a.rank_spec))
        return 0
    res = measure([{"file": a.file, "tokens": a.tokens}], a.world, a.hidden, a.topk, a.experts or 4 * a.world,
                  a.routing, a.dtype, a.iters, a.warmup, a.seed)
    if res is None:
        print("moe_vs_torch: no result (a rank failed)", file=sys.stderr)
        return 1
    (res,) = res
    w = res["workload"]
    print(f"# {w['file']}: world {w['world']}, {w['tokens']} tokens x {w['hidden']} {w['dtype']}, top-{w['topk']}, "
          f"{w['experts']} experts, {w['routing']}; {w['received_rows']} routed rows; cores {w['cores']}")
    s, t = res["stratac"], res["torch"]
    print(f"  stratac dispatch + expert step + combine: {s['median_us']:10.1f} us  (ranks wrong: {s['ranks_wrong']})")
    print(f"  torch all_to_all_single (gloo), same:      {t['median_us']:10.1f} us  (ranks wrong: {t['ranks_wrong']})")
    print(f"  stratac is {t['median_us'] / s['median_us']:.2f}x the torch version's speed")
    return 1 if s["ranks_wrong"] or t["ranks_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
