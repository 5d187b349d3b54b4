"""The verifier's driver: for a concrete world size and sizes, prove a schedule instance correct.

In: a schedule, world sizes and samples (by default `samples.default_samples`). Out: a `Result` per
instance checked, with its diagnostics. Each instance is instantiated (a MoE one gets its sample
routing; one of more events than ir.instantiate.MAX_EVENTS is refused), executed with vector
clocks (`timeline`: deadlocks), checked for races and entry/exit (`races`) and then for its contract (`contract`); each step only
runs when the previous found nothing. verify_worlds stops at the first instance that fails.
verify_lowered checks the IR after the passes against the proof of the IR before them.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import gc
import multiprocessing
import os
import time
from dataclasses import dataclass, field, replace

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, StrataError, error
from stratac.ir.instantiate import instantiate
from stratac.verify.contract import check_contract
from stratac.verify.races import check_races
from stratac.verify.samples import context, default_samples, route_sample
from stratac.verify.timeline import Execution, stamp_errors, unmet_barriers


@dataclass
class Result:
    world: int
    sizes: dict[str, int]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    events: int = 0
    accesses: int = 0
    seconds: float = 0.0
    skipped: str | None = None     # a world the schedule does not support: its `requires`
    active: tuple[bool, ...] | None = None   # a masked variant's live ranks


    @property
    def ok(self) -> bool:
        return not self.diagnostics


@contextlib.contextmanager
def no_cycle_collection():
    """Python's cycle collector paused (then restored as it was). An instance at world 384 is
    millions of events, moves and accesses, made in one go; each collection of the oldest
    generation walks all of them: building the ring's three instances at 384 took 27 s with the
    collector running and 3.6 s with it paused (docs/bench.md, "The verifier at world 384").
    Nothing a proof makes is cyclic (a test checks), so reference counting frees it when the
    proof returns. The simulator's walk pauses it too (tools/simulate/driver.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def verify(s: ir.Schedule, world: int, sizes: dict[str, int], routing: str | None = None,
           active: tuple[bool, ...] | None = None, keep: list | None = None) -> Result:
    """One instance; `active`: a masked call's live ranks (ir.takes_mask schedules). `keep`: a
    list the instance and its execution are appended to, for a caller that frees them later."""
    with no_cycle_collection():
        return _verify(s, world, sizes, routing, active, keep)


def _verify(s, world, sizes, routing, active, keep) -> Result:
    t0 = time.perf_counter()
    res = Result(world, dict(sizes), active=active)
    unmet = ir.unmet_requirement(s, world)
    if unmet is not None:
        res.diagnostics = [world_refused(s, world, unmet)]
        return res
    try:
        inst = instantiate(s, world, sizes, active=active)
        if s.contract.kind.moe:
            _refuse_large_tables(inst)
            route_sample(inst, routing or getattr(sizes, "routing", None) or "uniform")
    except StrataError as exc:
        res.diagnostics = exc.diagnostics
        res.seconds = time.perf_counter() - t0
        return res
    res.events = sum(len(t) for t in inst.timelines)
    ex = Execution(inst)
    if keep is not None:
        keep.append((inst, ex))
    try:
        res.diagnostics.extend(ex.run())
    except StrataError as exc:   # the simulated memory outgrew its budget (provenance.MAX_PIECES)
        res.diagnostics = exc.diagnostics
    res.accesses = ex.access_count
    if not res.diagnostics:
        res.diagnostics.extend(check_races(inst, ex))
    if not res.diagnostics:
        res.diagnostics.extend(check_contract(inst, ex.values))
    res.seconds = time.perf_counter() - t0
    return res


# The most elements the count tables of a MoE or AllToAllV instance may hold over all ranks (world
# x experts on each rank, world^2 x experts in all): unlike the tokens, they are data the routing
# constructs read element by element (a rank's exscan reads the whole table), so they are held and
# read as arrays, and the verifier's time and memory grow with them.
TABLE_ELEMENT_LIMIT = 64_000_000


def _refuse_large_tables(inst) -> None:
    s, c = inst.schedule, inst.schedule.contract
    counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    table = inst.buffer_sizes[counts] * inst.world
    if table > TABLE_ELEMENT_LIMIT:
        raise StrataError(error(Codes.BAD_WORLD, f"{s.name} ({context(inst)}): its count tables "
                                f"({counts}, {inst.buffer_sizes[counts]:,} elements on each rank) hold "
                                f"{table:,} elements over all ranks, more than the "
                                f"{TABLE_ELEMENT_LIMIT:,} the verifier reads: refused before the routing "
                                "is drawn; prove it at a smaller world", s.param(counts).span))


