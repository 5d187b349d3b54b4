"""The instance a call runs, checked before it launches: every region it touches against the
caller's tensors, and its proof.

In: a schedule (the IR after the passes: what the kernel is generated from), the world size and
the call's parameters (the sizes read off its tensors, its rank parameters). Out: the verdict, or a
StrataUsageError naming what breaks: a region outside its tensor (the parameter, the relation the
proof assumed, the line, the rank and loop variables), a rank or flag slot that does not exist,
or the verifier's diagnostics on this instance.

The regions are evaluated for a block of ranks and every value of a loop variable at once (numpy:
the rank and each loop variable an axis), so the check costs little even at world 384, and a
call's first check at a small world is a few array operations per statement. The proof is
stratac.verify on this very instance (MoE: under each sample routing that fits its capacity),
cached by stratac.targets.verdicts. It is the
call's own instance at its own sizes, whatever they are: the verifier's memory holds pieces of
buffers, not elements (stratac.verify.segments), so a 256 MiB call is proven as cheaply as a small
one. An instance whose proof would walk more events than the verifier
holds (ir.instantiate.MAX_EVENTS) is refused, naming the count, before anything is written.
"""

from __future__ import annotations

import math

import numpy as np

from stratac import ir, verify
from stratac.ir import passes
from stratac.host.errors import StrataUsageError
from stratac.targets import verdicts
from stratac.verify import routing as routing_mod
from stratac.verify.samples import live_text

_ARITH = {ir.BinKind.ADD: np.add, ir.BinKind.SUB: np.subtract, ir.BinKind.MUL: np.multiply}
# shifts, bitwise operators and log2 (the verifier has checked their operands on the instance it
# proves; here they are evaluated, and what they make of a size is observed as it is)
_BITS = {ir.BinKind.SHL: np.left_shift, ir.BinKind.SHR: np.right_shift,
         ir.BinKind.AND: np.bitwise_and, ir.BinKind.XOR: np.bitwise_xor, ir.BinKind.OR: np.bitwise_or}


def _log2(a):
    """floor(log2(a)) of every element (of max(a, 1)), exact for all of int64."""
    a = np.maximum(np.asarray(a, dtype=np.int64), 1)
    k = np.clip(np.floor(np.log2(a.astype(np.float64))).astype(np.int64), 0, 62)
    k = np.where(np.left_shift(1, k) > a, k - 1, k)      # the float rounded up past a power of 2
    return np.where((k < 62) & (np.left_shift(1, np.minimum(k + 1, 62)) <= a), k + 1, k)


_COMPARE = {ir.BinKind.LT: np.less, ir.BinKind.LE: np.less_equal, ir.BinKind.GT: np.greater,
            ir.BinKind.GE: np.greater_equal, ir.BinKind.EQ: np.equal, ir.BinKind.NE: np.not_equal}


def _deeper(v):
    """A value of env one axis deeper (an array's elements each)."""
    if isinstance(v, tuple):
        return tuple(_deeper(x) for x in v)
    return v[..., None] if isinstance(v, np.ndarray) else v


def _sets_outer(loop: ir.Loop) -> bool:
    """Whether the loop's body sets a var it does not declare (a var of the loop's state)."""
    declared: set[str] = set()

    def walk(ops) -> bool:
        for op in ops:
            if isinstance(op, ir.Local):
                declared.add(op.name)
            elif (isinstance(op, ir.Set) and op.name not in declared) \
                    or (isinstance(op, ir.If) and (walk(op.then) or walk(op.orelse))) \
                    or (isinstance(op, ir.Loop) and walk(op.body)):
                return True
        return False
    return walk(loop.body)


class _Fault(Exception):
    """The instance touches something that does not exist (the message says what and where)."""


# The ranks one pass of _Walk takes at once: its arrays hold a block of ranks times the values of
# the loops around a statement, so at large worlds it takes fewer (one from world 4,096 on).
RANK_BLOCK_ELEMENTS = 4096


