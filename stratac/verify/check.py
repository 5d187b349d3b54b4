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

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, StrataError, error
from stratac.ir.instantiate import Access, Event, EventKind, Instance, instantiate
from stratac.verify import routing as routing_mod

MAX_RACES_REPORTED = 3
SIM_ELEMENT_BUDGET = 4_000_000
# larger instances are refused, not simulated: the simulation holds one 64-bit value per element
# (the initial tags are regenerated on demand), so this is 512 MB
SIM_ELEMENT_LIMIT = 16 * SIM_ELEMENT_BUDGET


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


class Sample(dict):
    """Sizes (and rank parameters) of one instance to check; a MoE sample also names a routing."""

    routing: str | None = None


MOE_SAMPLES = ((1, "uniform"), (5, "uniform"), (5, "single"), (5, "empty"), (5, "sparse"))


def moe_roles(s: ir.Schedule) -> dict[str, str]:
    """Which size symbol plays which MoE role (tokens, topk, hidden, experts, capacity), read off
    the contract's tensors: ids [tokens, topk], the tokens [tokens, hidden], counts [world, experts]."""
    c = s.contract
    dispatch = c.kind.dispatch
    tok = s.param(c.inputs[0] if dispatch else c.outputs[0])
    ids = s.param(c.inputs[1])
    counts = s.param(c.outputs[1] if dispatch else c.inputs[3])
    roles = {}
    for buf, names in ((ids, ("tokens", "topk")), (tok, ("tokens", "hidden")), (counts, (None, "experts"))):
        for d, role in zip(buf.dims, names):
            if role and isinstance(d, ir.Var):
                roles.setdefault(role, d.name)
    if c.capacity:
        roles["capacity"] = c.capacity
    return roles