def world_refused(s: ir.Schedule, world: int, unmet: ir.Requirement) -> Diagnostic:
    return error(Codes.BAD_WORLD, f"{s.name} does not support world {world}: it {unmet}", unmet.span)


def verify_worlds(s: ir.Schedule, worlds: list[int],
                  samples: list[dict[str, int]] | None = None, jobs: int = 1) -> list[Result]:
    """Every instance at `worlds`; a world the schedule's `requires` excludes gives one skipped
    result (ok, no instances). jobs > 1: the instances are proven in that many worker processes
    at once (where the platform forks); the results, and where they stop, are the same."""
    plan: list[Result | tuple[int, dict[str, int]]] = []
    for w in worlds:
        unmet = ir.unmet_requirement(s, w)
        if unmet is not None:
            plan.append(Result(w, {}, skipped=str(unmet)))
            continue
        plan += [(w, sizes) for sizes in (samples or default_samples(s, w))]
    todo = [x for x in plan if not isinstance(x, Result)]
    proofs = _proofs(s, todo, jobs) if jobs > 1 and len(todo) > 1 and _FORK else None
    results = []
    try:
        for x in plan:
            if isinstance(x, Result):
                results.append(x)
                continue
            w, sizes = x
            results.append(next(proofs) if proofs else verify(s, w, sizes, getattr(sizes, "routing", None)))
            if not results[-1].ok:
                return results   # the instances after it are not waited for
        return results
    finally:
        if proofs:
            proofs.close()


_FORK = "fork" in multiprocessing.get_all_start_methods()
# what a worker of _proofs proves: set before the workers fork, so it is not pickled
_WORK: ir.Schedule | None = None


# A worker's last proof (its instance and execution): freed when the worker starts its next, or
# never, since a forked worker ends with os._exit, which frees nothing object by object. Freeing
# an instance at world 384 takes about a second (a million events, moves and accesses), and the
# caller waits for a worker's last proof. Kept objects are frozen (gc.freeze) before the cycle
# collector runs again: else its next collection would walk them all.
_KEPT: list = []


def _prove(item: tuple[int, dict[str, int]]) -> Result:
    w, sizes = item
    with no_cycle_collection():
        _KEPT.clear()
        res = verify(_WORK, w, sizes, getattr(sizes, "routing", None), keep=_KEPT)
        gc.freeze()
    return res


def _proofs(s: ir.Schedule, todo: list, jobs: int):
    """verify of each (world, sizes) of todo, in order, from `jobs` forked worker processes; closing
    the generator stops the workers."""
    global _WORK
    _WORK = s
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(todo)),
                                                  mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(_prove, item) for item in todo]
        for (w, sizes), f in zip(todo, futures):
            try:
                yield f.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise StrataError(error(
                    Codes.BAD_WORLD, f"a worker process proving {s.name} at world {w} "
                    f"({', '.join(f'{k}={v}' for k, v in sizes.items())}) ended before it answered "
                    "(killed, or out of memory): prove one instance at a time (-j 1), or at a "
                    "smaller world", s.span)) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _WORK = None


# The most memory one instance's proof may take: the verifier's budgets (events, vector clocks and
# simulated memory: ir.instantiate.MAX_EVENTS, CLOCK_BYTES, provenance.MAX_PIECES) add up to about
# this much, so a worker is started only for each this much of available memory.
INSTANCE_BYTES = 6 << 30


