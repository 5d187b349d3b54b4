"""One rank of `stratac run`: `python -m stratac.tools.run.worker SPEC`, as stratac.tools.run.runner
runs it (forked from a server that imported torch once: stratac.tools.run.procs).

Bootstraps torch.distributed (gloo) from the file store the runner made, builds a Communicator
(the same public API users call), runs every schedule of the file on heap tensors, checks the
results against torch, and prints one JSON line per schedule (prefix RESULT_PREFIX).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from datetime import timedelta

RESULT_PREFIX = "STRATAC-RESULT "


def main(spec_text: str) -> int:
    spec = json.loads(spec_text)
    import torch
    import torch.distributed as dist

    from stratac.diagnostics import StrataError
    from stratac.host.comm import Communicator
    from stratac.host.errors import StrataRuntimeError, StrataUsageError
    from stratac.ir import passes

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
        if spec.get("target") == "npu":   # the same API on SHMEM's heap (stratac.host.npu_comm)
            from stratac.targets.npu import NpuCommunicator
            comm = NpuCommunicator.from_process_group(heap_bytes=spec["heap_bytes"])
        else:
            comm = Communicator.from_process_group(heap_bytes=spec["heap_bytes"],
                                                   timeout=spec["timeout"], segment=spec["segment"])
        opts = passes.Options(soc=spec["soc"], cores=spec["cores"])
        mods = [comm.load(f, options=opts, selection=spec.get("selection")) for f in spec["files"]]
        bench = spec.get("bench")   # `stratac bench`: peers measured between cases (benchpeer)
        if bench:
            from stratac.tools.bench import benchpeer
            benchpeer.before_cases(bench)
        fns = [fn for mod in mods for fn in mod.schedules.values()]
        # `stratac bench --agreement-cost`: each collective, then its twin without strata::Agree;
        # `--two-pass-places`: each MoE pair, then its twin whose places are not joined
        twins = {}
        for flag, change, suffix in (("agreement_cost", {"agreement": False}, " (no agreement)"),
                                     ("two_pass_places", {"join_places": False}, " (two passes)")):
            if bench and bench.get(flag):            # the suffixes: bench.sweep.UNCHECKED, bench.moe.TWO_PASSES
                twins = {name: fn for f in spec["files"]
                         for name, fn in comm.load(f, options=replace(opts, **change)).schedules.items()}
                for twin in twins.values():
                    twin.name += suffix
        if spec.get("selected"):   # each contract's selecting entry point instead of its schedules
            fns = [SelectedCall(sel) for mod in mods for sel in mod.selectors.values()] + \
                [fn for fn in fns if fn.ir.contract.kind.moe]
        for i, case in enumerate(spec["cases"]):
            for item in moe_pairs(fns):
                if isinstance(item, tuple):
                    results = _run_moe(comm, *item, case, spec, rank, world)
                    if item[0].ir.name in twins:
                        results += _run_moe(comm, *(twins[f.ir.name] if f else None for f in item),
                                            case, spec, rank, world)
                else:
                    results = [_run_case(comm, fn, case, spec, rank, world) for fn in
                               [item] + ([twins[item.ir.name]] if item.ir.name in twins else [])]
                for result in results:
                    print(RESULT_PREFIX + json.dumps(result), flush=True)
            more = _backend_peer(bench, i, rank, world) if bench else None
            for rec in benchpeer.after_case(bench, i, rank, world, more) if bench else ():
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


def _backend_peer(bench: dict, index: int, rank: int, world: int):
    """`stratac bench --vs backend`: the measurements of case `index` on the torch.distributed
    backend stratac (stratac.tools.bench.backendpeer), as a call for benchpeer.after_case."""
    if "backend" not in bench["peers"]:
        return None
    from stratac.tools.bench import backendpeer
    return lambda: backendpeer.tasks_of_case(bench, index, rank, world, _test_corrupt)


def _slowest_median(calls: list[float]) -> tuple[float, float]:
    """(median, mean) over the timed calls of the slowest rank's time of each call (a host
    collective: every rank passes its own per-call times)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(calls or [0.0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.median()), float(t.mean())


def _all_ok(ok: bool) -> bool:
    """Whether every rank's check passed (a host collective)."""
    import torch
    import torch.distributed as dist
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(flag)
    return int(flag.item()) == 0


class SelectedCall:
    """A contract's selecting entry point (stratac.host.select.Selector) in the shape the case
    runner calls: named tensors of one candidate's form (in place if the file has an in-place
    candidate, as MPI's and gloo's AllReduce are), the schedule it picked in `last`."""

    def __init__(self, sel):
        self.sel = sel
        same = [fn for fn in sel.candidates if fn.ir.contract.in_place]
        self.form = (same or sel.candidates)[0]
        self.ir = self.form.ir
        self.name = f"select:{sel.name}"

    def __call__(self, cores=None, **args):
        c = self.ir.contract
        tensors = {p.name for p in self.ir.tensors}
        scalars = {k: v for k, v in args.items() if k not in tensors}
        out = None if c.in_place else args[c.outputs[0]]
        self.sel(args[c.inputs[0]], out, cores=cores, **scalars)

    @property
    def last_cores(self):
        return self.sel.last_cores

    def release_scratch(self) -> None:
        self.sel.release()


def moe_pairs(fns: list) -> list:
    """The loaded schedules paired as workload.moe_pairs pairs them (callables, not IR)."""
    from stratac.host.errors import StrataUsageError
    from stratac.tools.run.workload import PairingError
    from stratac.tools.run.workload import moe_pairs as pair_ir
    by_name = {fn.ir.name: fn for fn in fns}
    try:
        items = pair_ir([fn.ir for fn in fns])
    except PairingError as exc:
        raise StrataUsageError(str(exc)) from None
    return [(by_name[i[0].name], by_name[i[1].name] if i[1] else None) if isinstance(i, tuple)
            else by_name[i.name] for i in items]


def _run_moe(comm, disp, comb, case: dict, spec: dict, rank: int, world: int) -> list[dict]:
    """Dispatch, the stand-in expert step, combine: checked, then timed, then checked again."""
    import torch
    import torch.distributed as dist

    from stratac.ir import ContractKind, DType
    from stratac.tools.run.workload import MoeWorkload

    dtype = DType.parse(case["dtype"])
    tdtype = getattr(torch, dtype.torch_name)
    d = disp.ir.contract
    v = d.kind is ContractKind.ALLTOALLV
    wl = MoeWorkload.make(disp.ir, comb.ir if comb else None, world, case.get("tokens"), case.get("hidden"),
                          case.get("topk"), case.get("experts"), case.get("routing") or "uniform",
                          case.get("max_recv"), case.get("capacity"))
    heap_before = comm.heap_used
    q = wl.quantized   # int8 rows and f32 scales dispatched; the combine's window in the activation dtype
    role_dtype = {"x": torch.int8 if q else tdtype, "win": torch.int8 if q else tdtype, "y": tdtype,
                  "ids": torch.int32, "counts": torch.int32, "weights": torch.float32,
                  "xs": torch.float32, "ws": torch.float32, "cwin": tdtype}
    roles = {"x": (disp, d.inputs[0]), "ids": (disp, d.inputs[1]), "win": (disp, d.outputs[0]),
             "counts": (disp, d.outputs[1])}
    if q:
        roles.update({"xs": (disp, d.side[0][0]), "ws": (disp, d.side[0][1])})
    if comb:
        c = comb.ir.contract
        roles.update({"weights": (comb, c.inputs[2]), "y": (comb, c.outputs[0])})
        if q:
            roles["cwin"] = (comb, c.inputs[0])
    t = {role: comm.zeros(*wl.shape(fn.ir, fn.ir.param(name)), dtype=role_dtype[role])
         for role, (fn, name) in roles.items()}
    dargs = dict(zip(d.inputs + d.outputs, (t["x"], t["ids"], t["win"], t["counts"])))
    if q:
        dargs.update({d.side[0][0]: t["xs"], d.side[0][1]: t["ws"]})
    cargs = dict(zip(c.inputs + c.outputs, (t["cwin" if q else "win"], t["ids"], t["weights"], t["counts"],
                                            t["y"]))) if comb else {}
    phases = (("dispatch", disp, dargs),) + ((("combine", comb, cargs),) if comb else ())
    blocks = spec["cores"]   # None: each call's own (stratac.host.cores: they follow the bytes)
    rows = t["win"].shape[0]
    timing: dict[str, list[float]] = {"dispatch": [], "combine": [], "whole": []}
    counters: dict[str, list] = {}

    def step(seed: int | None, timed: bool = False) -> None:
        if seed is not None:   # fresh inputs, then every rank's host writes are done (decode's precondition)
            if q:
                xq, xs = wl.quantize(rank, seed, tdtype)
                t["x"].copy_(xq)
                t["xs"].copy_(xs)
            else:
                t["x"].copy_(wl.x(rank, seed, tdtype))
            t["ids"].copy_(wl.ids(rank, seed).reshape(t["ids"].shape))
            if comb:
                t["weights"].copy_(wl.weights(rank, seed))
            comm.synchronize()
            comm.barrier()
        start = time.perf_counter()
        for name, fn, args in phases:
            if name == "combine" and q:
                wl.expert_step_quantized(t["win"], t["ws"], t["cwin"], rank, t["counts"])
            elif name == "combine":
                wl.expert_step(t["win"], rank, t["counts"])
            if seed is not None:
                comm.reset_counters()
            t0 = time.perf_counter()
            fn(**args, cores=blocks)
            comm.synchronize()
            if timed:
                timing[name].append(time.perf_counter() - t0)
            if seed is not None and name not in counters:   # the first checked call's (seed's)
                counters[name] = comm.counters()[:fn.last_cores or None]   # the cores it launched
        if timed:   # the whole operation: dispatch, the expert step, combine
            timing["whole"].append(time.perf_counter() - start)

    def check(seed: int) -> tuple[bool, str]:
        if comb:
            t["y"].fill_(-3)
        step(seed)
        _test_corrupt(t, rank)
        host = {k: v.cpu() for k, v in t.items()}   # NPU tensors are compared on the host
        result = _compare_moe(wl, host, rank, seed, tdtype, rows, wl.counts(seed))
        # a decode dispatch writes into peers' windows without waiting for them to enter: nobody
        # may still be reading a window (this check does) when the next dispatch starts
        comm.barrier()
        return result

    ok, why = check(spec["seed"])
    heap_bytes = comm.heap_used
    for _ in range(spec["warmup"]):
        step(None)
    comm.barrier()
    _test_ready(rank)
    for _ in range(spec["iters"]):
        step(None, timed=True)
    comm.barrier()
    if _all_ok(ok):   # still correct after back-to-back calls (flag epochs), with a new routing draw
        ok, why = check(spec["seed"] + 1)
    times = [_slowest_median(timing[name]) for name, _, _ in phases]
    whole = _slowest_median(timing["whole"])[0]
    flags = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(flags)
    for role in reversed(list(t)):
        comm.free(t[role])
    for _, fn, _ in phases:
        fn.release_scratch()
    recv = wl.received_rows(spec["seed"]) * wl.row_bytes(dtype) // world
    out = []
    for i, (name, fn, _) in enumerate(phases):
        out.append({
            "schedule": fn.name, "rank": rank, "world": world, "dtype": dtype.short, "op": None,
            "root": None, "count": wl.tokens, "size": recv, "time_s": times[i][0],
            "time_mean_s": times[i][1], "op_time_s": whole,
            "busbw_factor": 1.0, "ok": ok, "why": why if i == 0 else "", "ranks_wrong": int(flags.item()),
            "cores": fn.last_cores, "counters": counters[name], "heap_bytes": heap_bytes,
            "heap_user_bytes": heap_bytes - heap_before,
            "moe": {"tokens": wl.tokens, "hidden": wl.hidden, "topk": wl.topk, "experts": wl.experts,
                    "routing": wl.routing, "capacity": wl.capacity if wl.slotted else None,
                    "window_rows": rows, "phase": name, "alltoallv": v, "counters_seed": spec["seed"],
                    "payload": "i8" if q else dtype.short, "row_bytes": wl.row_bytes(dtype)},
        })
    return out


def _compare_moe(wl, t: dict, rank: int, seed: int, tdtype, rows: int, want_counts) -> tuple[bool, str]:
    """After dispatch, the expert step and combine: counts, the window's defined rows (the expert
    step applied), and y, each against torch."""
    import torch
    if not torch.equal(t["counts"], want_counts):
        bad = (t["counts"] != want_counts).nonzero()[0].tolist()
        return False, (f"counts[{bad[0]}, {bad[1]}] = {int(t['counts'][bad[0], bad[1]])} on rank {rank}, "
                       f"expected {int(want_counts[bad[0], bad[1]])}")
    if wl.quantized:
        return _compare_moe_quantized(wl, t, rank, seed, tdtype, rows, want_counts)
    win, mask = wl.window(rank, seed, tdtype, rows)
    if wl.combine is not None:   # the window after the expert step (AllToAllV: as dispatch left it)
        wl.expert_step(win, rank, want_counts)
    got = t["win"][mask]
    if not torch.equal(got, win[mask]):
        r = int(mask.nonzero()[(got != win[mask]).any(dim=1).nonzero()[0]].item())
        return False, (f"window row {r} on rank {rank} does not hold the row the layout puts there "
                       f"(seed {seed}: {t['win'][r][:4].tolist()}..., expected {win[r][:4].tolist()}...)")
    if wl.combine is None:
        return True, ""
    return _compare_y(t["y"], wl.combined(rank, seed, tdtype), rank)


def _compare_y(got, y, rank: int) -> tuple[bool, str]:
    """The combine's output against torch's."""
    import torch
    if not torch.equal(got, y):
        bad = (got != y).nonzero()[0].tolist()
        return False, (f"y[{bad[0]}, {bad[1]}] = {got[bad[0], bad[1]].item()} on rank {rank}, expected "
                       f"{y[bad[0], bad[1]].item()} ({int((got != y).sum())} elements differ)")
    return True, ""


def _compare_moe_quantized(wl, t: dict, rank: int, seed: int, tdtype, rows: int,
                           want_counts) -> tuple[bool, str]:
    """A quantised dispatch (int8 rows, f32 scales), the expert step and the combine (counts
    checked): the int8 window and the scales beside it, the combine's window, and y, each against
    torch bit for bit."""
    import torch
    wq, ws, mask = wl.window_quantized(rank, seed, tdtype, rows)
    for name, got, want in (("window", t["win"], wq), ("scale window", t["ws"], ws)):
        if not torch.equal(got[mask], want[mask]):
            r = int(mask.nonzero()[(got[mask] != want[mask]).any(dim=1).nonzero()[0]].item())
            return False, (f"{name} row {r} on rank {rank} does not hold the row the layout puts there "
                           f"(seed {seed}: {got[r][:4].tolist()}..., expected {want[r][:4].tolist()}...)")
    if wl.combine is None:
        return True, ""
    cwin = torch.zeros(rows, wl.hidden, dtype=tdtype)
    wl.expert_step_quantized(wq, ws, cwin, rank, want_counts)
    if not torch.equal(t["cwin"][mask], cwin[mask]):
        return False, f"the expert step's output on rank {rank} differs from torch's (seed {seed})"
    return _compare_y(t["y"], wl.combined_quantized(rank, seed, tdtype), rank)


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


def _compare_case(wl, tensors: dict, rank: int, seed: int, tdtype) -> tuple[bool, str]:
    """After a collective: every parameter the contract defines, against torch, bit for bit; the
    first difference named (parameter, flat index, value, expected)."""
    import torch
    for p in wl.schedule.tensors:
        want = wl.expected(p.name, rank, seed, tdtype)
        if want is None:
            continue
        part = wl.defined(p.name, rank)
        got = tensors[p.name].cpu()[part]   # .cpu(): a no-op on the CPU target
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            i = int(bad[0]) if bad.numel() else -1
            return False, (f"{p.name}[{i + (part.start or 0)}] = {got[i].item()} on rank {rank}, expected "
                           f"{want[i].item()} ({bad.numel()} elements differ)")
    return True, ""


TEST_CORRUPT_ENV = "STRATAC_TEST_CORRUPT"
TEST_READY_ENV = "STRATAC_TEST_READY"


def _test_ready(rank: int) -> None:
    """A test hook, nothing else (tests/README.md): with STRATAC_TEST_READY=DIR in the environment,
    each rank writes its pid to the file DIR/rank<R> when it enters a timed loop, so that a fault
    test can stop or kill a rank there (between kernel calls no host collective runs) instead of
    guessing with a sleep. Written whole, then renamed into place: a file seen holds a whole pid."""
    folder = os.environ.get(TEST_READY_ENV)
    if folder:
        tmp = os.path.join(folder, f".rank{rank}.tmp")
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, os.path.join(folder, f"rank{rank}"))


