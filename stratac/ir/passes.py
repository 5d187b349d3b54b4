"""The pass pipeline from verified IR to IR ready for code generation. One explicit list per target.

- flag epochs: every barrier and every flag gets a stamp offset; a call stamps flags with
  epoch + offset, and the next call's epoch is larger than every stamp of this one, so a stale flag
  from an earlier call never satisfies a wait.
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
ROUTE_META_BYTES = 8192 * 4
ROUTE_GATHER_BYTES = 2 * 2 * 2048 * 4 + 2 * 2048 * 4

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
    seq = 0
    body = []
    for op in s.body:
        if isinstance(op, ir.Barrier):
            seq += 1
            op = replace(op, seq=seq)
        body.append(op)
    flags = []
    for f in s.flags:
        seq += 1
        flags.append(replace(f, seq=seq))
    return replace(s, body=tuple(body), flags=tuple(flags), sync_ops=seq)


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


def place_engines(s: ir.Schedule, opts: Options) -> ir.Schedule:
    def plan(op):
        if isinstance(op, ir.If):
            return replace(op, then=tuple(map(plan, op.then)), orelse=tuple(map(plan, op.orelse)))
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
            reduces=any(isinstance(m, ir.Reduce) for m in moves),
            routes=any(isinstance(m, ir.Route) for m in moves),
            sdma_threshold=opts.sdma_threshold))
    return replace(s, body=tuple(map(plan, s.body)))


def routes(s: ir.Schedule) -> list[ir.Route]:
    return [m for st in stages(s.body) for m in _moves(st.body) if isinstance(m, ir.Route)]


def tile_ub(s: ir.Schedule, opts: Options) -> ir.Schedule:
    plans = [op.plan for op in stages(s.body)]
    rs = routes(s)
    copy_tiles = QUEUE_DEPTH if any(p.copies_on_aiv for p in plans) else 0
    reduce_tiles = 2 * QUEUE_DEPTH if any(p.reduces for p in plans) else 0
    route_bytes = (ROUTE_META_BYTES if rs else 0) + (
        ROUTE_GATHER_BYTES if any(r.kind is ir.RouteKind.GATHER for r in rs) else 0)
    tiles = copy_tiles + reduce_tiles
    tile = ((UB_BYTES - SCRATCH_BYTES - route_bytes) // tiles) // 32 * 32 if tiles else 0
    ub = tiles * tile + SCRATCH_BYTES + route_bytes
    assert ub <= UB_BYTES
    kernel = ir.KernelPlan(copy_tiles, reduce_tiles, tile, SCRATCH_BYTES, ub,
                           opts.resolved_cores(), opts.soc, route_bytes)
    return replace(s, kernel=kernel)


def pipeline(s: ir.Schedule, opts: Options) -> ir.Schedule:
    """The passes for the Ascend target (the CPU build compiles the very same kernels)."""
    opts.check()
    s = flag_epochs(s)
    s = place_engines(s, opts)
    s = tile_ub(s, opts)
    return s
