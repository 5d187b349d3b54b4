"""The simulated memory of one instance: where every element's value came from.

In: an instance, then its stage events in an order happens-before allows (fed by the timeline
execution). Out: every buffer's initial and current value by (rank, buffer), and the faults of
routing constructs that wrote outside their window. Every element of every rank starts as a
distinct 64-bit tag; copies move tags and reductions add them (mod 2^64), so a reduced element
equals the expected sum of tags exactly when each expected contribution arrived exactly once.
Routing constructs (histogram, exscan, slots, place, gather) are executed on these values, and
only then are their accesses known: they depend on the expert ids and counts.

The values are held as pieces (`segments`): a tag is affine in its element's index, and every
operation keeps it so, so the simulation's memory and time follow the moves, not the elements.
"""

from __future__ import annotations

import numpy as np

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, StrataError, error
from stratac.ir.instantiate import Access, Event, Instance
from stratac.verify.samples import context, live_entries
from stratac.verify.segments import MASK, Buffer, Segs


def _tag_params(rank: int, buf_index: int, across: int | None = None) -> tuple[int, int]:
    """(a, c) of one buffer instance's tags, element i holding a + c * i (segments.Buffer.tags):
    two splitmix64 draws from (rank, buffer), c made odd. `across` (the buffer's elements on a
    rank): one function over the ranks instead, element i of rank p holding a + c (p across + i)
    with rank 0's draws (_Initial says for which buffer, and segments.py why that proves as much)."""
    if across is not None:
        a, c = _tag_params(0, buf_index)
        return (a + c * rank * across) & MASK, c
    def mix(x: int) -> int:
        x = (x * 0x9E3779B97F4A7C15) & MASK
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & MASK
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & MASK
        return x ^ (x >> 31)
    seed = (rank << 40) + (buf_index << 32) + 1
    return mix(2 * seed), mix(2 * seed + 1) | 1


class _Initial(dict):
    """What every buffer held when the call began, by (rank, buffer): the instance's data (expert
    ids, a combine's counts), else distinct tags. Generated on demand; data is kept only when
    small: a MoE instance's count tables (world x experts per rank) would otherwise be held twice."""

    KEEP = 1 << 16

    def __init__(self, inst: Instance, names: list[str]):
        super().__init__()
        self.inst, self.index = inst, {b: i for i, b in enumerate(names)}
        # the input of an out-of-place AllGather is tagged as one function over the ranks, so that
        # the gathered output (every rank's input in rank order) is one piece on every rank, not
        # world of them: world^2 pieces in all would bound the world the verifier can prove
        c = inst.schedule.contract
        self.across = c.inputs[0] if c.kind is ir.ContractKind.ALLGATHER and not c.in_place else None

    def __missing__(self, key):
        r, b = key
        if key in self.inst.data:
            buf = Buffer.data(np.asarray(self.inst.data[key], dtype=np.int64).reshape(-1).astype(np.uint64))
            if buf.n > self.KEEP:
                return buf
        else:
            n = self.inst.buffer_sizes[b]
            buf = Buffer.tags(n, *_tag_params(r, self.index[b], n if b == self.across else None))
        self[key] = buf
        return buf

    def every(self):
        for r in range(self.inst.world):
            for b in self.index:
                yield (r, b), self[(r, b)]


# The most pieces (segments: runs of elements whose values are one affine function) the simulated
# memory of an instance may hold over all ranks and buffers; each takes about 200 bytes, so this
# bounds it near 1.5 GiB, beside the vector clocks (ir.instantiate.CLOCK_BYTES). A buffer holds a
# piece per run with one source: an AllGather's output, world of them on each rank, world^2 in all
# (67 M at world 8,192). An instance whose moves cut more is refused as soon as they do.
MAX_PIECES = 8_000_000