def _test_corrupt(tensors: dict, rank: int) -> None:
    """A test hook, nothing else (tests/README.md): with STRATAC_TEST_CORRUPT=RANK[,RANK...]:NAME:INDEX
    (several separated by ';') in the environment, each rank listed adds 1 to element INDEX (flat) of
    its tensor NAME after the kernel and before the check, so that tests can show the check calls a
    wrong result WRONG. NAME is a collective's parameter or an MoE tensor's role (x, ids, win,
    counts, weights, y). The rank says on its output that it did, so the hook cannot pass unnoticed."""
    value = os.environ.get(TEST_CORRUPT_ENV)
    if not value:
        return
    from stratac.host.errors import StrataUsageError
    for item in value.split(";"):
        try:
            r, name, index = item.split(":")
            ranks, index = {int(x) for x in r.split(",")}, int(index)
        except ValueError:
            raise StrataUsageError(f"{TEST_CORRUPT_ENV}={value!r}: {item!r} is not "
                                   "RANK[,RANK...]:NAME:INDEX") from None
        if rank not in ranks or name not in tensors:
            continue
        flat = tensors[name].view(-1)
        before = flat[index].item()
        flat[index] += 1
        print(f"{TEST_CORRUPT_ENV}: rank {rank} changed {name}[{index}] from {before} to "
              f"{flat[index].item()} after the kernel", flush=True)


