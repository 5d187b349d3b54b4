"""The cost of one stage on every rank that runs it. In: a Template, the lengths at one size, the
element bytes, a Machine, the cores per rank and, for routing constructs, a sample routing. Out: a
StageCost per stage: time, the resource that set it, and the bytes each phase puts on every link
and HBM.

Work. Each stage of each rank is split over the vector cores the way the kernels split it
(strata::Partition: the elements the stage moves, end to end in program order, cut evenly by
32-byte blocks). A core's piece of a copy goes to SDMA (`on sdma`, or `on auto` from the threshold
the passes chose, decided per piece like the kernel does) or through the core's UB. Per core: bytes
read GM -> UB, written UB -> GM and folded by the vector unit; per SDMA queue: bytes and SQEs.
SDMA is not free for the core that posts it (runtime/device/strata_device.h, Mover::SdmaCopy): each
piece is one post, cut into posts of at most SDMA_SQE_LIMIT SQEs, each post into SQEs of at most
the machine's sqe_bytes; the core spends sqe_issue_us per SQE and per quiet (one at the end of the
stage, and one whenever the next post would take more than SDMA_SQE_LIMIT SQEs outstanding), and
the queue post_us per SQE.
Data travels source owner -> running rank -> destination owner; a byte whose owner is another rank
crosses that rank's UB link (tx) and the running rank's (rx), or the reverse. Every byte read or
written is HBM traffic of its owner.

Time of a stage on a rank: the slowest of its resources (busiest core, busiest SDMA queue, its own
UB link in each direction, its own HBM), plus the end-of-stage SyncAll, plus one fabric latency if
it touched another rank's memory. A core's time is its scalar work, then its MTE and vector work
plus its SQE issue (the post path drains the pipes: they do not overlap); the core and its queue
overlap (an upper bound on neither: the slower of the two sets the stage).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratac import ir
from stratac.ir import passes
from stratac.tools.simulate.machine import Machine, SimulateError
from stratac.tools.simulate.sample_routing import Routed
from stratac.tools.simulate.template import (
    ACCUMULATE,
    COPY,
    REDUCE,
    StageMoves,
    Template,
    count,
    holds,
)

BLOCK_BYTES = 32   # the kernels partition a stage over the cores in whole DataCopy blocks
# strata_device.h kSdmaSqeLimit: a core quiets before the SQEs it posted since its last quiet would
# exceed this, and cuts a longer piece into posts of at most this many SQEs
# (tests/simulate/test_sdma.py checks it against the header)
SDMA_SQE_LIMIT = 192
CATEGORIES = ("fabric", "hbm", "aiv", "sdma", "latency", "scalar")

# Routing metadata runs on a vector core's scalar unit (strata::Router in
# runtime/device/strata_device.h: histogram, exscan and slots on core 0, one GM value at a time;
# place and gather scan the ids on every core). No machine file has a figure for it and we found no
# public one, so both of these are ASSUMPTIONS (plausible orders of magnitude, not sources):
SCALAR_CALL_US = 1.0        # assumption: entering a routing call (per-expert UB counters cleared,
                            # the data cache flushed after the metadata is written)
SCALAR_ELEMENT_US = 0.01    # assumption: 10 ns per id, count or offset the scalar unit reads or
                            # writes (GM GetValue/SetValue through the scalar data cache)
# gather's vector work, in passes over a row of f32 (Router::Gather): per routed entry cast to f32
# (not for f32 tokens), scale by the weight, add; per token zero the accumulator and cast (copy) out
GATHER_ENTRY_PASSES = {2: 3, 4: 2}   # element bytes of the tokens -> passes per entry
GATHER_TOKEN_PASSES = 2


@dataclass
class StageCost:
    time_us: np.ndarray                    # per rank (only ranks that run the stage are meaningful)
    category: list[str]                    # per rank: the resource that set the time
    busy_us: np.ndarray                    # per rank: the resource time without the overheads
    loads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]   # phase -> tx, rx, hbm bytes per rank
    scalar_us: np.ndarray | None = None    # per rank: the part of busy_us that is scalar work
    issue_us: np.ndarray | None = None     # per rank: the part of busy_us that is SDMA SQE issue
                                           # (the busiest core's, when a core sets the time)
    core_us: np.ndarray | None = None      # per rank: the busiest core's own time (scalar work, its
                                           # data through UB, its SQE issue): what an asynchronous
                                           # stage holds the cores for before the statements after it
    queue_us: np.ndarray | None = None     # per rank: the busiest SDMA queue's time (0: no SDMA)


class _Work:
    """What one stage asks of every rank's cores, queues, links and memory (bytes, posts, scalar
    microseconds); ordinary moves and routing constructs add to it."""

    def __init__(self, world: int, cores: int, queues: int):
        self.world, self.C, self.Q = world, cores, queues
        n = world * cores
        self.core_in, self.core_out, self.core_vec, self.core_scalar = (np.zeros(n) for _ in range(4))
        self.core_sqes, self.core_quiets = np.zeros(n), np.zeros(n)
        self.q_bytes, self.q_sqes = np.zeros(world * queues), np.zeros(world * queues)
        # SDMA pieces in program order: (cores, bytes) arrays of ordinary copies, then place's
        # (core, rows, row bytes); only needed to count the quiets of cores past SDMA_SQE_LIMIT
        self.pieces: list[tuple[np.ndarray, np.ndarray]] = []
        self.row_posts: list[tuple[int, int, int]] = []
        self.tx_own, self.rx_own, self.hbm_own = (np.zeros(world) for _ in range(3))
        self.touched = np.zeros(world, dtype=bool)
        self.loads: dict[int, list[np.ndarray]] = {}

    def load(self, ph: int) -> list[np.ndarray]:
        return self.loads.setdefault(ph, [np.zeros(self.world) for _ in range(3)])


def stage_cost(t: Template, index: int, lens: np.ndarray, elem: int, m: Machine, cores: int,
               routed: Routed | None = None) -> StageCost:
    sm = t.stages[index]
    a = sm.arrays
    world, C, Q = t.world, cores, m.queues
    L = lens[a["key"]] if len(a["key"]) else np.zeros(0, dtype=np.int64)
    issuer, kind = a["issuer"], a["kind"]
    # a region of a typed buffer (i32 counts) moves as whole elements of T (strata::Ratio)
    L = L * np.where(a["scale"] > 0, np.maximum(1, a["scale"] // elem), 1) if len(L) else L
    w = _Work(world, C, Q)
    count = a["count"]              # moves an entry stands for (a run: StageMoves.count)
    span = L * count                # an entry's elements, end to end

    # strata::Partition: the stage's elements of each rank, end to end, cut by blocks over the cores
    T = np.bincount(issuer, weights=span, minlength=world).astype(np.int64) if len(L) else \
        np.zeros(world, dtype=np.int64)
    per = max(1, BLOCK_BYTES // elem)
    blocks = (T + per - 1) // per
    c = np.arange(C, dtype=np.int64)
    lo = np.minimum(T[:, None], (blocks[:, None] * c[None, :] // C) * per)
    base = np.concatenate(([0], np.cumsum(T)[:-1]))
    bin_start = (base[:, None] + lo).ravel()
    total = int(T.sum())
    if total:
        mv_start = np.concatenate(([0], np.cumsum(span)[:-1]))
        cuts = np.sort(np.concatenate((mv_start, bin_start, [total])))
        cuts = cuts[(cuts <= total) & np.concatenate(([True], cuts[1:] != cuts[:-1]))]
        seg_start, seg_len = cuts[:-1], np.diff(cuts)
        seg_mv = np.searchsorted(mv_start, seg_start, side="right") - 1
        seg_bin = np.searchsorted(bin_start, seg_start, side="right") - 1
        seg_len, mult, seg_mv, seg_bin = _run_pieces(seg_start - mv_start[seg_mv], seg_len, seg_mv,
                                                     seg_bin, L, count)
        seg_kind = kind[seg_mv]
        nb = seg_len.astype(np.float64) * elem
        engine = sm.stage.engine
        if engine is ir.Engine.SDMA:
            sdma = seg_kind == COPY
        elif engine is ir.Engine.AUTO:
            sdma = (seg_kind == COPY) & (nb >= _threshold(sm))
        else:
            sdma = np.zeros(len(nb), dtype=bool)
        k = a["nsrc"][seg_mv]
        w.core_in += np.bincount(seg_bin, weights=np.where(sdma, 0.0, k * nb * mult), minlength=world * C)
        w.core_out += np.bincount(seg_bin, weights=np.where(sdma, 0.0, nb * mult), minlength=world * C)
        w.core_vec += np.bincount(seg_bin, weights=np.where(seg_kind == REDUCE, k * nb * mult, 0.0),
                                  minlength=world * C)
        queue = (seg_bin // C) * Q + (seg_bin % C) % Q
        w.q_bytes += np.bincount(queue, weights=np.where(sdma, nb * mult, 0.0), minlength=world * Q)
        if sdma.any():
            on = np.flatnonzero(sdma)
            _sdma_pieces(w, seg_bin[on], nb[on].astype(np.int64), m.sqe_bytes, mult[on])

    # traffic: source owner -> running rank -> destination owner; every access is HBM traffic
    src_move, src_owner, dst = a["src_move"], a["src_owner"], a["dst"]
    src_bytes = span[src_move].astype(np.float64) * elem      # a run reads its source count times
    src_issuer = issuer[src_move]
    src_remote = (src_owner != src_issuer) & (src_bytes > 0)
    move_bytes = L.astype(np.float64) * elem                   # one move's
    dst_listed = a["dst_set"][:, 2] == 0
    dst_bytes = np.where(dst_listed, span.astype(np.float64) * elem, 0.0)
    dst = np.where(dst_listed, dst, issuer)                    # (-1 where every rank: no bytes)
    dst_remote = (dst != issuer) & (dst_bytes > 0)
    # own link: what this rank's own moves put through its own UB link
    w.rx_own += np.bincount(src_issuer, weights=np.where(src_remote, src_bytes, 0.0), minlength=world)
    w.tx_own += np.bincount(issuer, weights=np.where(dst_remote, dst_bytes, 0.0), minlength=world)
    dst_hbm = np.where(kind == ACCUMULATE, 2.0, 1.0) * dst_bytes     # an atomic add reads and writes
    w.hbm_own += (np.bincount(src_issuer, weights=np.where(src_remote, 0.0, src_bytes), minlength=world)
                  + np.bincount(issuer, weights=np.where(dst_remote, 0.0, dst_hbm), minlength=world))
    w.touched |= (np.bincount(src_issuer, weights=src_remote.astype(np.float64), minlength=world)
                  + np.bincount(issuer, weights=dst_remote.astype(np.float64), minlength=world)) > 0
    # sources (a reduction's, or a run's) and a run's destinations held as a set of ranks (every
    # rank, every peer, a team's members; StageMoves.src_set, dst_set), not listed: a remote read
    # (write) of one move's bytes per member but the issuer, and the issuer's own a local one
    move_hbm = np.where(kind == ACCUMULATE, 2.0, 1.0) * move_bytes
    read = _Spread(a["src_set"], issuer, move_bytes, move_bytes, world)
    written = _Spread(a["dst_set"], issuer, move_bytes, move_hbm, world)
    w.rx_own += read.issued(None)
    w.tx_own += written.issued(None)
    w.touched |= np.bincount(issuer, weights=(read.reaches | written.reaches).astype(np.float64),
                             minlength=world) > 0
    w.hbm_own += read.own_hbm() + written.own_hbm()

    # every link's and every HBM's load, per phase of the ranks running the stage
    phase_of = np.full(world, -1, dtype=np.int64)
    for r, ph in sm.phase.items():
        phase_of[r] = ph
    for ph in sorted(set(sm.phase.values())):
        sel_src = phase_of[src_issuer] == ph
        sel_dst = phase_of[issuer] == ph
        w_src = np.where(sel_src & src_remote, src_bytes, 0.0)
        w_dst = np.where(sel_dst & dst_remote, dst_bytes, 0.0)
        tx, rx, hbm = w.load(ph)
        tx += np.bincount(src_owner, weights=w_src, minlength=world) + \
            np.bincount(issuer, weights=w_dst, minlength=world)
        rx += np.bincount(src_issuer, weights=w_src, minlength=world) + \
            np.bincount(dst, weights=w_dst, minlength=world)
        hbm += np.bincount(src_owner, weights=np.where(sel_src, src_bytes, 0.0), minlength=world) + \
            np.bincount(dst, weights=np.where(sel_dst, dst_hbm, 0.0), minlength=world)
        if read.on.any():       # each rank is read by the entries whose set holds it
            rx += read.issued(sel_dst)
            tx += read.others(sel_dst)
            hbm += read.hbm(sel_dst)
        if written.on.any():    # each rank is written by the entries whose set holds it
            tx += written.issued(sel_dst)
            rx += written.others(sel_dst)
            hbm += written.hbm(sel_dst)

    if sm.routes:
        _route_work(sm, w, routed, elem, m, phase_of)
    _count_quiets(w, m.sqe_bytes)
    queue_of = (np.arange(world * C) // C) * Q + (np.arange(world * C) % C) % Q
    w.q_sqes += np.bincount(queue_of, weights=w.core_sqes, minlength=world * Q)

    per_us = lambda gbps: gbps * 1e3   # GB/s -> bytes per microsecond
    data_us = np.maximum.reduce([w.core_in / per_us(m.gm_to_ub_gbps), w.core_out / per_us(m.ub_to_gm_gbps),
                                 w.core_vec / per_us(m.vector_gbps)])
    # a core's scalar work (routing metadata, id scans) comes before the data it moves or posts;
    # posting SDMA drains the core's pipes (PipeBarrier<PIPE_ALL>), so it adds to its MTE time
    issue = (w.core_sqes + w.core_quiets) * m.sqe_issue_us
    core_us = (w.core_scalar + data_us + issue).reshape(world, C)
    core_at = core_us.argmax(axis=1)
    aiv_us = core_us.max(axis=1)
    aiv_scalar = w.core_scalar.reshape(world, C)[np.arange(world), core_at]
    aiv_issue = issue.reshape(world, C)[np.arange(world), core_at]
    q_scalar = np.zeros(world * Q)
    np.maximum.at(q_scalar, queue_of, w.core_scalar)
    q_scalar = np.where(w.q_sqes > 0, q_scalar, 0.0)
    q_us = (q_scalar + w.q_bytes / per_us(m.queue_gbps) + w.q_sqes * m.post_us).reshape(world, Q)
    q_at = q_us.argmax(axis=1)
    sdma_us = q_us.max(axis=1)
    sdma_scalar = q_scalar.reshape(world, Q)[np.arange(world), q_at]
    fabric_us = np.maximum(w.tx_own, w.rx_own) / per_us(m.fabric_gbps)
    hbm_us = w.hbm_own / per_us(m.hbm_gbps)

    parts = np.stack([fabric_us, hbm_us, aiv_us, sdma_us])     # in CATEGORIES order
    busy = parts.max(axis=0)
    which = parts.argmax(axis=0)
    scalar = np.select([which == 2, which == 3], [aiv_scalar, sdma_scalar], 0.0)
    issued = np.where(which == 2, aiv_issue, 0.0)
    # the core's SQE issue is SDMA's cost: the critical path books it under "sdma"
    category = [CATEGORIES[i] if b > s + q else ("sdma" if q > 0 else "scalar" if b > 0 else "latency")
                for i, b, s, q in zip(which, busy, scalar, issued)]
    time_us = busy + m.sync_all_us + np.where(w.touched, m.fabric_latency_us, 0.0)
    loads = {ph: tuple(v) for ph, v in w.loads.items()}
    return StageCost(time_us, category, busy, loads, scalar, issued, aiv_us, sdma_us)


class _Spread:
    """The entries of a stage whose sources (or destinations) are a held set of ranks
    (StageMoves.src_set, dst_set: start, step, size, skip; LISTED entries, of size 0, take no part):
    per rank, the bytes its own entries move to or from the others, the bytes the others' entries
    move to or from it, and its HBM traffic. `sel`: the entries of one phase (None: all)."""

    def __init__(self, sets: np.ndarray, issuer: np.ndarray, nbytes: np.ndarray, hbm_bytes: np.ndarray,
                 world: int):
        self.start, self.step, self.size, self.skip = sets.T
        self.on = (self.size > 0) & (nbytes > 0)
        # the issuer is one of the set's ranks (a reduction over the ranks; not over the peers)
        self.mine = self.on & holds(sets.T, issuer)
        self.remote = count(sets.T) - self.mine     # its ranks but the issuer
        self.reaches = self.on & (self.remote > 0)
        self.issuer, self.nbytes, self.hbm_bytes, self.world = issuer, nbytes, hbm_bytes, world

    def _per_issuer(self, which: np.ndarray, sel, values: np.ndarray) -> np.ndarray:
        on = which if sel is None else which & sel
        return np.bincount(self.issuer, weights=np.where(on, values, 0.0), minlength=self.world)

    def _per_member(self, sel, values: np.ndarray) -> np.ndarray:
        """Per rank, the sum of values over the entries whose set holds it: a difference array per
        stride (rank d is row d // step of residue d % step), summed up each residue's rows."""
        on = self.on if sel is None else self.on & sel
        out = np.zeros(self.world)
        for step in np.unique(self.step[on]):
            pick = on & (self.step == step)
            start, size, v = self.start[pick], self.size[pick], values[pick]
            rows = -(-self.world // step) + 1
            flat = (start % step) * rows + start // step
            diff = np.bincount(flat, weights=v, minlength=step * rows) - \
                np.bincount(flat + size, weights=v, minlength=step * rows)
            out += np.cumsum(diff.reshape(step, rows), axis=1)[:, :-1].T.ravel()[:self.world]
        skipped = on & (self.skip >= 0)
        return out - np.bincount(self.skip[skipped], weights=values[skipped], minlength=self.world)

    def issued(self, sel) -> np.ndarray:
        """What each rank's own entries move over its link: a remote move per rank of the set but
        itself."""
        return self._per_issuer(self.on, sel, self.remote * self.nbytes)

    def others(self, sel) -> np.ndarray:
        """What the other ranks' entries move to or from each rank's memory over its link."""
        return self._per_member(sel, self.nbytes) - self._per_issuer(self.mine, sel, self.nbytes)

    def hbm(self, sel) -> np.ndarray:
        """Each rank's HBM traffic from the entries whose set holds it (its own included)."""
        return self._per_member(sel, self.hbm_bytes)

    def own_hbm(self) -> np.ndarray:
        """The issuer's local access of the entries whose set holds it."""
        return self._per_issuer(self.mine, None, self.hbm_bytes)


def _run_pieces(offset: np.ndarray, length: np.ndarray, mv: np.ndarray, core: np.ndarray,
                L: np.ndarray, count: np.ndarray):
    """The partition's segments (each within one entry and one core: its offset into the entry,
    its length, the entry, the core) as the pieces the kernel copies: a segment of a run (an entry
    of count > 1: moves of L elements end to end) is cut at its moves' ends into a first piece, the
    whole moves within it, and a last piece. Returns (length, multiplicity, entry, core) per piece,
    in program order."""
    run = count[mv] > 1
    if not run.any():
        return length, np.ones(len(length), dtype=np.int64), mv, core
    Lm = np.where(run, L[mv], 1)
    end = offset + length
    j0, j1 = offset // Lm, (end - 1) // Lm          # the moves holding its first and last element
    one = ~run | (j0 == j1)
    first = np.where(one, length, (j0 + 1) * Lm - offset)
    whole = np.where(one, 0, j1 - j0 - 1)
    last = np.where(one, 0, end - j1 * Lm)
    lens = np.stack([first, Lm, last], axis=1).ravel()
    mult = np.stack([np.ones_like(whole), whole, (last > 0).astype(np.int64)], axis=1).ravel()
    keep = (mult > 0) & (lens > 0)
    rep = lambda x: np.repeat(x, 3)[keep]
    return lens[keep], mult[keep], rep(mv), rep(core)


def _post_runs(nbytes: int, sqe_bytes: int) -> list[tuple[int, int]]:
    """One SDMA piece of `nbytes` as Mover::SdmaCopy posts it: (SQEs of a post, posts) runs: posts of
    SDMA_SQE_LIMIT SQEs, then the rest."""
    whole = SDMA_SQE_LIMIT * sqe_bytes
    full, rest = divmod(nbytes, whole)
    runs = [(SDMA_SQE_LIMIT, full)] if full else []
    if rest:
        runs.append((-(-rest // sqe_bytes), 1))
    return runs


def _sdma_pieces(w: _Work, cores: np.ndarray, nbytes: np.ndarray, sqe_bytes: int,
                 mult: np.ndarray | None = None) -> None:
    """Adds SDMA pieces (one Mover::Copy each: the core, the bytes; `mult`: how many such pieces
    in a row, for a run's whole moves), in program order, to the cores' SQEs."""
    whole = SDMA_SQE_LIMIT * sqe_bytes
    full, rest = nbytes // whole, nbytes % whole
    sqes = full * SDMA_SQE_LIMIT + (rest + sqe_bytes - 1) // sqe_bytes
    if mult is None:
        mult = np.ones(len(nbytes), dtype=np.int64)
    np.add.at(w.core_sqes, cores, (sqes * mult).astype(np.float64))
    w.pieces.append((cores, nbytes, mult))


def _count_quiets(w: _Work, sqe_bytes: int) -> None:
    """Every core that posted quiets once at the end of the stage; a core whose SQEs exceed
    SDMA_SQE_LIMIT also quiets on the way, which needs its posts in order (_quiets)."""
    w.core_quiets[:] = w.core_sqes > 0
    over = np.flatnonzero(w.core_sqes > SDMA_SQE_LIMIT)
    if not len(over):
        return
    runs: dict[int, list[tuple[int, int]]] = {int(c): [] for c in over}
    for cores, nbytes, mult in w.pieces:
        sel = np.isin(cores, over)
        for core, nb, k in zip(cores[sel].tolist(), nbytes[sel].tolist(), mult[sel].tolist()):
            runs[core].extend(_post_runs(nb, sqe_bytes) * k)
    for core, rows, rb in w.row_posts:
        if core in runs:
            per_row = _post_runs(rb, sqe_bytes)
            runs[core].extend([(per_row[0][0], rows)] if len(per_row) == 1 and per_row[0][1] == 1
                              else per_row * rows)
    for core, r in runs.items():
        w.core_quiets[core] = _quiets(r)


def _quiets(runs: list[tuple[int, int]]) -> int:
    """Quiets a core pays for posts of these (SQEs, count) runs in order, as Mover does: before a
    post whose SQEs would take the outstanding count past SDMA_SQE_LIMIT, and once at the end of the
    stage (EndStage) if anything is outstanding."""
    quiets, held = 0, 0
    for q, n in runs:
        if n <= 0 or q <= 0:
            continue
        fit = min(n, (SDMA_SQE_LIMIT - held) // q)      # posts that still fit behind the held SQEs
        held += fit * q
        n -= fit
        if n:
            per = SDMA_SQE_LIMIT // q                     # posts per quiet window from empty
            windows = -(-n // per)
            quiets += windows                             # one quiet before each new window
            held = (n - (windows - 1) * per) * q
    return quiets + (1 if held else 0)


def _threshold(sm: StageMoves) -> float:
    return sm.stage.plan.sdma_threshold if sm.stage.plan else passes.SDMA_THRESHOLD


def _route_work(sm: StageMoves, w: _Work, routed: Routed | None, elem: int, m: Machine,
                phase_of: np.ndarray) -> None:
    """Adds the routing constructs of a stage to its work, from the sample routing (Router in
    runtime/device/strata_device.h).

    Their data movement depends on the expert ids: place = one row copy per routed (token, k)
    entry, from the running rank to the expert's owner, the routed rows split evenly over the cores
    in (t, k) order (SDMA or the core's UB per the stage's engine, one SDMA post per row); gather =
    per routed entry one row read (remote if the owner is another rank) and the weighted f32
    accumulate, the tokens split evenly over the cores, plus one row write per token; histogram,
    exscan and slots = scalar metadata on core 0. Scalar work (those three, and the id scans of
    place and gather) costs SCALAR_CALL_US per call and SCALAR_ELEMENT_US per id, count or offset,
    both assumptions; a place joined to the one before it (passes.join_places) adds its copies
    and no scalar work. Count rows are ordinary copies (stage_cost)."""
    K = ir.RouteKind
    world, C, Q = w.world, w.C, w.Q
    cidx = np.arange(C)
    for r, kind, shape in sm.routes:
        if routed is None:
            raise SimulateError(f"stage {sm.stage.index} routes rows by ids: a sample routing is needed "
                                "(predict_moe)")
        E = shape["experts"]
        core0 = r * C
        if kind is K.HISTOGRAM:         # core 0 reads every id and writes every count
            w.core_scalar[core0] += SCALAR_CALL_US + (shape["n"] + E) * SCALAR_ELEMENT_US
            continue
        if kind is K.EXSCAN:            # core 0 reads the world x experts table, writes the offsets
            w.core_scalar[core0] += SCALAR_CALL_US + (world * E + E) * SCALAR_ELEMENT_US
            continue
        if kind is K.SLOTS:
            w.core_scalar[core0] += SCALAR_CALL_US + E * SCALAR_ELEMENT_US
            continue
        if not shape["sampled"] or routed.world != world or \
                (shape["tokens"], shape["topk"], E) != (routed.tokens, routed.topk, routed.experts):
            raise SimulateError(
                f"{kind.value} routes {shape['tokens']} x {shape['topk']} ids of {shape['ids']} over "
                f"{E} experts, but the sample routing has {routed.tokens} x {routed.topk} ids over "
                f"{routed.experts} experts at world {routed.world}: the model only knows the contract's ids")
        rb = float(shape.get("row_bytes") or shape["hidden"] * elem)   # bytes of one row
        row = routed.owners[r].astype(np.float64) * rb   # bytes to (place) or from (gather) each owner
        mine, remote = row[r], row.sum() - row[r]
        cores = core0 + cidx
        load_tx, load_rx, load_hbm = w.load(int(phase_of[r]))
        w.touched[r] |= remote > 0
        if kind is K.PLACE:
            rows, scanned = routed.place_split(C)
            rows, scanned = rows[r].astype(np.float64), scanned[r]
            if not shape.get("joined"):   # a joined place's rows are found by the scan before it
                w.core_scalar[cores] += SCALAR_CALL_US + (scanned + rows) * SCALAR_ELEMENT_US
            engine = sm.stage.engine
            if engine is ir.Engine.SDMA or (engine is ir.Engine.AUTO and rb >= _threshold(sm)):
                q = r * Q + cidx % Q                     # one post per row, on the core's queue
                np.add.at(w.q_bytes, q, rows * rb)
                w.core_sqes[cores] += rows * sum(a * b for a, b in _post_runs(int(rb), m.sqe_bytes))
                w.row_posts += [(core, n, int(rb)) for core, n in
                                zip(cores.tolist(), rows.astype(np.int64).tolist()) if n]
            else:
                w.core_in[cores] += rows * rb
                w.core_out[cores] += rows * rb
            w.tx_own[r] += remote
            w.hbm_own[r] += routed.routed[r] * rb + mine     # the token rows read, the local rows written
            load_tx[r] += remote
            load_rx += row
            load_rx[r] -= mine
            load_hbm[r] += routed.routed[r] * rb
            load_hbm += row
        else:                           # gather
            entries, ntok, last = routed.gather_split(C)
            entries = entries[r].astype(np.float64)
            w.core_scalar[cores] += SCALAR_CALL_US + (last * routed.topk + 2 * entries) * SCALAR_ELEMENT_US
            w.core_in[cores] += entries * rb
            w.core_out[cores] += ntok * rb
            f32row = shape["hidden"] * 4.0
            w.core_vec[cores] += (entries * GATHER_ENTRY_PASSES.get(elem, 3) + ntok * GATHER_TOKEN_PASSES) * f32row
            y = routed.tokens * rb                      # every token's row is written, routed or not
            w.rx_own[r] += remote
            w.hbm_own[r] += mine + y
            load_rx[r] += remote
            load_tx += row
            load_tx[r] -= mine
            load_hbm += row
            load_hbm[r] += y
