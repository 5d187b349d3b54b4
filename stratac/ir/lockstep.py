"""Instantiate every live rank of a schedule at once: the per-rank walk of `instantiate`, in lockstep.

In: a `_Builder` of `stratac.ir.instantiate` (the schedule, the world, the sizes, the budget). Out:
the same timelines its per-rank walk (`_Builder.timeline`) builds, event for event, or None where
this walk does not take the instance.

The ranks walk the program together as a *group*: the values of names that differ between ranks
(rank, a var, a loop variable whose bounds depend on rank) are numpy arrays over the group, one
entry per rank, and each expression is evaluated once for all of them. An `if` whose condition
differs between ranks splits the group: each arm is walked by its ranks, and the vars they set are
merged back after it (a loop whose bounds differ does the same per trip). Only the events, moves
and accesses are still made one per rank, since the execution, the race check and the contract
read them so.

This walk never reports an error. Any evaluation the per-rank walk would refuse or would have to
check more closely (a negative operand of /, a % by a non-positive number, a shift out of range, a
region outside its buffer or naming a masked rank, a flag slot or round out of range, a value that
could leave int64) makes it give up on the whole instance (`_Bail`), and `instantiate` takes the
per-rank walk, which finds the error and reports it at its place, or accepts what only looked
close. So a diagnostic is always the per-rank walk's, and an instance this walk builds is one that
walk builds too (tests/verify/test_lockstep.py compares them event for event). Routing constructs
(MoE) are left to the per-rank walk. An integer array (`var t[K]`) is a matrix of a row per lane.
"""

from __future__ import annotations

import numpy as np

from stratac import ir
from stratac.diagnostics import StrataError
from stratac.ir.events import Access, Event, EventKind, Move, barred, div, log2, mod, shl, shr

# Every value an array evaluation holds stays below this in magnitude, so that no operation on two
# of them can wrap around int64 unnoticed (the per-rank walk computes with Python's integers).
_LIMIT = 1 << 62


class _Bail(Exception):
    """The lockstep walk does not take this instance: the per-rank walk does (see the module)."""


def timelines(b) -> list[list[Event]] | None:
    """Every rank's timeline (the masked ranks': ENTRY, EXIT), or None: the per-rank walk must
    build this instance (it reports what the lockstep walk would not decide)."""
    try:
        return _Lockstep(b).run()
    except _Bail:
        return None


def evaluate(e: ir.IExpr, env: dict, n: int) -> np.ndarray | None:
    """e for n sets of values at once (env: a name -> an int, or an array of n values) as one
    array, each as the per-rank walk computes it; None where that walk would refuse or check one
    more closely (for a caller that then evaluates them one by one: `stratac simulate`)."""
    try:
        v = _Values(env, n)(e)
    except _Bail:
        return None
    return np.full(n, v, dtype=np.int64) if type(v) is int else v


def over(e: ir.IExpr, env: dict, name: str, values: np.ndarray) -> np.ndarray | None:
    """e at every value of `name` (the other names from env): evaluate's array."""
    return evaluate(e, {**env, name: values}, len(values))


def _check(a: np.ndarray) -> np.ndarray:
    if a.size and (int(a.max()) >= _LIMIT or int(a.min()) <= -_LIMIT):
        raise _Bail
    return a


def _span_of(x) -> tuple[int, int]:
    """(min, max) of an int or an array."""
    if type(x) is int:
        return x, x
    return int(x.min()), int(x.max())