def _run_case(comm, fn, case: dict, spec: dict, rank: int, world: int) -> dict:
    """One schedule at one dtype and size: a checked call, timed calls, a second checked call."""
    import torch
    import torch.distributed as dist

    from stratac.ir import DType
    from stratac.tools.run.workload import Workload

    s = fn.ir
    dtype = DType.parse(case["dtype"])
    tdtype = getattr(torch, dtype.torch_name)
    if case.get("count") is not None:
        count = case["count"]
    else:
        count = Workload.count_for_bytes(s, world, case["size"], dtype.nbytes)
    wl = Workload(s, world, count, op=case.get("op") or "sum", root=case.get("root") or 0,
                  params=tuple(sorted((case.get("params") or {}).items())))
    heap_before = comm.heap_used
    tensors = {p.name: comm.empty(wl.numel(p), dtype=tdtype) for p in s.tensors}
    args = dict(tensors, **wl.scalars)
    blocks = spec["cores"]   # None: the call's own (stratac.host.cores: they follow the bytes)

    def checked(seed: int) -> tuple[bool, str]:
        wl.fill(tensors, rank, seed)
        comm.synchronize()   # the inputs are on the device before any peer may read them
        comm.barrier()
        fn(**args, cores=blocks)
        _test_corrupt(tensors, rank)
        return _compare_case(wl, tensors, rank, seed, tdtype)

    comm.reset_counters()
    ok, why = checked(spec["seed"])
    counters = comm.counters()[:fn.last_cores or None]   # the cores this call launched
    heap_bytes = comm.heap_used   # after the first call: includes a staging baseline's scratch
    for _ in range(spec["warmup"]):
        fn(**args, cores=blocks)
    comm.barrier()
    _test_ready(rank)
    calls = []
    for _ in range(spec["iters"]):   # back to back, each timed on its own
        t0 = time.perf_counter()
        fn(**args, cores=blocks)
        comm.synchronize()
        calls.append(time.perf_counter() - t0)
    comm.barrier()
    if (spec.get("bench") or {}).get("trace"):   # `stratac bench --trace`: one more call, recorded
        from stratac.tools.bench import benchpeer
        benchpeer.traced_call(comm, lambda: fn(**args, cores=blocks), spec["bench"]["trace"],
                              f"{s.name} {wl.size_bytes(dtype.nbytes)} B", rank)
    if _all_ok(ok):  # still correct after back-to-back calls (flag epochs); decided together,
        ok, why = checked(spec["seed"] + 1)   # since a check is collective
    elapsed, mean = _slowest_median(calls)
    flags = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(flags)
    for p in reversed(s.tensors):
        comm.free(tensors[p.name])
    fn.release_scratch()
    return {
        "schedule": fn.name, "rank": rank, "world": world, "dtype": dtype.short,
        "op": wl.reduce_op if s.contract.op else None, "root": wl.root if s.rank_params else None,
        "count": count, "size": wl.size_bytes(dtype.nbytes), "time_s": elapsed, "time_mean_s": mean,
        "busbw_factor": wl.busbw_factor(), "ok": ok, "why": why,
        "ranks_wrong": int(flags.item()), "cores": fn.last_cores, "counters": counters,
        "form": s.name, "picked": getattr(getattr(fn, "sel", None), "last", None),
        "heap_bytes": heap_bytes, "heap_user_bytes": heap_bytes - heap_before,
    }


if __name__ == "__main__":
    status = main(sys.argv[1])
    # everything is released in main's finally; skip the interpreter's teardown of torch (about
    # half a second of CPU per rank, which the runner would wait for)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