class _Walk:
    """One pass over the schedule for each block of ranks of an instance, the rank and the loop
    variables as numpy axes: checks that every region, rank and flag slot exists."""

    def __init__(self, s: ir.Schedule, world: int, params: dict[str, int]):
        self.s, self.world = s, world
        self.base = {"world": world, **params}
        self.extent = {p.name: int(p.size.eval(self.base)) for p in s.params}
        self.flag_size = {f.name: int(f.size.eval(self.base)) for f in s.flags}
        self.flag_rounds = {f.name: int(f.rounds.eval(self.base)) for f in s.flags}
        self._loops: list[str] = []
        block = max(1, min(world, RANK_BLOCK_ELEMENTS // world))
        for r in range(0, world, block):
            ranks = np.arange(r, min(world, r + block), dtype=np.int64)
            try:
                self._walk(ranks)
            except _Fault:
                # the fault a rank-by-rank walk meets first (the lowest rank's first, in program
                # order), whatever the block: a block finds the first statement any rank faults at
                for q in ranks[:-1]:
                    self._walk(ranks[q - r:q - r + 1])
                raise

    def _walk(self, ranks: np.ndarray) -> None:
        self._loops = []
        self._top(self.s.body, {**self.base, "rank": ranks}, np.ones(len(ranks), dtype=bool))

    # ---- expressions
    def _val(self, e: ir.IExpr, env: dict, mask: np.ndarray, span):
        if isinstance(e, ir.Const):
            return e.value
        if isinstance(e, ir.Var):
            return env[e.name]
        if isinstance(e, ir.Elem):
            values = env[e.name]
            i = self._index("reads", e.name, len(values), e.index, env, mask, span)
            # where mask holds the index is in range (checked); elsewhere (an arm not taken, a
            # trip outside its range) any element will do, and an empty array reads as 0
            if not values:
                return np.zeros(np.shape(i), dtype=np.int64)
            if not np.ndim(i) and not any(np.ndim(x) for x in values):
                return values[min(max(int(i), 0), len(values) - 1)]
            *each, i = np.broadcast_arrays(*values, i)    # every place its own element
            at = np.clip(i, 0, len(values) - 1)[..., None]
            return np.take_along_axis(np.stack(each, axis=-1), at, axis=-1)[..., 0]
        if isinstance(e, ir.Sel):   # each branch evaluated (and checked) only where it is taken
            c = np.asarray(self._val(e.cond, env, mask, span)) != 0
            return np.where(c, self._val(e.then, env, mask & c, span),
                            self._val(e.orelse, env, mask & ~c, span))
        a, b = self._val(e.lhs, env, mask, span), self._val(e.rhs, env, mask, span)
        k = e.kind
        if k in (ir.BinKind.DIV, ir.BinKind.MOD):
            zero = mask & (np.asarray(b) == 0)
            if zero.any():
                self._fault(span, zero, env, f"divides by zero evaluating {ir.bare(e)}")
            b = np.where(np.asarray(b) == 0, 1, b)
            return np.floor_divide(a, b) if k is ir.BinKind.DIV else np.mod(a, b)
        if k in (ir.BinKind.MIN, ir.BinKind.MAX):
            return np.minimum(a, b) if k is ir.BinKind.MIN else np.maximum(a, b)
        if k in _COMPARE:
            return _COMPARE[k](a, b).astype(np.int64)
        if k in _BITS or k is ir.BinKind.LOG2:
            if k is ir.BinKind.LOG2:
                v = _log2(a)
            elif k in (ir.BinKind.SHL, ir.BinKind.SHR):
                v = _BITS[k](np.asarray(a, dtype=np.int64), np.clip(np.asarray(b, dtype=np.int64), 0, 62))
            else:
                v = _BITS[k](np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
            return v
        return _ARITH[k](a, b)

    def _index(self, verb: str, name: str, k: int, index: ir.IExpr, env: dict, mask: np.ndarray, span):
        """An index of array `name` (k elements) wherever mask holds, checked to lie in it."""
        i = self._val(index, env, mask, span)
        bad = mask & ((np.asarray(i) < 0) | (np.asarray(i) >= k))
        if bad.any():
            self._fault(span, bad, env, f"{verb} {name}[{int(np.broadcast_to(i, bad.shape)[bad][0])}], "
                        f"outside {name}'s {k} elements")
        return i

    def _fault(self, span, bad: np.ndarray, env: dict, what) -> None:
        """Raises for the first place where `bad` holds (the lowest rank's); `what`: the message,
        or a function making it (texts of expressions are made only for a fault)."""
        at = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        value = lambda v: int(np.broadcast_to(env[v], bad.shape)[at])
        where = [f"rank {value('rank')}"] + [f"{v} = {value(v)}" for v in self._loops]
        raise _Fault(f"on {', '.join(where)}, line {span.line} {what() if callable(what) else what}")

    # ---- the schedule
    def _loop(self, var: str, domain: ir.Domain, env: dict, mask: np.ndarray,
              loop: ir.Loop | None = None) -> tuple[dict, np.ndarray]:
        """env and mask one axis deeper, with var taking every rank on it (peers: but this one),
        or, for a step loop, every value of its range (the mask keeps each place's own range)."""
        inner = {k: _deeper(v) for k, v in env.items()}
        if domain is ir.Domain.RANGE:
            lo, hi, top = self._range(loop, env, mask)
            inner[var] = np.arange(max(top, 0)).reshape((1,) * mask.ndim + (max(top, 0),))
            deeper = mask[..., None] & (inner[var] >= lo[..., None]) & (inner[var] < hi[..., None])
            return inner, deeper
        inner[var] = np.arange(self.world).reshape((1,) * mask.ndim + (self.world,))
        deeper = mask[..., None] & np.ones(inner[var].shape, dtype=bool)
        if domain is ir.Domain.PEERS:
            deeper = deeper & (inner[var] != inner["rank"])
        return inner, deeper

    def _range(self, loop: ir.Loop, env: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """A step loop's bounds at every place of mask, checked (a first value below 0 is a fault),
        and the largest end among them."""
        lo = np.broadcast_to(self._val(loop.lo, env, mask, loop.span), mask.shape)
        hi = np.broadcast_to(self._val(loop.hi, env, mask, loop.span), mask.shape)
        if (mask & (lo < 0) & (hi > lo)).any():
            self._fault(loop.span, mask & (lo < 0) & (hi > lo), env,
                        f"starts loop variable {loop.var} below 0")
        return lo, hi, int(hi[mask].max()) if mask.any() else 0

    def _top(self, ops, env: dict, mask: np.ndarray) -> None:
        for op in ops:
            if not mask.any():
                return
            if isinstance(op, ir.Barrier):
                self._val(op.seq, env, mask, op.span)
            elif isinstance(op, ir.Stage):
                for inner in op.body:
                    self._move(inner, env, mask)
            elif isinstance(op, ir.If):
                cond = np.asarray(self._val(op.cond, env, mask, op.span)) != 0
                self._top(op.then, env, mask & cond)
                self._top(op.orelse, env, mask & ~cond)
            elif isinstance(op, ir.Loop) and _sets_outer(op):
                self._sequential(op, env, mask)
            elif isinstance(op, ir.Loop):
                inner, deeper = self._loop(op.var, op.domain, env, mask, op)
                self._loops.append(op.var)
                self._top(op.body, inner, deeper)
                self._loops.pop()
            elif isinstance(op, ir.Local) and op.size is not None:    # an array
                k = int(np.max(self._val(op.size, env, mask, op.span)))   # every rank's the same
                if not 0 <= k <= ir.ARRAY_CAPACITY:
                    self._fault(op.span, mask, env, f"declares array {op.name} of {k} integers: an "
                                f"array holds 0 to {ir.ARRAY_CAPACITY}")
                env[op.name] = (self._val(op.value, env, mask, op.span),) * k
            elif isinstance(op, ir.Local):
                if not op.inline:   # a let's name is for the generated code alone
                    env[op.name] = self._val(op.value, env, mask, op.span)
            elif isinstance(op, ir.Set) and op.index is not None:   # one element, where mask holds
                old = env[op.name]
                i = self._index("sets", op.name, len(old), op.index, env, mask, op.span)
                value = self._val(op.value, env, mask, op.span)
                env[op.name] = tuple(np.where(mask & (np.asarray(i) == j), value, x)
                                     for j, x in enumerate(old))
            elif isinstance(op, ir.Set):   # where mask holds; elsewhere it keeps its value
                env[op.name] = np.where(mask, self._val(op.value, env, mask, op.span), env[op.name])
            elif isinstance(op, ir.Await):
                continue   # nothing to evaluate
            else:
                self._sync(op, env, mask)

    def _sequential(self, loop: ir.Loop, env: dict, mask: np.ndarray) -> None:
        """A step loop whose body sets a var declared before it (loop state): one iteration after
        the other, the variable a plain integer, each iteration under the mask of the places whose
        range holds it."""
        if loop.domain is ir.Domain.RANGE:
            lo, hi, top = self._range(loop, env, mask)
        else:   # over the ranks (peers: but the running one)
            lo, hi, top = 0, self.world, self.world
        self._loops.append(loop.var)
        for v in range(top):
            env[loop.var] = v
            on = mask & (lo <= v) & (v < hi)
            if loop.domain is ir.Domain.PEERS:
                on = on & (v != env["rank"])
            self._top(loop.body, env, on)
        env.pop(loop.var, None)
        self._loops.pop()

    def _sync(self, op, env: dict, mask: np.ndarray) -> None:
        if isinstance(op, ir.Signal):
            self._rank(op.rank, env, mask, op.span,
                       lambda: f"signals {op.flag}[{ir.bare(op.index)}]@{ir.bare(op.rank)}")
        slot = self._val(op.index, env, mask, op.span)
        n = self.flag_size[op.flag]
        bad = mask & ((np.asarray(slot) < 0) | (np.asarray(slot) >= n))
        if bad.any():
            verb = "signals" if isinstance(op, ir.Signal) else "waits for"
            self._fault(op.span, bad, env, f"{verb} slot {int(np.broadcast_to(slot, bad.shape)[bad][0])} "
                        f"of flag {op.flag}, which has {n} slots")
        rnd = self._val(op.round, env, mask, op.span)
        n = self.flag_rounds[op.flag]
        bad = mask & ((np.asarray(rnd) < 0) | (np.asarray(rnd) >= n))
        if bad.any():
            verb = "signals" if isinstance(op, ir.Signal) else "waits for"
            self._fault(op.span, bad, env, f"{verb} round {int(np.broadcast_to(rnd, bad.shape)[bad][0])} "
                        f"of flag {op.flag}, which has {n} rounds")

    def _rank(self, e: ir.IExpr, env: dict, mask: np.ndarray, span, what):
        """what: the statement, or a function making its text."""
        r = self._val(e, env, mask, span)
        bad = mask & ((np.asarray(r) < 0) | (np.asarray(r) >= self.world))
        if bad.any():
            said = what() if callable(what) else what
            self._fault(span, bad, env, f"{said}: rank {int(np.broadcast_to(r, bad.shape)[bad][0])} "
                        f"does not exist in a world of {self.world}")
        return r

    def _region(self, r: ir.Region, env: dict, mask: np.ndarray, verb: str) -> np.ndarray:
        """Checks that r lies inside its buffer wherever mask holds; returns its start."""
        end = lambda: ir.simplify(ir.add(r.lo, r.length))
        text = lambda: (f"{r.buffer}[{ir.bare(r.lo)}:{ir.bare(end())}]"
                        + (f"@{ir.bare(r.rank)}" if r.rank is not None else ""))
        if r.rank is not None:
            self._rank(r.rank, env, mask, r.span, lambda: f"{verb} {text()}")
        lo = np.broadcast_to(self._val(r.lo, env, mask, r.span), mask.shape)
        n = np.broadcast_to(self._val(r.length, env, mask, r.span), mask.shape)
        size = self.extent[r.buffer]
        p = self.s.param(r.buffer)
        for bad, relation, exprs in (
                (mask & (lo < 0), lambda: f"{ir.bare(r.lo)} >= 0", lambda: (r.lo,)),
                (mask & (n < 0), lambda: f"{ir.bare(r.length)} >= 0", lambda: (r.length,)),
                (mask & (lo + n > size), lambda: f"{ir.bare(end())} <= {ir.bare(p.size)}",
                 lambda: (end(), p.size))):
            if bad.any():
                relation, exprs = relation(), exprs()
                i = tuple(int(j) for j in np.argwhere(bad)[0]) if bad.ndim else ()
                names = sorted(set().union(*(e.names() for e in exprs)) & self.base.keys())
                values = ", ".join(f"{k} = {self.base[k]}" for k in names)
                what = "scratch buffer" if p.scratch else "parameter"
                self._fault(r.span, bad, env,
                            f"{verb} {text()} = {r.buffer}[{int(lo[i])}:{int(lo[i] + n[i])}], but {what} "
                            f"{r.buffer} has {size} elements: the schedule was proven for calls where "
                            f"{relation}" + (f", and this call has {values}" if values else ""))
        return lo

    def _move(self, op, env: dict, mask: np.ndarray) -> None:
        if not mask.any():
            return
        if isinstance(op, ir.Loop):
            inner, deeper = self._loop(op.var, op.domain, env, mask, op)
            self._loops.append(op.var)
            for o in op.body:
                self._move(o, inner, deeper)
            self._loops.pop()
        elif isinstance(op, ir.If):
            cond = np.asarray(self._val(op.cond, env, mask, op.span)) != 0
            for o in op.then:
                self._move(o, env, mask & cond)
            for o in op.orelse:
                self._move(o, env, mask & ~cond)
        elif isinstance(op, ir.Route):
            self._region(op.dst, env, mask, "writes")
            if op.capacity is not None:   # evaluated for its faults
                self._val(op.capacity, env, mask, op.span)
        elif isinstance(op, ir.Reduce):
            self._region(op.dst, env, mask, "writes")
            if op.count is None:
                inner, deeper = self._loop(op.var, op.domain, env, mask)
            else:   # a team's places 0 .. count (peers: but the running rank's, skip)
                places = ir.Loop(op.var, ir.Domain.RANGE, (), op.span, ir.Const(0), op.count)
                inner, deeper = self._loop(op.var, ir.Domain.RANGE, env, mask, places)
                if op.domain is ir.Domain.PEERS:
                    skip = np.asarray(self._val(op.skip, env, mask, op.span))
                    deeper = deeper & (inner[op.var] != (skip[..., None] if skip.ndim else skip))
            self._loops.append(op.var)
            self._region(op.src, inner, deeper, "reads")
            self._loops.pop()
        else:   # Copy, Accumulate, ReduceList
            self._region(op.dst, env, mask, "writes")
            for src in ir.sources(op):
                self._region(src, env, mask, "reads")


def _routings(s: ir.Schedule, world: int, params: dict[str, int]) -> list[str]:
    """The sample routings a MoE instance is proven under: those whose entries for one expert from
    one rank fit its capacity (the call refuses any routing that does not), and for a slotted
    layout routing.FULL, which fills the call's capacity exactly (a call whose routing needs every
    slot is proven with every slot in use); only the first that fits when the instance routes more
    than ROUTED_ENTRIES entries over all ranks (the proof's cost follows them)."""
    if not s.contract.kind.moe:
        return []
    names = list(dict.fromkeys(r for _, r in verify.MOE_SAMPLES))
    cap = s.contract.capacity
    if cap:
        names = [n for n in names + [routing_mod.FULL] if _need(s, world, params, n) <= params[cap]]
    return names[:1] if _entries(s, world, params) > ROUTED_ENTRIES else names


# a MoE instance routing more entries (world x tokens x topk) is proven under one sample routing
ROUTED_ENTRIES = 1 << 16


def _entries(s: ir.Schedule, world: int, params: dict[str, int]) -> int:
    env = {"world": world, **params}
    dims = [int(d.eval(env)) for d in s.param(s.contract.inputs[1]).dims]
    return world * math.prod(dims)


def least_capacity(s: ir.Schedule, world: int, params: dict[str, int]) -> int | None:
    """The least capacity at which some sample routing fits, with the instance's other sizes (what
    a refusal for want of a provable routing names); None when none does up to the token count."""
    cap = s.contract.capacity
    env = {"world": world, **params}
    tokens = int(s.param(s.contract.inputs[1]).dims[0].eval(env))
    for c in range(0, tokens + 1):
        if _routings(s, world, {**params, cap: c}):
            return c
    return None


def _need(s: ir.Schedule, world: int, params: dict[str, int], routing: str) -> int:
    """The most entries one rank's sample routing sends one expert."""
    c, env = s.contract, {"world": world, **params}
    tokens, topk = (tuple(int(d.eval(env)) for d in s.param(c.inputs[1]).dims) + (1,))[:2]
    experts = int(s.param(c.outputs[1] if c.kind.dispatch else c.inputs[3]).dims[-1].eval(env))
    need = 0
    for r in range(world):
        ids = routing_mod.expert_ids(routing, r, tokens, topk, experts,
                                     capacity=params.get(c.capacity) if c.capacity else None)
        if (ids >= 0).any():
            need = max(need, int(np.bincount(ids[ids >= 0]).max()))
    return need


def _text(params: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


def check(s: ir.Schedule, world: int, params: dict[str, int],
          active: tuple[bool, ...] | None = None) -> verdicts.Verdict:
    """Refuses an instance that touches a region, rank or flag slot that does not exist, then
    returns its verdict (proving it on a cache miss); raises StrataUsageError when the instance is
    not proven. Nothing is launched or written either way. `active`: the call's mask of active
    ranks (None: every rank); a masked instance is its own instance, proven with that mask."""
    try:
        _Walk(s, world, params)
    except _Fault as exc:
        raise StrataUsageError(f"{s.name}: {exc}; nothing was written") from None

    def prove() -> dict:
        routings = _routings(s, world, params)
        instance = f"world={world}" + (f", {_text(params)}" if params else "") + (
            "" if active is None else f", active ranks {live_text(active)}")
        if s.contract.kind.moe and not routings:
            least = least_capacity(s, world, params)
            raise StrataUsageError(f"{s.name}: this call's instance ({instance}) cannot be proven: "
                                   "none of the verifier's sample routings fits its capacity "
                                   f"({params[s.contract.capacity]})"
                                   + (f"; the least capacity the verifier can prove at these sizes is "
                                      f"{least}" if least is not None else "") + "; nothing was written")
        for routing in routings or [None]:
            res = verify.verify(s, world, params, routing, active=active)
            if not res.ok:
                raise StrataUsageError(
                    f"{s.name}: this call's instance ({instance}) is not proven, so it was refused "
                    "before anything was written:\n" + "\n".join(d.render() for d in res.diagnostics))
        return {"sizes": params, "routings": routings}

    # the mask is part of the verdict's key (a name no size or rank parameter can have)
    key = params if active is None else {**params, "active ranks": sum(1 << r for r, v in
                                                                       enumerate(active) if v)}
    return verdicts.verdict(s, world, key, prove)