def _bin(kind: ir.BinKind, a, b):
    """a kind b over arrays (either operand may be an int), with the per-rank walk's rules: any
    lane that rule would refuse, or that could leave int64, gives up (_Bail)."""
    K = ir.BinKind
    amin, amax = _span_of(a)
    bmin, bmax = _span_of(b)
    if kind is K.ADD or kind is K.SUB:
        return _check(np.add(a, b) if kind is K.ADD else np.subtract(a, b))
    if kind is K.MUL:
        if max(abs(amin), abs(amax)) * max(abs(bmin), abs(bmax)) >= _LIMIT:
            raise _Bail
        return np.multiply(a, b)
    if kind is K.DIV:
        if amin < 0 or bmin <= 0:
            raise _Bail
        return np.floor_divide(a, b)
    if kind is K.MOD:
        if bmin <= 0:
            raise _Bail
        return np.mod(a, b)
    if kind is K.SHL or kind is K.SHR:
        if amin < 0 or bmin < 0 or bmax >= 63:
            raise _Bail
        if kind is K.SHR:
            return np.right_shift(a, b)
        if bmax > 62 or np.any(np.right_shift(a, np.subtract(62, b)) != 0):
            raise _Bail    # a << b would reach 2^62
        return np.left_shift(a, b)
    if kind is K.LOG2:
        if amin < 1:
            raise _Bail
        a = np.asarray(a, dtype=np.int64)
        k = np.floor(np.log2(a.astype(np.float64))).astype(np.int64)   # then made exact
        k = np.where(np.left_shift(1, k) > a, k - 1, k)
        return np.where(np.left_shift(1, k + 1) <= a, k + 1, k)
    if kind is K.MIN:
        return np.minimum(a, b)
    if kind is K.MAX:
        return np.maximum(a, b)
    if kind is K.AND:
        return np.bitwise_and(a, b)
    if kind is K.XOR:
        return np.bitwise_xor(a, b)
    if kind is K.OR:
        return np.bitwise_or(a, b)
    op = {K.LT: np.less, K.LE: np.less_equal, K.GT: np.greater, K.GE: np.greater_equal,
          K.EQ: np.equal, K.NE: np.not_equal}[kind]
    return op(a, b).astype(np.int64)


def _scalar(kind: ir.BinKind, a: int, b: int) -> int:
    """a kind b on two ints, exactly as the per-rank walk computes it (a refusal gives up)."""
    K = ir.BinKind
    try:
        if kind is K.DIV:
            return div(a, b)
        if kind is K.MOD:
            return mod(a, b)
        if kind is K.SHL:
            return shl(a, b)
        if kind is K.SHR:
            return shr(a, b)
        if kind is K.LOG2:
            return log2(a)
    except ArithmeticError:
        raise _Bail from None
    if kind is K.ADD:
        return a + b
    if kind is K.SUB:
        return a - b
    if kind is K.MUL:
        return a * b
    if kind is K.MIN:
        return min(a, b)
    if kind is K.MAX:
        return max(a, b)
    if kind is K.AND:
        return a & b
    if kind is K.XOR:
        return a ^ b
    if kind is K.OR:
        return a | b
    return int({K.LT: a < b, K.LE: a <= b, K.GT: a > b, K.GE: a >= b, K.EQ: a == b,
                K.NE: a != b}[kind])


def _sub(env: dict, idx: np.ndarray) -> dict:
    """The env of the lanes idx of a group."""
    return {k: (v if type(v) is int else v[idx]) for k, v in env.items()}


class _Values:
    """Evaluates expressions over a group's env (names -> int, or an array with an entry per
    lane); a subexpression shared by the expressions of one evaluation is computed once."""

    def __init__(self, env: dict, n: int):
        self.env, self.n, self.memo = env, n, {}

    def __call__(self, e):
        key = id(e)
        hit = self.memo.get(key)
        if hit is not None and hit[0] is e:
            return hit[1]
        v = self._eval(e)
        if type(v) is int and not -_LIMIT < v < _LIMIT:
            raise _Bail
        self.memo[key] = (e, v)
        return v

    def _eval(self, e):
        t = type(e)
        if t is ir.Const:
            return e.value
        if t is ir.Var:
            v = self.env.get(e.name)
            if v is None:
                raise _Bail
            return v
        if t is ir.Elem:    # an array is a (lanes x K) matrix; an index outside it gives up
            table = self.env.get(e.name)
            if table is None:
                raise _Bail
            i = self(e.index)
            lo, hi = _span_of(i)
            if lo < 0 or hi >= table.shape[1]:
                raise _Bail
            if type(i) is int:
                return table[:, i].copy()
            return table[np.arange(self.n), i]
        if t is ir.Sel:
            c = self(e.cond)
            if type(c) is int:
                return self(e.then if c else e.orelse)
            taken = c != 0
            if taken.all():
                return self(e.then)
            if not taken.any():
                return self(e.orelse)
            out = np.empty(self.n, dtype=np.int64)
            for mask, arm in ((taken, e.then), (~taken, e.orelse)):   # each lane its own arm
                idx = np.flatnonzero(mask)
                out[idx] = _Values(_sub(self.env, idx), len(idx))(arm)
            return out
        a = self(e.lhs)
        b = self(e.rhs)
        if type(a) is int and type(b) is int:
            return _scalar(e.kind, a, b)
        return _bin(e.kind, a, b)


