"""The pass pipeline from verified IR to IR ready for code generation. One explicit list per target.

- flag epochs: every barrier and every flag gets a stamp offset; a call stamps flags with
  epoch + offset, and the next call's epoch is larger than every stamp of this one, so a stale flag
  from an earlier call never satisfies a wait. A barrier's offset is its place in the program,
  1 + the places before it (the k-th barrier of either arm of an if takes one place, the if the
  places of its longer arm): every rank has the same stamp at the same place, whichever arms took
  it there, and the members of a barrier only some ranks pass meet (the verifier meets ranks at a
  barrier's place and, on the IR after the passes, at equal stamps).
- engine placement: which copies go to the vector cores, which to SDMA (`on auto`: by size, at run
  time, from a documented threshold).
- UB tiling with double buffering: the tile size that fits the queues of one core in 192 KiB.
Core partitioning needs the run-time sizes, so the kernels do it (strata::Partition in
runtime/device/strata_device.h splits each stage's bytes evenly over the launched cores).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stratac import ir
from stratac.diagnostics import Codes, StrataError, error

UB_BYTES = 196608           # Unified Buffer per vector core on 910B/910C
SCRATCH_BYTES = 256         # SDMA descriptor scratch (64 B, 64-aligned) + flag staging
QUEUE_DEPTH = 2             # double buffering: load tile k+1 while tile k is computed/stored
SDMA_THRESHOLD = 256 * 1024 # `on auto`: copies of at least this many bytes go to SDMA
# MoE routing (strata::Router): per-core expert counters (8192 x int32), and for gather two
# double-buffered queues of 2048 elements (4-byte worst case) plus two float accumulators.
ROUTE_META_BYTES = 8192 * 4 + 1024 * 8    # strata::Router meta_ (counters) + stage_ (ids, weights)
ROUTE_GATHER_BYTES = 2 * 2 * 2048 * 4 + 2 * 2048 * 4
MASK_BYTES = ir.MASK_MAX_WORLD // 8       # strata::Ranks: one bit per rank (strata::kMaskBytes)

# Vector cores (AIV) per SoC, from the public hardware descriptions.
SOCS = {
    "Ascend910B1": 48, "Ascend910B2": 48, "Ascend910B3": 40, "Ascend910B4": 40,
    "Ascend910_9381": 48, "Ascend910_9382": 48, "Ascend910_9391": 48, "Ascend910_9392": 48,
}
DEFAULT_SOC = "Ascend910B3"


@dataclass(frozen=True)
class Options:
    soc: str = DEFAULT_SOC
    cores: int | None = None            # None: every vector core of the SoC
    sdma_threshold: int = SDMA_THRESHOLD
    # False only for `stratac bench --agreement-cost`, which measures what the ranks' agreement on
    # each call costs against the same kernel without it (docs/bench.md); such a kernel's calls
    # are not checked across ranks.
    agreement: bool = True
    # False only for `stratac bench --two-pass-places`, which measures a dispatch whose places of
    # rows and of their scales each scan the ids, against the same dispatch joined (join_places)
    join_places: bool = True

    def resolved_cores(self) -> int:
        return self.cores if self.cores is not None else SOCS[self.soc]

    def check(self) -> None:
        if self.soc not in SOCS:
            raise StrataError(error(Codes.BAD_ENGINE, f"unknown SoC {self.soc!r}; known: "
                                    f"{', '.join(SOCS)}"))
        if self.cores is not None and not 1 <= self.cores <= SOCS[self.soc]:
            raise StrataError(error(Codes.BAD_ENGINE, f"--cores must be between 1 and "
                                    f"{SOCS[self.soc]} on {self.soc}, got {self.cores}"))


def flag_epochs(s: ir.Schedule) -> ir.Schedule:
    body, places = _stamp_barriers(s.body, ir.Const(0))
    flags, total = [], places     # a flag's round r has stamp seq + r: its rounds take R stamps
    for f in s.flags:
        flags.append(replace(f, seq=ir.simplify(ir.add(total, ir.Const(1)))))
        total = ir.simplify(ir.add(total, f.rounds))
    flags = tuple(flags)
    if isinstance(total, ir.Const) and all(isinstance(f.seq, ir.Const) for f in flags):
        # the usual case: a constant number of stamps per call
        return replace(s, body=body, flags=tuple(replace(f, seq=f.seq.value) for f in flags),
                       sync_ops=total.value)
    # barriers in step loops: the stamps per call depend on world and sizes (Schedule.stamps);
    # sync_ops is then the expression's constant part
    const = 0
    if isinstance(total, ir.Bin) and total.kind is ir.BinKind.ADD:
        const = next((x.value for x in (total.lhs, total.rhs) if isinstance(x, ir.Const)), 0)
    return replace(s, body=body, flags=flags, sync_ops=const, sync_expr=total)


def _most(a: ir.IExpr, b: ir.IExpr) -> ir.IExpr:
    if isinstance(a, ir.Const) and isinstance(b, ir.Const):
        return ir.Const(max(a.value, b.value))
    return ir.simplify(ir.Bin(ir.BinKind.MAX, a, b))


def _stamp_barriers(ops, before: ir.IExpr) -> tuple[tuple, ir.IExpr]:
    """ops with every barrier stamped by its place in the program: 1 + the places before it; and
    the places ops take. A barrier takes one place. An `if` takes as many as its longer arm, and
    the k-th barrier of either arm takes the same place, so that every rank has the same stamp
    after the if whichever arm it took, and the members of a barrier that only some ranks pass
    (`if node.rank == 0 { barrier(lane) }`) meet the others at the barriers after it. A step loop
    takes its trips times its body's places, the same on every iteration (sema checks it), so its
    k-th barrier of iteration var is before + (var - lo) * B + k. (`Instance` numbers the barriers
    of the verified schedule by the same rule on its own, and check.verify_lowered compares the
    two.)"""
    out, places = [], ir.Const(0)
    for op in ops:
        at = ir.simplify(ir.add(before, places))
        if isinstance(op, ir.Barrier):
            op = replace(op, seq=ir.simplify(ir.add(at, ir.Const(1))))
            places = ir.simplify(ir.add(places, ir.Const(1)))
        elif isinstance(op, ir.If):
            then, a = _stamp_barriers(op.then, at)
            orelse, b = _stamp_barriers(op.orelse, at)
            op = replace(op, then=then, orelse=orelse)
            places = ir.simplify(ir.add(places, _most(a, b)))
        elif isinstance(op, ir.Loop) and op.domain is ir.Domain.RANGE and _has_barrier(op.body):
            per = step_barriers(op)
            done = ir.Bin(ir.BinKind.MUL, ir.Bin(ir.BinKind.SUB, ir.Var(op.var), op.lo), per)
            body, _ = _stamp_barriers(op.body, ir.simplify(ir.add(at, done)))
            op = replace(op, body=body)
            trips = ir.Bin(ir.BinKind.MUL, ir.Bin(ir.BinKind.SUB, op.hi, op.lo),
                           ir.Bin(ir.BinKind.GT, op.hi, op.lo))
            places = ir.simplify(ir.add(places, ir.Bin(ir.BinKind.MUL, trips, per)))
        out.append(op)
    return tuple(out), places


def step_barriers(loop: ir.Loop) -> ir.IExpr:
    """The barrier places one iteration of a step loop takes (its body's: _stamp_barriers). The
    stamps assume it is the same on every iteration, so sema refuses a loop where it depends on
    anything but world, sizes and rank parameters (an inner step loop whose bounds name the loop
    variable)."""
    _, per = _stamp_barriers(loop.body, ir.Const(0))
    return ir.simplify(per)


def _has_barrier(ops) -> bool:
    return any(isinstance(op, ir.Barrier)
               or (isinstance(op, ir.If) and _has_barrier(op.then + op.orelse))
               or (isinstance(op, ir.Loop) and _has_barrier(op.body)) for op in ops)


def _moves(ops):
    for op in ops:
        if isinstance(op, ir.Loop):
            yield from _moves(op.body)
        elif isinstance(op, ir.If):
            yield from _moves(op.then + op.orelse)
        else:
            yield op


def stages(ops):
    """Every stage, including those under ifs, in program order."""
    for op in ops:
        if isinstance(op, ir.Stage):
            yield op
        elif isinstance(op, ir.If):
            yield from stages(op.then + op.orelse)
        elif isinstance(op, ir.Loop):      # a step loop around stages
            yield from stages(op.body)


def place_engines(s: ir.Schedule, opts: Options) -> ir.Schedule:
    def plan(op):
        if isinstance(op, ir.If):
            return replace(op, then=tuple(map(plan, op.then)), orelse=tuple(map(plan, op.orelse)))
        if isinstance(op, ir.Loop):
            return replace(op, body=tuple(map(plan, op.body)))
        if not isinstance(op, ir.Stage):
            return op
        moves = list(_moves(op.body))
        # an accumulate goes through the copy queue, with the DMA's atomic mode on
        # place moves rows with the same copies
        copies = any(isinstance(m, (ir.Copy, ir.Accumulate)) or (
            isinstance(m, ir.Route) and m.kind is ir.RouteKind.PLACE) for m in moves)
        return replace(op, plan=ir.Plan(
            copies_on_aiv=copies and op.engine in (ir.Engine.AIV, ir.Engine.AUTO),
            copies_on_sdma=copies and op.engine in (ir.Engine.SDMA, ir.Engine.AUTO),
            reduces=any(isinstance(m, (ir.Reduce, ir.ReduceList)) for m in moves),
            routes=any(isinstance(m, ir.Route) for m in moves),
            sdma_threshold=opts.sdma_threshold))
    return replace(s, body=tuple(map(plan, s.body)))


def joinable(first, second) -> bool:
    """Whether place `second`, right after place `first` in one stage, may be made in first's pass
    over the ids: the same ids and offsets, and four distinct buffers (the windows written, the
    rows read), neither window being the ids or the offsets. Then the joined pass writes what the
    two places write one after the other, and reads nothing either writes."""
    K = ir.RouteKind
    if not (isinstance(first, ir.Route) and isinstance(second, ir.Route)
            and first.kind is K.PLACE and second.kind is K.PLACE and not first.joined):
        return False
    (x1, ids1, offs1), (x2, ids2, offs2) = first.operands, second.operands
    w1, w2 = first.dst.buffer, second.dst.buffer
    return (ids1, offs1) == (ids2, offs2) and len({w1, w2, x1, x2}) == 4 and not {w1, w2} & {ids1, offs1}


def join_places(s: ir.Schedule, opts: Options) -> ir.Schedule:
    """Two places of one stage that route by the same ids and offsets (an int8 dispatch's rows and
    their scales) become one pass over the ids (strata::Router::Place with a second payload): the
    second is marked joined. The pass only marks; the verifier checks the marks (check.py)."""
    if not opts.join_places:
        return s

    def seq(ops) -> tuple:
        out = []
        for op in ops:
            if isinstance(op, (ir.Stage, ir.Loop)):
                op = replace(op, body=seq(op.body))
            elif isinstance(op, ir.If):
                op = replace(op, then=seq(op.then), orelse=seq(op.orelse))
            elif out and joinable(out[-1], op):
                op = replace(op, joined=True)
            out.append(op)
        return tuple(out)
    return replace(s, body=seq(s.body))


def expressions(s: ir.Schedule):
    """Every integer expression of the schedule."""
    for p in s.params:
        yield p.size
        yield from p.dims
    for f in s.flags:
        yield f.size
        yield f.rounds

    def region(r: ir.Region):
        yield from (r.lo, r.length)
        if r.rank is not None:
            yield r.rank
        if r.part is not None:
            yield from r.part
        if r.sub is not None:
            yield from r.sub[1:]

    def walk(ops):
        for op in ops:
            if isinstance(op, ir.If):
                yield op.cond
                yield from walk(op.then + op.orelse)
            elif isinstance(op, (ir.Stage, ir.Loop)):
                if isinstance(op, ir.Loop) and op.domain is ir.Domain.RANGE:
                    yield from (op.lo, op.hi)
                yield from walk(op.body)
            elif isinstance(op, ir.Barrier):
                yield op.seq
            elif isinstance(op, ir.Signal):
                yield from (op.index, op.rank, op.round)
            elif isinstance(op, ir.Wait):
                yield from (op.index, op.round)
            elif isinstance(op, ir.Await):
                continue
            elif isinstance(op, (ir.Local, ir.Set)):
                yield op.value
                extent = op.size if isinstance(op, ir.Local) else op.index
                if extent is not None:
                    yield extent
            elif isinstance(op, ir.Route):
                yield from region(op.dst)
                if op.capacity is not None:
                    yield op.capacity
            else:
                if isinstance(op, ir.Reduce) and op.count is not None:
                    yield from (op.count, op.skip)
                yield from region(op.dst)
                for src in ir.sources(op):
                    yield from region(src)

    yield from walk(s.body)


def conditional_conds(e: ir.IExpr):
    """The conditions of the conditional expressions `(a if c else b)` inside e, outermost first."""
    if isinstance(e, ir.Sel):
        yield e.cond
        for x in (e.cond, e.then, e.orelse):
            yield from conditional_conds(x)
    elif isinstance(e, ir.Bin):
        yield from conditional_conds(e.lhs)
        yield from conditional_conds(e.rhs)
    elif isinstance(e, ir.Elem):
        yield from conditional_conds(e.index)


def routes(s: ir.Schedule) -> list[ir.Route]:
    return [m for st in stages(s.body) for m in _moves(st.body) if isinstance(m, ir.Route)]


def window_row_faults(s: ir.Schedule, dtype: ir.DType, env: dict) -> list[tuple[ir.Buffer, int]]:
    """The `place` destinations of s (MoE windows other ranks write rows into) whose row, with the
    sizes of env and the call's dtype for T, is not a whole number of ir.WINDOW_ROW_ALIGN-byte blocks:
    (buffer, its row's columns) each. Only int8 rows are refused at a call (a T window at an odd
    hidden is the open risk docs/npu.md names); constant widths are refused by sema."""
    out = []
    for node in routes(s):
        if node.kind is ir.RouteKind.PLACE:
            b = s.param(node.dst.buffer)
            d = b.dtype or dtype
            if d is ir.DType.I8 and len(b.shape) == 2:
                cols = int(b.shape[1].eval(env))
                if cols * d.nbytes % ir.WINDOW_ROW_ALIGN and all(f[0] is not b for f in out):
                    out.append((b, cols))
    return out


def tile_ub(s: ir.Schedule, opts: Options) -> ir.Schedule:
    plans = [op.plan for op in stages(s.body)]
    rs = routes(s)
    copy_tiles = QUEUE_DEPTH if any(p.copies_on_aiv for p in plans) else 0
    reduce_tiles = 2 * QUEUE_DEPTH if any(p.reduces for p in plans) else 0
    route_bytes = (ROUTE_META_BYTES if rs else 0) + (
        ROUTE_GATHER_BYTES if any(r.kind is ir.RouteKind.GATHER for r in rs) else 0)
    tiles = copy_tiles + reduce_tiles
    # The reduction's 4 tiles hold, for 32-bit types, two input and two output tiles; for half and
    # bfloat16, two input and two output tiles of half the size plus a float accumulator and a
    # float temporary of a whole tile each (they accumulate in float: strata::Mover). Half tiles
    # must stay 32-byte aligned, so a kernel that reduces takes tiles in multiples of 64 bytes.
    grain = 64 if reduce_tiles else 32
    mask_bytes = MASK_BYTES if ir.takes_mask(s) else 0
    fixed = SCRATCH_BYTES + route_bytes + mask_bytes
    tile = ((UB_BYTES - fixed) // tiles) // grain * grain if tiles else 0
    ub = tiles * tile + fixed
    assert ub <= UB_BYTES
    kernel = ir.KernelPlan(copy_tiles, reduce_tiles, tile, SCRATCH_BYTES, ub,
                           opts.resolved_cores(), opts.soc, route_bytes, opts.agreement, mask_bytes)
    return replace(s, kernel=kernel)


def pipeline(s: ir.Schedule, opts: Options) -> ir.Schedule:
    """The passes for the Ascend target (the CPU build compiles the very same kernels)."""
    opts.check()
    s = flag_epochs(s)
    s = place_engines(s, opts)
    s = join_places(s, opts)
    s = tile_ub(s, opts)
    return s
