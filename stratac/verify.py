"""The verifier: for a concrete world size and sizes, prove a schedule instance correct.

1. Happens-before by executing the per-rank timelines with vector clocks: stages run in program
   order within a rank, barriers join all ranks, a wait joins the signal that satisfies it. If no
   rank can move and some have not finished, that is a deadlock, reported with who waits for what.
2. Races: two accesses to overlapping elements of one rank's buffer, at least one a write, that
   happens-before does not order. Also every access to a peer's memory must come after that peer
   entered the call (its input is valid) and before it returns (its memory is still the call's).
3. The contract, by provenance: every element of every rank starts as a distinct 64-bit tag;
   copies move tags and reductions add them (mod 2^64), so a reduced element equals the expected
   sum of tags exactly when each expected contribution arrived exactly once. Reductions are held
   to exactly-once for max and min too (conservative: a schedule relying on max(a, a) = a is
   rejected).
This module shares no code with code generation or the CPU model: it is the independent reference.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from . import ir
from .diagnostics import Codes, Diagnostic, Note, StrataError, error
from .instantiate import Access, Event, EventKind, Instance, instantiate

MAX_RACES_REPORTED = 3
SIM_ELEMENT_BUDGET = 4_000_000
SIM_ELEMENT_LIMIT = 4 * SIM_ELEMENT_BUDGET   # larger instances are refused, not simulated


@dataclass
class Result:
    world: int
    sizes: dict[str, int]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    events: int = 0
    accesses: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.diagnostics


def default_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Sizes to check at a world size: one element, an odd size around the world size (so splits
    are uneven), and a larger odd size, each kept only while the simulation stays within budget;
    each with the first, the last and a middle rank as the value of every rank parameter."""
    candidates = [1, world + 3, 2 * world + 5]
    out: list[dict[str, int]] = []
    roots = list(dict.fromkeys([0, world - 1, world // 2]))
    for n in dict.fromkeys(candidates):
        for root in roots:
            sizes = {sym: n for sym in s.sizes}
            sizes.update({x.name: root for x in s.rank_params})
            if _within_budget(s, world, sizes) or not out:
                out.append(sizes)
            if not s.rank_params:
                break
        if not s.sizes:
            break
    return out


def _within_budget(s: ir.Schedule, world: int, sizes: dict[str, int]) -> bool:
    env = {"world": world, **sizes}
    try:
        total = sum(p.size.eval(env) for p in s.params) * world
    except ZeroDivisionError:
        total = 0  # instantiate reports it as a diagnostic, with the span of the size
    return total <= SIM_ELEMENT_BUDGET


def verify(s: ir.Schedule, world: int, sizes: dict[str, int]) -> Result:
    t0 = time.perf_counter()
    res = Result(world, dict(sizes))
    try:
        inst = instantiate(s, world, sizes)
    except StrataError as exc:
        res.diagnostics = exc.diagnostics
        res.seconds = time.perf_counter() - t0
        return res
    res.events = sum(len(t) for t in inst.timelines)
    elements = sum(inst.buffer_sizes.values()) * world
    if elements > SIM_ELEMENT_LIMIT:
        # the provenance simulation holds two 64-bit tags per element: refuse rather than exhaust
        # memory (or report success without having checked the contract)
        res.diagnostics = [error(Codes.BAD_WORLD, f"this instance ({_ctx(inst)}) has {elements} "
                                 f"buffer elements over all ranks, more than the {SIM_ELEMENT_LIMIT} "
                                 "the verifier simulates; verify it with smaller sizes", s.span)]
        res.seconds = time.perf_counter() - t0
        return res
    ex = _Execution(inst)
    res.diagnostics.extend(ex.run())
    res.accesses = ex.access_count
    if not res.diagnostics:
        res.diagnostics.extend(_races(inst, ex))
    if not res.diagnostics:
        res.diagnostics.extend(_contract(inst, ex))
    res.seconds = time.perf_counter() - t0
    return res


def _ctx(inst: Instance) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(inst.sizes.items()))
    return f"world={inst.world}" + (f", {sizes}" if sizes else "")


# ---- 1. execution with vector clocks ----

class _Execution:
    def __init__(self, inst: Instance):
        self.inst = inst
        self.vc: dict[tuple[int, int], np.ndarray] = {}
        self.order: list[Event] = []
        self.access_count = 0
        self.values = _Values(inst)

    def run(self) -> list[Diagnostic]:
        inst, W = self.inst, self.inst.world
        pos = [0] * W
        cur = [np.zeros(W, dtype=np.int64) for _ in range(W)]
        signaled: dict[tuple[int, str, int], tuple[np.ndarray, Event]] = {}
        diags: list[Diagnostic] = []
        done = 0
        while done < W:
            progress = False
            for r in range(W):
                tl = inst.timelines[r]
                while pos[r] < len(tl):
                    ev = tl[pos[r]]
                    if ev.kind is EventKind.BARRIER:
                        break
                    if ev.kind is EventKind.WAIT:
                        keys = [(r, f, slot) for f, slot, _ in ev.waits]
                        if any(k not in signaled for k in keys):
                            break
                        for k in keys:
                            np.maximum(cur[r], signaled[k][0], out=cur[r])
                    cur[r][r] = ev.index + 1
                    self.vc[(r, ev.index)] = cur[r].copy()
                    if ev.kind is EventKind.SIGNAL:
                        for owner, f, slot, span in ev.signals:
                            key = (owner, f, slot)
                            if key in signaled:
                                first = signaled[key][1]
                                diags.append(error(
                                    Codes.DOUBLE_SIGNAL, f"{f}[{slot}] of rank {owner} is signalled twice "
                                    f"in one call ({_ctx(inst)}): a wait cannot tell the two apart",
                                    span, Note(f"rank {first.rank} signalled it here", first.span)))
                                return diags
                            # every slot of one signal event shares the event's clock
                            signaled[key] = (self.vc[(r, ev.index)], ev)
                    elif ev.kind is EventKind.STAGE:
                        self.access_count += len(ev.accesses)
                        self.values.execute(ev)
                    self.order.append(ev)
                    pos[r] += 1
                    progress = True
                    if pos[r] == len(tl):
                        done += 1
            at_barrier = [inst.timelines[r][pos[r]] if pos[r] < len(inst.timelines[r]) else None
                          for r in range(W)]
            if all(ev is not None and ev.kind is EventKind.BARRIER for ev in at_barrier):
                ks = {ev.barrier for ev in at_barrier}
                if len(ks) == 1:
                    joined = np.max(np.stack(cur), axis=0)
                    for r, ev in enumerate(at_barrier):
                        cur[r] = joined.copy()
                        cur[r][r] = ev.index + 1
                        self.vc[(r, ev.index)] = cur[r].copy()
                        self.order.append(ev)
                        pos[r] += 1
                    progress = True
            if not progress:
                diags.append(self._deadlock(pos, signaled))
                return diags
        return diags

    def _deadlock(self, pos, signaled) -> Diagnostic:
        inst = self.inst
        notes: list[Note] = []
        first_span = None
        all_signals = {}
        for tl in inst.timelines:
            for ev in tl:
                for owner, f, slot, span in ev.signals:
                    all_signals.setdefault((owner, f, slot), (ev, span))
        stuck_at_barrier = []
        for r in range(inst.world):
            if pos[r] >= len(inst.timelines[r]):
                continue
            ev = inst.timelines[r][pos[r]]
            if ev.kind is EventKind.BARRIER:
                stuck_at_barrier.append(r)
                first_span = first_span or ev.span
                continue
            for f, slot, span in ev.waits:
                if (r, f, slot) in signaled:
                    continue
                first_span = first_span or span
                if (r, f, slot) in all_signals:
                    sev, sspan = all_signals[(r, f, slot)]
                    notes.append(Note(f"rank {r} waits for {f}[{slot}]; rank {sev.rank} signals it only "
                                      f"after it is itself blocked", sspan))
                else:
                    notes.append(Note(f"rank {r} waits for {f}[{slot}], which no rank ever signals",
                                      span))
                break
        if stuck_at_barrier:
            notes.append(Note(f"ranks {_ranges(stuck_at_barrier)} wait at a barrier for the others"))
        return error(Codes.DEADLOCK, f"deadlock ({_ctx(inst)}): no rank can make progress", first_span,
                     *notes[:6])

    def hb(self, a_rank: int, a_index: int, b_rank: int, b_index: int) -> bool:
        if a_rank == b_rank:
            return a_index < b_index
        return int(self.vc[(b_rank, b_index)][a_rank]) >= a_index + 1


def _ranges(rs: list[int]) -> str:
    if len(rs) <= 6:
        return ", ".join(map(str, rs))
    return f"{rs[0]}..{rs[-1]} ({len(rs)} ranks)"


# ---- 2. races, entry and exit ----

def _races(inst: Instance, ex: _Execution) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    exit_index = [len(tl) - 1 for tl in inst.timelines]
    # Accesses separated by a barrier are ordered by it (a barrier joins every rank), so only
    # accesses between the same two barriers can race: group by (owner, buffer, barrier epoch).
    groups: dict[tuple[int, str, int], list[tuple[Access, Event]]] = {}
    for tl in inst.timelines:
        epoch = 0
        for ev in tl:
            if ev.kind is EventKind.BARRIER:
                epoch += 1
            for a in ev.accesses:
                groups.setdefault((a.owner, a.buffer, epoch), []).append((a, ev))
                if a.owner != ev.rank:
                    kind = "writes" if a.write else "reads"
                    if not ex.hb(a.owner, 0, ev.rank, ev.index):
                        diags.append(error(
                            Codes.ENTRY, f"rank {ev.rank} {kind} {a.buffer}[{a.lo}:{a.hi}]@{a.owner} "
                            f"before rank {a.owner} is known to have entered the call ({_ctx(inst)})",
                            a.span, Note("nothing orders this after the peer's entry: add a barrier or "
                                         "wait for a flag the peer signals first")))
                    elif not ex.hb(ev.rank, ev.index, a.owner, exit_index[a.owner]):
                        diags.append(error(
                            Codes.EXIT, f"rank {ev.rank} {kind} {a.buffer}[{a.lo}:{a.hi}]@{a.owner}, "
                            f"but rank {a.owner} may return before that completes ({_ctx(inst)})",
                            a.span, Note("nothing orders this before the peer's exit: add a barrier or "
                                         "a signal the peer waits for after it")))
                    if len(diags) >= MAX_RACES_REPORTED:
                        return diags
    for (owner, buf, _), items in groups.items():
        items.sort(key=lambda t: t[0].lo)
        # live accesses by kind, each a heap on the end of the interval: "r" reads, "w" plain
        # writes, and one per accumulate operation (accumulates of one op never conflict, so a
        # world of accumulates into one slice costs no pairwise checks)
        active: dict[str, list] = {"w": [], "r": []}
        for seq, (a, ev) in enumerate(items):
            for heap in active.values():
                while heap and heap[0][0] <= a.lo:
                    heapq.heappop(heap)
            kind = "r" if not a.write else ("acc:" + a.accumulate if a.accumulate else "w")
            against = [k for k in active if k != "r" or a.write]
            if a.accumulate:
                against = [k for k in against if k != kind]
            conflict = None
            for k in against:
                for _, _, b, bev in sorted(active[k], key=lambda t: t[1]):   # oldest first
                    if a.instance == b.instance and (a.lo, a.hi) == (b.lo, b.hi):
                        continue  # one elementwise move reading and writing the same elements
                    if bev is not ev and (ex.hb(bev.rank, bev.index, ev.rank, ev.index)
                                          or ex.hb(ev.rank, ev.index, bev.rank, bev.index)):
                        continue
                    conflict = (b, bev)
                    break
                if conflict:
                    break
            if conflict:
                b, bev = conflict
                lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
                what_a, what_b = _verb(a), _verb(b)
                diags.append(error(
                    Codes.RACE, f"race on {buf}[{lo}:{hi}]@{owner} ({_ctx(inst)}): rank {ev.rank} "
                    f"{what_a} it here and rank {bev.rank} {what_b} it, unordered", a.span,
                    Note(f"rank {bev.rank} {what_b} it here", b.span)))
                if len(diags) >= MAX_RACES_REPORTED:
                    return diags
            heapq.heappush(active.setdefault(kind, []), (a.hi, seq, a, ev))
    return diags


def _verb(a: Access) -> str:
    if a.accumulate:
        return f"accumulates ({a.accumulate}) into"
    return "writes" if a.write else "reads"


# ---- 3. the contract by provenance ----

def _tags(rank: int, buf_index: int, n: int) -> np.ndarray:
    """Distinct pseudo-random 64-bit tags for the elements of one buffer instance (splitmix64)."""
    with np.errstate(over="ignore"):
        x = (np.arange(n, dtype=np.uint64) + np.uint64((rank << 40) + (buf_index << 32) + 1)) \
            * np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


class _Values:
    def __init__(self, inst: Instance):
        self.inst = inst
        self.names = [p.name for p in inst.schedule.params]
        self.init = {(r, b): _tags(r, i, inst.buffer_sizes[b])
                     for r in range(inst.world) for i, b in enumerate(self.names)}
        self.cur = {k: v.copy() for k, v in self.init.items()}

    def execute(self, ev: Event) -> None:
        with np.errstate(over="ignore"):
            for mv in ev.moves:
                owner, buf, lo, hi = mv.dst
                if hi <= lo:
                    continue
                vals = [self.cur[(o, b)][l:h] for o, b, l, h in mv.srcs]
                if mv.accumulate:
                    out = self.cur[(owner, buf)][lo:hi] + vals[0]
                elif mv.op is None:
                    out = vals[0].copy()
                else:
                    out = np.zeros(hi - lo, dtype=np.uint64)
                    for v in vals:
                        out += v
                self.cur[(owner, buf)][lo:hi] = out


def _contract(inst: Instance, ex: _Execution) -> list[Diagnostic]:
    s, W, vals = inst.schedule, inst.world, ex.values
    c = s.contract
    x, out = c.inputs[0], c.outputs[0]
    nx, nout = inst.buffer_sizes[x], inst.buffer_sizes[out]
    K = ir.ContractKind
    expected: dict[tuple[int, str], np.ndarray | None] = {}   # None: the contract says nothing
    describe: dict[str, str] = {}

    def shape(want: int, why: str) -> list[Diagnostic]:
        return [error(Codes.SHAPE, f"{c.kind.value} needs {why}: {want} elements, but {out} has {nout} "
                      f"and {x} has {nx} ({_ctx(inst)})", s.param(out).span)]

    def total(part: slice = slice(None)) -> np.ndarray:
        acc = np.zeros(len(range(nx)[part]), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for r in range(W):
                acc += vals.init[(r, x)][part]
        return acc

    opname = c.op.value if c.op else ""
    if c.kind is K.ALLREDUCE:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        t = total()
        for r in range(W):
            expected[(r, out)] = t
        describe[out] = f"the {opname} over all ranks of {x}[i]"
    elif c.kind is K.ALLGATHER:
        if nout != nx * W:
            return shape(nx * W, f"{out} to hold world x {x}")
        gathered = np.concatenate([vals.init[(p, x)] for p in range(W)])
        for r in range(W):
            expected[(r, out)] = gathered
        describe[out] = f"block i // {nx} of the gather: {x}[i % {nx}] of rank i // {nx}"
    elif c.kind is K.REDUCESCATTER:
        if nx != nout * W:
            return shape(nout * W, f"{x} to hold world x {out}")
        for r in range(W):
            expected[(r, out)] = total(slice(r * nout, (r + 1) * nout))
        describe[out] = f"the {opname} over all ranks of block `rank` of {x}"
    elif c.kind is K.BROADCAST:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        root = inst.sizes[c.root]
        for r in range(W):
            expected[(r, out)] = vals.init[(root, x)]
        describe[out] = f"{x}[i] of the root, rank {root}"
    elif c.kind is K.REDUCE:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        root = inst.sizes[c.root]
        for r in range(W):
            if r == root:
                expected[(r, out)] = total()
            elif not c.in_place:
                expected[(r, out)] = None
        describe[out] = f"on the root (rank {root}), the {opname} over all ranks of {x}[i]"
    else:  # ALLTOALL
        if nx != nout or nx % W:
            return shape(nx - nx % W if nx % W else nx,
                         f"{x} and {out} of one size, a multiple of the world size")
        m = nx // W
        for r in range(W):
            expected[(r, out)] = np.concatenate([vals.init[(p, x)][r * m:(r + 1) * m] for p in range(W)])
        describe[out] = f"block p of {out} on rank r is block r of {x} on rank p (blocks of {m})"
    for r in range(W):
        for b in vals.names:
            if s.param(b).scratch:
                continue
            want = expected.get((r, b), vals.init[(r, b)])
            if want is None:
                continue
            got = vals.cur[(r, b)]
            bad = np.nonzero(got != want)[0]
            if bad.size == 0:
                continue
            i = int(bad[0])
            what = describe.get(b, f"its input value (the contract leaves {b} unchanged)")
            holds = _explain(vals, int(got[i]))
            return [error(Codes.CONTRACT, f"the schedule does not implement {c} ({_ctx(inst)}): "
                          f"{b}@{r}[{i}] should be {what}, but {holds}"
                          + (f"; {bad.size} elements are wrong" if bad.size > 1 else ""),
                          c.span)]
    return []


def _explain(vals: _Values, value: int) -> str:
    for (r, b), arr in vals.init.items():
        hit = np.nonzero(arr == np.uint64(value))[0]
        if hit.size:
            return f"it holds {b}@{r}[{int(hit[0])}] as the call found it"
    return "it holds a combination with some contribution missing or counted twice"


def verify_worlds(s: ir.Schedule, worlds: list[int],
                  samples: list[dict[str, int]] | None = None) -> list[Result]:
    results = []
    for w in worlds:
        for sizes in (samples or default_samples(s, w)):
            results.append(verify(s, w, sizes))
            if not results[-1].ok:
                return results
    return results