def default_jobs() -> int:
    """Worker processes for proving instances side by side: one per CPU this process may run on,
    no more than the available memory holds at INSTANCE_BYTES each, at least one."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1
    return max(1, min(cpus, avail // INSTANCE_BYTES))


# the worlds at which `stratac check` proves every masked variant of a schedule that takes a mask
MASK_WORLDS = (2, 3, 4)


def masks(world: int) -> list[tuple[bool, ...]]:
    """Every mask of active ranks of a world but the full one (which is the unmasked instance):
    every non-empty proper subset of the ranks, in order of its bits."""
    return [tuple(bool(m >> r & 1) for r in range(world)) for m in range(1, (1 << world) - 1)]


def verify_masks(s: ir.Schedule, worlds: list[int]) -> list[Result]:
    """Every masked variant of s (ir.takes_mask) at each of `worlds` in MASK_WORLDS: every mask
    (masks) under every MoE sample of `samples.default_samples` (a masked call runs only an
    instance proven with its own mask, so larger worlds are proven at the call).
    Stops at the first that fails. A world listed twice is proven once."""
    results: list[Result] = []
    if not ir.takes_mask(s):
        return results
    for w in sorted(set(worlds)):
        if w not in MASK_WORLDS or ir.unmet_requirement(s, w) is not None:
            continue
        for active in masks(w):
            for sizes in default_samples(s, w):
                results.append(verify(s, w, sizes, getattr(sizes, "routing", None), active=active))
                if not results[-1].ok:
                    return results
    return results


def verify_lowered(lowered: ir.Schedule, source: ir.Schedule, worlds: list[int],
                   samples: list[dict[str, int]] | None = None) -> list[Result]:
    """The IR after the passes (what the kernel is generated from), once verify_worlds proved
    `source` at the same worlds and samples. If the passes changed nothing but stamps and plans,
    the data movement is the proven one, and so is its order wherever the kernel's barriers meet
    as the proof's did: the proof meets the members of a barrier at its place in the program, so it
    is enough that each instance's stamps are valid and every barrier's stamp is that place.
    Anything else the passes changed is verified in full."""
    bad_join = _unsound_join(lowered.body)
    if bad_join is not None:
        return [Result(worlds[0] if worlds else 0, {}, diagnostics=[bad_join])]
    if _unstamped(lowered) != source:
        return verify_worlds(lowered, worlds, samples)
    results = []
    for w in worlds:
        unmet = ir.unmet_requirement(lowered, w)
        if unmet is not None:
            results.append(Result(w, {}, skipped=str(unmet)))
            continue
        for sizes in (samples or default_samples(lowered, w)):
            t0 = time.perf_counter()
            res = Result(w, dict(sizes))
            try:
                inst = instantiate(lowered, w, sizes, barriers_only=True)
                proof = instantiate(source, w, sizes, barriers_only=True)
            except StrataError as exc:
                res.diagnostics = exc.diagnostics
            else:
                res.events = sum(len(t) for t in inst.timelines)
                res.diagnostics = stamp_errors(inst) or unmet_barriers(proof, inst)
            res.seconds = time.perf_counter() - t0
            results.append(res)
            if not res.ok:
                return results
    return results


def _unsound_join(ops) -> Diagnostic | None:
    """A place marked joined (made in the pass over the ids of the place right before it) is the
    two places one after the other only if it follows an unjoined place of the same ids and
    offsets, and the two windows and two row sources are four buffers, neither window being the
    ids or the offsets: then neither place reads what the other writes. Any other mark would let
    the joined pass interleave a write with a read the proof ordered, so it is refused here."""
    prev = None
    for op in ops:
        if isinstance(op, ir.Route) and op.joined:
            K = ir.RouteKind
            ok = (isinstance(prev, ir.Route) and prev.kind is K.PLACE and op.kind is K.PLACE
                  and not prev.joined and prev.operands[1:] == op.operands[1:])
            if ok:
                bufs = {prev.dst.buffer, op.dst.buffer, prev.operands[0], op.operands[0]}
                ok = len(bufs) == 4 and not {prev.dst.buffer, op.dst.buffer} & set(op.operands[1:])
            if not ok:
                def said(r) -> str:
                    if r is None:
                        return "nothing"
                    if isinstance(r, ir.Route):
                        return f"line {r.span.line} ({r.dst.buffer} = {r.kind.value}({', '.join(r.operands)}))"
                    return f"line {r.span.line}"
                return error(Codes.RACE, f"{said(op)} is marked to be placed in the pass of the statement "
                             f"before it, {said(prev)}, but the two are not places of the same ids and "
                             "offsets into separate buffers: the joined pass would reorder their "
                             "accesses (a bug of stratac's passes)", op.span)
        for part in ("body", "then", "orelse"):
            found = _unsound_join(getattr(op, part, ()))
            if found is not None:
                return found
        prev = op
    return None


def _unstamped(s: ir.Schedule) -> ir.Schedule:
    """s without what the passes add: stamps, stage plans, joined marks, the kernel plan."""
    def strip(ops):
        out = []
        for op in ops:
            if isinstance(op, ir.Barrier):
                op = replace(op, seq=ir.Const(0))
            elif isinstance(op, ir.Stage):
                op = replace(op, plan=None, body=strip(op.body))
            elif isinstance(op, ir.Route):
                op = replace(op, joined=False)   # checked by _unsound_join
            elif isinstance(op, ir.If):
                op = replace(op, then=strip(op.then), orelse=strip(op.orelse))
            elif isinstance(op, ir.Loop):
                op = replace(op, body=strip(op.body))
            out.append(op)
        return tuple(out)
    return replace(s, body=strip(s.body), flags=tuple(replace(f, seq=0) for f in s.flags),
                   sync_ops=0, sync_expr=None, kernel=None)