class Values:
    def __init__(self, inst: Instance):
        self.inst = inst
        self.names = [p.name for p in inst.schedule.params]
        self.init = _Initial(inst, self.names)
        self.cur = {}
        for r in range(inst.world):
            for b in self.names:
                self.cur[(r, b)] = self.init[(r, b)].copy()   # pieces are shared, never changed
        self.faults: list[Diagnostic] = []   # routing that went outside its window
        # (rank, offsets) -> (owner with the most rows, its rows, the window's rows, owners over):
        # the exscan that computed those offsets found a window too small (the bound's status line);
        # place and gather with those offsets then do nothing
        self.overflow: dict[tuple[int, str], tuple[int, int, int, int]] = {}
        self.serial = 1 << 40                # access instances of expanded routing constructs
        self.pieces = sum(len(b.parts) for b in self.cur.values())

    def execute(self, ev: Event) -> None:
        for ri in ev.routes:
            self._route(ri, ev)
        # (called under np.errstate(over="ignore") by the timeline's execution: tags wrap)
        cur = self.cur
        for mv in ev.moves:
            owner, buf, lo, hi = mv.dst
            if hi <= lo:
                continue
            target = cur[(owner, buf)]
            srcs = mv.srcs
            if len(srcs) == 1 and not mv.accumulate:   # a copy: the source's pieces, as they are
                o, b, l, h = srcs[0]
                parts = cur[(o, b)].pieces(l, h)
            else:
                vals = [cur[(o, b)].read(l, h) for o, b, l, h in srcs]
                if mv.accumulate:
                    out = target.read(lo, hi) + vals[0]
                else:   # the sum of every source (of none: zeros)
                    out = vals[0] if vals else Segs.zeros(hi - lo)
                    for v in vals[1:]:
                        out = out + v
                parts = out.parts
            before = len(target.parts)
            target.write(lo, hi, parts)
            self.pieces += len(target.parts) - before
            if self.pieces > MAX_PIECES:
                self._too_many_pieces(mv)

    def _too_many_pieces(self, mv) -> None:
        inst = self.inst
        raise StrataError(error(
            Codes.BAD_WORLD, f"{inst.schedule.name} ({context(inst)}): its simulated memory holds more "
            f"than {MAX_PIECES:,} pieces (runs of elements from one source) over its ranks and buffers, "
            "more than the verifier holds: refused when this move cut the last, before its memory grows "
            "further (a buffer that gathers a block from every rank holds world pieces on every rank); "
            "prove it at a smaller world", mv.span))


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
        # a masked call (inst.active): an entry whose expert lives on a masked rank is dropped,
        # and a masked rank's row of the count table is read as zeros
        live = np.array([self.inst.live(q) for q in range(W)])
        if ri.kind is K.HISTOGRAM:
            ids = self._ints(r, b["ids"])
            if self.inst.active is not None:
                ids = live_entries(ids, E, live)
            ids = ids[(ids >= 0) & (ids < E)]
            out[lo:hi] = np.bincount(ids, minlength=E)[:E].astype(np.uint64)
            return
        L = E // W
        if ri.kind is K.EXSCAN:
            m = self._ints(r, b["counts"]).reshape(W, E) * live[:, None]
            offs = np.zeros(E, dtype=np.int64)
            R = ri.region   # exscan(counts, R): local expert l's region starts at row l * R
            with np.errstate(over="ignore"):   # counts read before they are complete: garbage, reported
                for e in range(E):
                    o, l = divmod(e, L)
                    first = m[:, o * L:o * L + l].sum() if R is None else l * R
                    offs[e] = first + m[:r, e].sum()
            out[lo:hi] = offs.astype(np.uint64)
            # the bound: an owner's rows against its window's rows, or (regions) an expert's rows
            # against R; (the owner or expert with the most rows, its rows, the bound, how many over)
            bound = _window_rows(self.inst, dbuf) if R is None else R
            if bound is not None:
                per = m.reshape(W, W, L).sum(axis=(0, 2)) if R is None else m.sum(axis=0)
                if (per > bound).any():
                    worst = int(np.argmax(per))
                    self.overflow[(r, dbuf)] = (worst, int(per[worst]), bound, int((per > bound).sum()))
            return
        if ri.kind is K.SLOTS:
            e = np.arange(E, dtype=np.int64)
            out[lo:hi] = (((e % L) * W + r) * ri.capacity).astype(np.uint64)
            return
        if (r, b["offs"]) in self.overflow:
            return   # the bound was exceeded: nothing is placed or gathered
        ids = self._ints(r, b["ids"]).reshape(ri.tokens, ri.topk)
        offs = self._ints(r, b["offs"])
        H, seen = ri.hidden, np.zeros(E, dtype=np.int64)
        place = ri.kind is K.PLACE
        win = dbuf if place else b["win"]
        used: list[tuple[int, int]] = []
        rows_out: list = [None] * ri.tokens   # a gathered token: the sum of its weighted rows
        weights = self.cur[(r, b["weights"])] if not place else None
        x = self.cur[(r, b["x"])] if place else None
        with np.errstate(over="ignore"):
            for t in range(ri.tokens):
                for k in range(ri.topk):
                    e = int(ids[t, k])
                    if not 0 <= e < E or not live[e // L]:
                        continue
                    row = int(offs[e]) + int(seen[e])
                    seen[e] += 1
                    o = e // L
                    if not 0 <= row < ri.rows:
                        if not self.faults:
                            self.faults.append(error(
                                Codes.CONTRACT, f"rank {r}: {ri.kind.value} puts token {t} (expert {e}) "
                                f"at row {row} of {win}@{o}, which has {ri.rows} rows "
                                f"({context(self.inst)})", ri.span,
                                Note("the offsets are wrong: are the counts complete when they are read?")))
                        continue
                    used.append((o, row))
                    if place:
                        self.cur[(o, win)][row * H:(row + 1) * H] = x[t * H:(t + 1) * H]
                    else:
                        term = weights[t * ri.topk + k] * self.cur[(o, win)][row * H:(row + 1) * H]
                        rows_out[t] = term if rows_out[t] is None else rows_out[t] + term
        if place:
            self._access(ev, ri, r, b["x"], 0, self.inst.buffer_sizes[b["x"]], False)
            self._rows(ri, ev, used, win, True)
        else:
            self._rows(ri, ev, used, win, False)
            out[lo:hi] = _rows_value(rows_out, H, isinstance(out, np.ndarray))


def _rows_value(rows: list, width: int, dense: bool):
    """Rows of `width` elements, one after the other (a row never written is zeros): pieces, or
    with `dense` an array (a subclass simulating numbers in arrays, tests/e2e/tvkit.py)."""
    if dense:
        zero = np.zeros(width, dtype=np.uint64)
        return np.concatenate([zero if r is None else r for r in rows]) if rows else zero[:0]
    return Segs.concat(Segs.zeros(width) if r is None else r for r in rows)


def _window_rows(inst: Instance, offs: str) -> int | None:
    """The rows of the window that the place or gather using these offsets fills or reads: the
    bound its exscan checks (None without one)."""
    def routes(nodes):
        for op in nodes:
            if isinstance(op, ir.Route):
                yield op
            for part in ("body", "then", "orelse"):
                yield from routes(getattr(op, part, ()))
    for op in routes(inst.schedule.body):
        role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
        if role.get("offs") == offs and op.kind in (ir.RouteKind.PLACE, ir.RouteKind.GATHER):
            win = op.dst.buffer if op.kind is ir.RouteKind.PLACE else role["win"]
            return inst.buffer_shapes[win][0]
    return None