def _lanes(x, n: int) -> list[int]:
    return x.tolist() if type(x) is not int else [x] * n


class _Lockstep:
    def __init__(self, b):
        self.b = b
        self.s = b.s
        W = b.world
        self.world = W
        self.live = sorted(b.live)
        self.live_mask = np.zeros(W, dtype=bool)
        self.live_mask[self.live] = True
        self.tl: list[list[Event]] = [[Event(EventKind.ENTRY, r, 0, None)] for r in range(W)]
        self.posted: list[dict[str, Event]] = [{} for _ in range(W)]
        self.count = 2 * W       # events, moves and sources so far, against b.max_events
        self.ids = 0             # move ids (Access.instance)

    def run(self) -> list[list[Event]]:
        env = dict(self.b.base)
        ranks = np.array(self.live, dtype=np.int64)
        env["rank"] = ranks
        self.top(self.s.body, env, ranks, 0)
        for r in range(self.world):
            self.tl[r].append(Event(EventKind.EXIT, r, len(self.tl[r]), None))
        return self.tl

    def grow(self) -> None:
        if self.count > self.b.max_events:
            raise _Bail   # the per-rank walk refuses it, naming the count

    # -- groups -------------------------------------------------------------------------------

    def on(self, sel: np.ndarray, env: dict, ranks: np.ndarray, barriers, walk):
        """walk(env, ranks, barriers) -> barriers on the lanes sel of the group; the vars they set
        merged back into env; the group's barriers."""
        if sel.all():
            return walk(env, ranks, barriers)
        idx = np.flatnonzero(sel)
        if not len(idx):
            return barriers
        sub = _sub(env, idx)
        got = walk(sub, ranks[idx], barriers if type(barriers) is int else barriers[idx])
        for k in env:
            if k not in sub:
                raise _Bail   # a name the lanes dropped and the others keep: not one env any more
            v, w = env[k], sub[k]
            if v is w or (type(v) is int and type(w) is int and v == w):
                continue
            full = np.array(_lanes(v, len(ranks)), dtype=np.int64) if type(v) is int else v.copy()
            full[idx] = w
            env[k] = full
        if type(barriers) is int and type(got) is int and got == barriers:
            return barriers
        full = np.full(len(ranks), barriers, dtype=np.int64) if type(barriers) is int else barriers.copy()
        full[idx] = got
        return full

    def domain(self, d: ir.Domain, ranks: np.ndarray):
        """(value, lanes that take it) of a loop over ranks or peers, in order of value."""
        for v in self.live:
            yield v, (ranks != v) if d is ir.Domain.PEERS else np.ones(len(ranks), dtype=bool)

    def trips(self, loop: ir.Loop, env: dict, ranks: np.ndarray):
        """(value, lanes) of each trip of a loop, in order of value."""
        if loop.domain is not ir.Domain.RANGE:
            yield from self.domain(loop.domain, ranks)
            return
        val = _Values(env, len(ranks))
        lo, hi = val(loop.lo), val(loop.hi)
        if type(lo) is int and type(hi) is int:
            if lo < 0 and hi > lo:
                raise _Bail
            every = np.ones(len(ranks), dtype=bool)
            for v in range(lo, hi):
                yield v, every
            return
        if np.any((np.asarray(lo) < 0) & (np.asarray(hi) > lo)):
            raise _Bail
        first, last = _span_of(lo)[0], _span_of(hi)[1]
        for v in range(first, last):
            sel = (lo <= v) & (hi > v)
            if type(sel) is not np.ndarray:
                sel = np.full(len(ranks), bool(sel))
            yield v, sel

    # -- the walk -----------------------------------------------------------------------------

    def top(self, ops, env: dict, ranks: np.ndarray, barriers):
        """Walks ops on the group's ranks; returns their barrier places so far (an int or an
        array), which only a non-lowered schedule's barriers read."""
        s, tl = self.s, self.tl
        declared: list[str] = []
        for op in ops:
            t = type(op)
            n = len(ranks)
            if t is ir.Signal or t is ir.Wait:
                self.sync(op, env, ranks)
            elif t is ir.If:
                c = _Values(env, n)(op.cond)
                start = barriers
                if type(c) is int:
                    arm = op.then if c else op.orelse
                    if arm:
                        barriers = self.top(arm, env, ranks, barriers)
                else:
                    taken = c != 0
                    for lanes, arm in ((taken, op.then), (~taken, op.orelse)):
                        if arm:
                            barriers = self.on(lanes, env, ranks, barriers,
                                               lambda e, r, bb, arm=arm: self.top(arm, e, r, bb))
                if barred(op):   # the if takes the places of its longer arm (passes._stamp_barriers)
                    barriers = self.places(op, env, ranks, start)
            elif t is ir.Barrier:
                val = _Values(env, n)
                meet = _lanes(val(op.seq) if s.lowered else np.add(barriers, 1) if type(barriers)
                              is not int else barriers + 1, n)
                members = [None] * n
                if op.team is not None:
                    base, step, size = (_lanes(val(x), n) for x in (op.team.base, op.team.step,
                                                                     op.team.size))
                    members = [tuple(b0 + i * st for i in range(sz)) for b0, st, sz in zip(base, step, size)]
                for r, m, mem in zip(ranks.tolist(), meet, members):
                    tl[r].append(Event(EventKind.BARRIER, r, len(tl[r]), op.span, barrier=m, members=mem))
                self.count += n
                barriers = barriers + 1
            elif t is ir.Local and op.size is not None:    # an array: a (lanes x K) matrix
                val = _Values(env, n)
                k, v = val(op.size), val(op.value)
                if type(k) is not int or not 0 <= k <= ir.ARRAY_CAPACITY:
                    raise _Bail   # the per-rank walk names the size (instantiate.local_value)
                table = np.empty((n, k), dtype=np.int64)
                table[:] = v if type(v) is int else np.asarray(v)[:, None]
                env[op.name] = table
                declared.append(op.name)
            elif t is ir.Set and op.index is not None:    # one element on each lane
                val = _Values(env, n)
                i, v = val(op.index), val(op.value)
                table = env[op.name]
                lo, hi = _span_of(i)
                if lo < 0 or hi >= table.shape[1]:
                    raise _Bail   # the per-rank walk names the element
                table = table.copy()      # the groups' merge compares tables by identity
                table[np.arange(n), i] = v
                env[op.name] = table
            elif t is ir.Local or t is ir.Set:
                if t is ir.Set or not op.inline:
                    env[op.name] = _Values(env, n)(op.value)
                    if t is ir.Local:
                        declared.append(op.name)
            elif t is ir.Stage:
                evs = []
                for r in ranks.tolist():
                    ev = Event(EventKind.STAGE, r, len(tl[r]), op.span, op, [], [])
                    ev.routes = []
                    tl[r].append(ev)
                    evs.append(ev)
                self.count += n
                for inner in op.body:
                    self.moves(inner, env, ranks, evs)
                if op.handle is not None:
                    for r, ev in zip(ranks.tolist(), evs):
                        self.posted[r][op.handle] = ev
            elif t is ir.Loop:
                for v, sel in self.trips(op, env, ranks):
                    self.grow()
                    env[op.var] = v
                    barriers = self.on(sel, env, ranks, barriers,
                                       lambda e, r, bb, body=op.body: self.top(body, e, r, bb))
                env.pop(op.var, None)
            elif t is ir.Await:
                for r in ranks.tolist():
                    ev = Event(EventKind.AWAIT, r, len(tl[r]), op.span)
                    tl[r].append(ev)
                    stage = self.posted[r].pop(op.handle, None)
                    if stage is not None:
                        stage.done = ev.index
                self.count += n
            else:
                raise _Bail
        for name in declared:
            del env[name]
        return barriers

    def places(self, op: ir.If, env: dict, ranks: np.ndarray, start):
        """start + the places of the if's longer arm, rank by rank (the per-rank walk's count)."""
        out = []
        for i, r in enumerate(ranks.tolist()):
            env_r = {k: (v if type(v) is int else tuple(v[i].tolist()) if v.ndim == 2 else int(v[i]))
                     for k, v in env.items()}
            try:
                out.append(max(self.b.places(op.then, env_r), self.b.places(op.orelse, env_r)))
            except StrataError:
                raise _Bail from None
        return np.add(start, np.array(out, dtype=np.int64)) if out else start

    def sync(self, op, env: dict, ranks: np.ndarray) -> None:
        n = len(ranks)
        val = _Values(env, n)
        size, rounds = self.b.flag_sizes[op.flag], self.b.flag_rounds[op.flag]
        slot = val(op.index)
        rnd = val(op.round)
        lo, hi = _span_of(slot)
        rlo, rhi = _span_of(rnd)
        if lo < 0 or hi >= size or rlo < 0 or rhi >= rounds:
            raise _Bail
        slots, rnds = _lanes(slot, n), _lanes(rnd, n)
        tl = self.tl
        self.count += n
        if type(op) is ir.Signal:
            owner = val(op.rank)
            olo, ohi = _span_of(owner)
            if olo < 0 or ohi >= self.world or not self.live_mask[owner].all():
                raise _Bail
            SIGNAL = EventKind.SIGNAL
            for r, o, sl, rd in zip(ranks.tolist(), _lanes(owner, n), slots, rnds):
                last = tl[r][-1]
                if last.kind is SIGNAL:
                    last.signals.append((o, op.flag, sl, rd, op.span))
                else:
                    tl[r].append(Event(SIGNAL, r, len(tl[r]), op.span,
                                       signals=[(o, op.flag, sl, rd, op.span)]))
                    self.count += 1
            return
        WAIT = EventKind.WAIT
        for r, sl, rd in zip(ranks.tolist(), slots, rnds):
            last = tl[r][-1]
            if last.kind is WAIT:
                last.waits.append((op.flag, sl, rd, op.span))
            else:
                tl[r].append(Event(WAIT, r, len(tl[r]), op.span, waits=[(op.flag, sl, rd, op.span)]))
                self.count += 1

    def region(self, r: ir.Region, val: _Values, ranks: np.ndarray):
        """(owners, lo, hi) of a region on each lane, as lists; any lane the per-rank walk's fast
        path would not take gives up."""
        n = len(ranks)
        owner = ranks if r.rank is None else val(r.rank)
        lo, length = val(r.lo), val(r.length)
        if r.part is not None:
            index, parts = val(r.part[0]), val(r.part[1])
            if _span_of(index)[0] < 0 or np.any(np.asarray(index) >= parts):
                raise _Bail
        if r.sub is not None:
            if r.sub[0] == "range":
                a, b_, lim = val(r.sub[1]), val(r.sub[2]), val(r.sub[3])
            else:
                a, lim = val(r.sub[1]), val(r.sub[2])
                b_ = np.add(a, 1) if type(a) is not int else a + 1
            if (_span_of(a)[0] < 0 or np.any(np.asarray(a) > b_)
                    or np.any(np.asarray(b_) > lim)):
                raise _Bail
        olo, ohi = _span_of(owner)
        if olo < 0 or ohi >= self.world or not np.all(self.live_mask[owner]):
            raise _Bail
        hi = np.add(lo, length) if type(lo) is not int or type(length) is not int else lo + length
        if (_span_of(lo)[0] < 0 or _span_of(length)[0] < 0
                or _span_of(hi)[1] > self.b.buffer_sizes[r.buffer]):
            raise _Bail
        return _lanes(owner, n), _lanes(lo, n), _lanes(hi, n)

    def moves(self, op, env: dict, ranks: np.ndarray, evs: list[Event]) -> None:
        t = type(op)
        n = len(ranks)
        if t is ir.Loop:
            for v, sel in self.trips(op, env, ranks):
                self.grow()
                idx = np.flatnonzero(sel)
                if not len(idx):
                    continue
                if len(idx) == n:
                    inner, rk, ev = dict(env), ranks, evs
                else:
                    inner, rk, ev = _sub(env, idx), ranks[idx], [evs[i] for i in idx.tolist()]
                inner[op.var] = v
                for o in op.body:
                    self.moves(o, inner, rk, ev)
            return
        if t is ir.If:
            c = _Values(env, n)(op.cond)
            if type(c) is int:
                for o in (op.then if c else op.orelse):
                    self.moves(o, env, ranks, evs)
                return
            taken = c != 0
            for mask, arm in ((taken, op.then), (~taken, op.orelse)):
                idx = np.flatnonzero(mask)
                if len(idx) and arm:
                    sub, rk, ev = _sub(env, idx), ranks[idx], [evs[i] for i in idx.tolist()]
                    for o in arm:
                        self.moves(o, sub, rk, ev)
            return
        if t is ir.Route or t not in (ir.Copy, ir.Accumulate, ir.Reduce, ir.ReduceList):
            raise _Bail
        val = _Values(env, n)
        dst = self.region(op.dst, val, ranks)
        buf = op.dst.buffer
        if t is not ir.Reduce:
            srcs = [(r.buffer, *self.region(r, val, ranks)) for r in ir.sources(op)]
            per_lane = [tuple((owners[i], name, los[i], his[i]) for name, owners, los, his in srcs)
                        for i in range(n)]
        else:
            lists = [[] for _ in range(n)]   # each lane's sources, in order of the variable
            for v, sel in self.reduce_domain(op, env, ranks):
                idx = np.flatnonzero(sel)
                if not len(idx):
                    continue
                inner = _sub(env, idx) if len(idx) < n else dict(env)
                inner[op.var] = v
                owners, los, his = self.region(op.src, _Values(inner, len(idx)), ranks[idx])
                for i, o, lo, hi in zip(idx.tolist(), owners, los, his):
                    lists[i].append((o, op.src.buffer, lo, hi))
            per_lane = [tuple(x) for x in lists]
        red = None if t is ir.Copy else op.op
        acc = t is ir.Accumulate
        accop = op.op.value if acc else None
        span = op.span
        downers, dlos, dhis = dst
        for ev, lane, d_o, d_lo, d_hi in zip(evs, per_lane, downers, dlos, dhis):
            length = d_hi - d_lo
            for src in lane:
                if src[3] - src[2] != length:
                    raise _Bail   # the per-rank walk names the shapes
            self.ids += 1
            ev.moves.append(Move((d_o, buf, d_lo, d_hi), lane, red, span, accumulate=acc))
            acs = ev.accesses
            for src in lane:
                if src[3] > src[2]:
                    acs.append(Access(src[0], src[1], src[2], src[3], False, self.ids, span))
            if d_hi > d_lo:
                acs.append(Access(d_o, buf, d_lo, d_hi, True, self.ids, span, accumulate=accop))
            self.count += 1 + len(lane)

    def reduce_domain(self, op: ir.Reduce, env: dict, ranks: np.ndarray):
        """(value, lanes) of a reduction's variable: ranks, or (count set) a team's places."""
        if op.count is None:
            yield from self.domain(op.domain, ranks)
            return
        val = _Values(env, len(ranks))
        count = val(op.count)
        skip = val(op.skip) if op.domain is ir.Domain.PEERS else -1
        for i in range(max(_span_of(count)[1], 0)):
            sel = (np.less(i, count)) & (np.not_equal(i, skip))
            if type(sel) is not np.ndarray:
                sel = np.full(len(ranks), bool(sel))
            yield i, sel