def _moe_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Token counts 1 and 5 (rows of 3 elements, top-2, 2 experts per rank up to world 64 and one
    above, where every rank's world x experts count table dominates; capacity = tokens),
    under the routings of MOE_SAMPLES, each kept while the simulation stays within budget (every
    rank holds the world x experts count table, so large worlds keep only the one-token sample);
    other size symbols (such as a window's row count) get the bound world * tokens * topk."""
    roles = {v: k for k, v in moe_roles(s).items()}
    out = []
    for tokens, routing in MOE_SAMPLES:
        experts = 2 * world if world <= 64 else world
        value = {"tokens": tokens, "topk": 2, "hidden": 3, "experts": experts, "capacity": tokens}
        sample = Sample({sym: value.get(roles.get(sym, ""), world * tokens * 2) for sym in s.sizes})
        sample.update({x.name: 0 for x in s.rank_params})
        sample.routing = routing
        if _within_budget(s, world, sample) or not out:   # like default_samples: never none at all
            out.append(sample)
    return out


def default_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Sizes to check at a world size: one element, an odd size around the world size (so splits
    are uneven), and a larger odd size, each kept only while the simulation stays within budget;
    each with the first, the last and a middle rank as the value of every rank parameter."""
    if s.contract.kind.moe:
        return _moe_samples(s, world)
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


def verify(s: ir.Schedule, world: int, sizes: dict[str, int], routing: str | None = None) -> Result:
    t0 = time.perf_counter()
    res = Result(world, dict(sizes))
    try:
        inst = instantiate(s, world, sizes)
        if s.contract.kind.moe:
            _route_sample(inst, routing or getattr(sizes, "routing", None) or "uniform")
    except StrataError as exc:
        res.diagnostics = exc.diagnostics
        res.seconds = time.perf_counter() - t0
        return res
    res.events = sum(len(t) for t in inst.timelines)
    elements = sum(inst.buffer_sizes.values()) * world
    if elements > SIM_ELEMENT_LIMIT:
        # the provenance simulation holds a 64-bit value per element: refuse rather than exhaust
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


def _route_sample(inst: Instance, routing: str) -> None:
    """Expert ids for every rank from a sample routing; a combine also starts from the counts its
    dispatch left (its precondition)."""
    s, c = inst.schedule, inst.schedule.contract
    ids_name = c.inputs[1]
    T, K = (inst.buffer_shapes[ids_name] + (1,))[:2]
    counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    E = inst.buffer_shapes[counts][-1]
    if c.kind is ir.ContractKind.ALLTOALLV and E != inst.world:
        raise StrataError(error(Codes.SHAPE, f"alltoallv's {counts} needs world x world counts (one column "
                                f"per destination rank), it has {E} columns ({_ctx(inst)})",
                                s.param(counts).span))
    if K > E:
        raise StrataError(error(Codes.SHAPE, f"topk ({K}) exceeds the number of experts ({E}) "
                                f"({_ctx(inst)})", s.param(ids_name).span))
    ids = [routing_mod.expert_ids(routing, r, T, K, E) for r in range(inst.world)]
    inst.routing = routing
    inst.data = {(r, ids_name): ids[r] for r in range(inst.world)}
    if c.kind is ir.ContractKind.MOE_COMBINE:
        matrix = np.stack([np.bincount(i[i >= 0], minlength=E)[:E] for i in ids]).reshape(-1)
        inst.data.update({(r, counts): matrix for r in range(inst.world)})


def _ctx(inst: Instance) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(inst.sizes.items()))
    routing = f", routing={inst.routing}" if inst.routing else ""
    return f"world={inst.world}" + (f", {sizes}" if sizes else "") + routing


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
                        self.values.execute(ev)   # expands routing constructs into accesses first
                        self.access_count += len(ev.accesses)
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
    c = inst.schedule.contract
    # A slotted (decode) dispatch may write its outputs (windows, counts) into peers that have not
    # entered yet, saving a round trip: its precondition is that no rank touches them until then
    # (the previous combine ends when every rank has finished reading them; after allocating or
    # writing them on the host, comm.barrier()). dsl/README.md, "Routing". Reads and every other
    # buffer keep the entry rule.
    entry_free = set(c.outputs) if c.kind.dispatch and c.capacity else set()
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
                    if not ex.hb(a.owner, 0, ev.rank, ev.index) and not (a.write and
                                                                          a.buffer in entry_free):
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


class _Initial(dict):
    """What every buffer held when the call began, by (rank, buffer): the instance's data (expert
    ids, a combine's counts), else distinct tags. Generated on demand and kept only when small:
    a MoE instance's count tables (world x experts per rank) would otherwise be held twice."""

    KEEP = 1 << 16

    def __init__(self, inst: Instance, names: list[str]):
        super().__init__()
        self.inst, self.index = inst, {b: i for i, b in enumerate(names)}

    def __missing__(self, key):
        r, b = key
        if key in self.inst.data:
            arr = np.asarray(self.inst.data[key], dtype=np.int64).reshape(-1).astype(np.uint64)
        else:
            arr = _tags(r, self.index[b], self.inst.buffer_sizes[b])
        if arr.size <= self.KEEP:
            self[key] = arr
        return arr

    def every(self):
        for r in range(self.inst.world):
            for b in self.index:
                yield (r, b), self[(r, b)]


class _Values:
    def __init__(self, inst: Instance):
        self.inst = inst
        self.names = [p.name for p in inst.schedule.params]
        self.init = _Initial(inst, self.names)
        self.cur = {}
        for r in range(inst.world):
            for b in self.names:
                v = self.init[(r, b)]
                self.cur[(r, b)] = v.copy() if (r, b) in self.init else v   # a kept array is shared
        self.faults: list[Diagnostic] = []   # routing that went outside its window
        self.serial = 1 << 40                # access instances of expanded routing constructs

    def execute(self, ev: Event) -> None:
        for ri in ev.routes:
            self._route(ri, ev)
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


    # ---- routing constructs, executed on the simulated values

    def _ints(self, rank: int, buf: str) -> np.ndarray:
        return self.cur[(rank, buf)].astype(np.int64)

    def _access(self, ev: Event, ri, owner: int, buf: str, lo: int, hi: int, write: bool) -> None:
        if hi > lo:
            self.serial += 1
            ev.accesses.append(Access(owner, buf, lo, hi, write, self.serial, ri.span))

    def _rows(self, ri, ev: Event, owner_rows: list[tuple[int, int]], buf: str, write: bool) -> None:
        """Accesses to whole rows of a window (owner, row), runs of consecutive rows merged."""
        H = ri.hidden
        run = None
        for owner, row in owner_rows + [(None, None)]:
            if run and owner == run[0] and row == run[2]:
                run[2] += 1
                continue
            if run:
                self._access(ev, ri, run[0], buf, run[1] * H, run[2] * H, write)
            run = [owner, row, row + 1] if owner is not None else None

    def _route(self, ri, ev: Event) -> None:
        K, W, r = ir.RouteKind, self.inst.world, ri.rank
        b = ri.buffers
        owner, dbuf, lo, hi = ri.dst
        out = self.cur[(owner, dbuf)]
        if ri.kind is not K.PLACE:   # place writes rows of other ranks' windows, listed below
            self._access(ev, ri, owner, dbuf, lo, hi, True)
        for role in ("ids", "counts", "offs", "weights"):
            if role in b:
                self._access(ev, ri, r, b[role], 0, self.inst.buffer_sizes[b[role]], False)
        E = ri.experts
        if ri.kind is K.HISTOGRAM:
            ids = self._ints(r, b["ids"])
            ids = ids[(ids >= 0) & (ids < E)]
            out[lo:hi] = np.bincount(ids, minlength=E)[:E].astype(np.uint64)
            return
        L = E // W
        if ri.kind is K.EXSCAN:
            m = self._ints(r, b["counts"]).reshape(W, E)
            offs = np.zeros(E, dtype=np.int64)
            with np.errstate(over="ignore"):   # counts read before they are complete: garbage, reported
                for e in range(E):
                    o, l = divmod(e, L)
                    offs[e] = m[:, o * L:o * L + l].sum() + m[:r, e].sum()
            out[lo:hi] = offs.astype(np.uint64)
            return
        if ri.kind is K.SLOTS:
            e = np.arange(E, dtype=np.int64)
            out[lo:hi] = (((e % L) * W + r) * ri.capacity).astype(np.uint64)
            return
        ids = self._ints(r, b["ids"]).reshape(ri.tokens, ri.topk)
        offs = self._ints(r, b["offs"])
        H, seen = ri.hidden, np.zeros(E, dtype=np.int64)
        place = ri.kind is K.PLACE
        win = dbuf if place else b["win"]
        used: list[tuple[int, int]] = []
        rows_out = np.zeros((ri.tokens, H), dtype=np.uint64)
        weights = self.cur[(r, b["weights"])] if not place else None
        x = self.cur[(r, b["x"])] if place else None
        with np.errstate(over="ignore"):
            for t in range(ri.tokens):
                for k in range(ri.topk):
                    e = int(ids[t, k])
                    if not 0 <= e < E:
                        continue
                    row = int(offs[e]) + int(seen[e])
                    seen[e] += 1
                    o = e // L
                    if not 0 <= row < ri.rows:
                        if not self.faults:
                            self.faults.append(error(
                                Codes.CONTRACT, f"rank {r}: {ri.kind.value} puts token {t} (expert {e}) "
                                f"at row {row} of {win}@{o}, which has {ri.rows} rows "
                                f"({_ctx(self.inst)})", ri.span,
                                Note("the offsets are wrong: are the counts complete when they are read?")))
                        continue
                    used.append((o, row))
                    if place:
                        self.cur[(o, win)][row * H:(row + 1) * H] = x[t * H:(t + 1) * H]
                    else:
                        rows_out[t] += weights[t * ri.topk + k] * self.cur[(o, win)][row * H:(row + 1) * H]
        if place:
            self._access(ev, ri, r, b["x"], 0, self.inst.buffer_sizes[b["x"]], False)
            self._rows(ri, ev, used, win, True)
        else:
            self._rows(ri, ev, used, win, False)
            out[lo:hi] = rows_out.reshape(-1)


def _contract(inst: Instance, ex: _Execution) -> list[Diagnostic]:
    s, W, vals = inst.schedule, inst.world, ex.values
    c = s.contract
    if vals.faults:
        return vals.faults[:1]
    if c.kind.moe:
        return _moe_contract(inst, vals)
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


def moe_layout(ids: list[np.ndarray], experts: int, capacity: int | None) -> dict:
    """The window row of every routed entry: {(source rank, token, k): (owner, row)}, by the
    contract's definition. Packed (capacity None): on each owner, local expert by local expert, the
    rows from rank 0, then rank 1, ..., each rank's in token order. Slotted: rank s's j-th row for
    local expert l is row (l * world + s) * capacity + j."""
    W = len(ids)
    L = experts // W
    out = {}
    for o in range(W):
        row = 0
        for l in range(L):
            e = o * L + l
            for src in range(W):
                j = 0
                for t, k in zip(*np.nonzero(ids[src] == e)):
                    out[(src, int(t), int(k))] = (o, row if capacity is None else (l * W + src) * capacity + j)
                    row += 1
                    j += 1
    return out


def _moe_contract(inst: Instance, vals: _Values) -> list[Diagnostic]:
    s, W, c = inst.schedule, inst.world, inst.schedule.contract
    ids_name = c.inputs[1]
    T, K = (inst.buffer_shapes[ids_name] + (1,))[:2]
    ids = [vals.init[(r, ids_name)].astype(np.int64).reshape(T, K) for r in range(W)]
    counts_name = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    E = inst.buffer_shapes[counts_name][-1]
    cap = inst.sizes[c.capacity] if c.capacity else None
    layout = moe_layout(ids, E, cap)
    matrix = np.stack([np.bincount(i[(i >= 0) & (i < E)], minlength=E)[:E] for i in ids]).reshape(-1)
    expected: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}   # values, mask of checked
    describe: dict[str, str] = {}
    if c.kind.dispatch:
        x, win = c.inputs[0], c.outputs[0]
        H = inst.buffer_shapes[x][1]
        want = {r: vals.init[(r, win)].copy() for r in range(W)}
        mask = {r: np.zeros(inst.buffer_sizes[win], dtype=bool) for r in range(W)}
        for (src, t, _), (o, row) in layout.items():
            want[o][row * H:(row + 1) * H] = vals.init[(src, x)][t * H:(t + 1) * H]
            mask[o][row * H:(row + 1) * H] = True
        for r in range(W):
            expected[(r, win)] = (want[r], mask[r])
            expected[(r, counts_name)] = (matrix.astype(np.uint64),
                                          np.ones(matrix.size, dtype=bool))
        describe[win] = "the token row the layout puts there"
        describe[counts_name] = f"the number of entries of {ids_name} on rank i // experts equal to i % experts"
    else:
        win, weights, y = c.inputs[0], c.inputs[2], c.outputs[0]
        H = inst.buffer_shapes[y][1]
        for r in range(W):
            out = np.zeros(T * H, dtype=np.uint64)
            with np.errstate(over="ignore"):
                for t in range(T):
                    for k in range(K):
                        hit = layout.get((r, t, k))
                        if hit:
                            o, row = hit
                            out[t * H:(t + 1) * H] += vals.init[(r, weights)][t * K + k] * \
                                vals.init[(o, win)][row * H:(row + 1) * H]
            expected[(r, y)] = (out, np.ones(out.size, dtype=bool))
        describe[y] = f"the sum over k of {weights}[t, k] times the window row of entry (t, k)"
    for r in range(W):
        for b in vals.names:
            if s.param(b).scratch:
                continue
            want, mask = expected.get((r, b), (vals.init[(r, b)], None))
            got = vals.cur[(r, b)]
            bad = np.nonzero((got != want) if mask is None else ((got != want) & mask))[0]
            if bad.size == 0:
                continue
            i = int(bad[0])
            what = describe.get(b, f"its input value (the contract leaves {b} unchanged)")
            return [error(Codes.CONTRACT, f"the schedule does not implement {c} ({_ctx(inst)}): "
                          f"{b}@{r}[{i}] should be {what}, but {_explain(vals, int(got[i]))}"
                          + (f"; {bad.size} elements are wrong" if bad.size > 1 else ""), c.span)]
    return []


def _explain(vals: _Values, value: int) -> str:
    for (r, b), arr in vals.init.every():
        hit = np.nonzero(arr == np.uint64(value))[0]
        if hit.size:
            return f"it holds {b}@{r}[{int(hit[0])}] as the call found it"
    return "it holds a combination with some contribution missing or counted twice"


def verify_worlds(s: ir.Schedule, worlds: list[int],
                  samples: list[dict[str, int]] | None = None) -> list[Result]:
    results = []
    for w in worlds:
        for sizes in (samples or default_samples(s, w)):
            results.append(verify(s, w, sizes, getattr(sizes, "routing", None)))
            if not results[-1].ok:
                return results
    return results
