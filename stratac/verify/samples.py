"""What the verifier checks: the instances of a schedule at one world size, and their inputs.

In: a schedule and a world size. Out: the samples to check, derived from the schedule itself: a
base set of sizes (every size symbol independent, both parities), the values on both sides of
every condition the program tests, the sizes at which a step loop's trip count reaches 1, 2
and 3, every rank parameter value up to world 16 (the boundaries of
its conditions above), for MoE and AllToAllV token counts, capacities and expert counts chosen the
same way, each with a sample routing from `routing`; each kept while the provenance simulation
stays within budget. For an instantiated MoE sample, the routed inputs (every rank's expert ids,
and a combine's counts). Also how a diagnostic names the instance it is about (`context`).
The rules are stated for users in dsl/README.md, "What `check` proves"; keep the two in step.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

from stratac import ir
from stratac.diagnostics import Codes, StrataError, error
from stratac.ir.instantiate import Instance
from stratac.ir import passes
from stratac.ir.passes import SOCS, window_row_faults
from stratac.verify import routing as routing_mod

# The largest world `check` and `compile` take: the Atlas 960 SuperPoD's 15,488 NPUs, rounded up.
# The verifier's time and memory grow with the square of the world or more (world 384 here: the
# ring AllReduce 37 s and 0.9 GB), so an instance too large for its memory is refused before it
# is built (stratac.ir.instantiate: MAX_EVENTS, CLOCK_BYTES, estimated from three ranks), and a
# world above this is refused at once.
MAX_WORLD = 16_384

# a default sample with more buffer elements over all ranks than this is dropped (the smaller
# ones are kept). The simulation's memory no longer grows with the elements (segments), but a MoE
# sample's routed rows and a sweep of sizes still do, and a sample this large adds no boundary the
# smaller ones miss: the samples are taken where the conditions change, not by size.
SIM_ELEMENT_BUDGET = 4_000_000

# up to this world size every value of a rank parameter is checked; above it (an instance costs
# seconds at world 384) the first, middle and last rank and the boundaries of the conditions on
# it. Above it the base sizes also leave out 2 world + 5.
ALL_RANKS_UP_TO = 16

# Place splits the routed rows and gather the tokens evenly over the launched vector cores
# (runtime/device/strata_device.h): from this many tokens on, every core of any SoC gets work.
CORE_TOKENS = max(SOCS.values())

MOE_TOPK = 2
MOE_HIDDEN = 3
# (tokens, routing) of the base MoE samples, in order (the first is kept even over budget)
MOE_SAMPLES = ((1, "uniform"), (5, "uniform"), (5, "single"), (5, "empty"), (5, "sparse"),
               (CORE_TOKENS, "uniform"))
# (tokens, routing) under which a packed window's bound (its own size symbol) is checked at exactly
# what the routing needs and one row less
MOE_BOUND_SAMPLES = ((5, "skewed"), (5, "uniform"))
# tokens of the sample under routing.FULL (slotted layouts only), with the least capacity that
# holds all its entries
MOE_FULL_TOKENS = 5

# a condition that is not linear in the symbol is scanned from 0 up to 2 (M + 1)^2 (M: the largest
# magnitude of its parts that do not involve the symbol), at most this far
SCAN_LIMIT = 1 << 16
# points at which a condition's difference (lhs - rhs) must agree with a line to count as linear
_PROBES = (0, 1, 2, 3, 5, 8, 13, 100, 4097, 1_000_003)


class Sample(dict):
    """Sizes (and rank parameters) of one instance to check; a MoE sample also names a routing."""

    routing: str | None = None


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
    # a packed window's row count, when it is a size of its own: the bound on the rows a rank
    # receives (the kernel reports a routing over it and places nothing)
    # (per_expert(R): R, the bound on the rows an expert receives)
    win = s.param(c.outputs[0] if dispatch else c.inputs[0])
    if c.region:
        roles["bound"] = c.region
    elif not c.capacity and win.dims and isinstance(win.dims[0], ir.Var) and win.dims[0].name not in roles.values():
        roles["bound"] = win.dims[0].name
    return roles


def default_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """The instances to check at a world size, in order: the base sizes, then the sizes on both
    sides of the program's conditions, each with every rank-parameter sample (`rank_samples`);
    each kept only while the simulation stays within budget, and never none at all."""
    if s.contract.kind.moe:
        return _moe_samples(s, world)
    out = []
    # all of them once per value of what is the same on every rank and not a size: the element
    # size sizeof(T) and the divisor parameters (the conditions' boundaries taken at each); each
    # such group keeps its first sample even over the budget
    for fixed in (({**e, **d}) for e in element_sizes(s) for d in _divisor_samples(s, world)):
        base = base_sizes(s, world, fixed)
        mid = _middle(base)
        sizes = list(base)
        for sym, v in size_boundaries(s, world, mid):
            sizes.append({**mid, sym: v})
        out += _keep(s, world, [{**sz, **rs} for sz in _unique(sizes) for rs in rank_samples(s, world, fixed)])
    return out


def element_sizes(s: ir.Schedule) -> list[dict[str, int]]:
    """What a sample says of the element size: nothing, or (s names sizeof(T)) each value of
    ir.elem_sizes in turn."""
    return [{ir.ELEM: e} for e in ir.elem_sizes(s)] or [{}]


def base_sizes(s: ir.Schedule, world: int, elem: dict[str, int] | None = None) -> list[dict[str, int]]:
    """The base samples: the pool of `size_pool` handed round the size symbols in turn, so that in
    each sample the symbols differ (when there are no more symbols than values) and each symbol
    takes every value of the pool, above and below each other symbol; each with `elem` (the
    element size of `element_sizes` and the divisor parameters' values, if any)."""
    pool = size_pool(world, len(s.sizes))
    return [{**(elem or {}), **{sym: pool[(j + i) % len(pool)] for i, sym in enumerate(s.sizes)}}
            for j in range(len(pool) if s.sizes else 1)]


def _middle(base: list[dict[str, int]]) -> dict[str, int]:
    """The base sample whose values the other symbols keep while one symbol is moved across a
    condition: the second (world + 3 for a single symbol), clear of the one-element corner."""
    return base[1] if len(base) > 1 else base[0]


def size_pool(world: int, symbols: int = 1) -> list[int]:
    """1 (fewer elements than ranks), world + 3 and world + 4 (just above the world, uneven
    splits, one odd and one even), and 2 world + 5 up to world ALL_RANKS_UP_TO; for more symbols
    than that, 3 world + 7, 4 world + 9, ..."""
    pool = [1, world + 3, world + 4] + ([2 * world + 5] if world <= ALL_RANKS_UP_TO else [])
    t = 3
    while len(pool) < symbols:
        pool.append(t * world + 2 * t + 1)
        t += 1
    return pool


def rank_samples(s: ir.Schedule, world: int, elem: dict[str, int] | None = None) -> list[dict[str, int]]:
    """Values of the rank parameters (elem: the element size and divisor parameters of the
    samples they go with): every rank up to world ALL_RANKS_UP_TO; above it 0, world / 2,
    world - 1 and the boundaries of every condition on a rank parameter that does not mention
    `rank` or a loop variable (a condition that does, `rank == root`, takes both arms within every
    instance). With several rank parameters, sample i gives the j-th parameter the (i + j)-th value,
    and one more sample per value gives it to all of them."""
    params = [x.name for x in s.rank_params]
    if not params:
        return [{}]
    if world <= ALL_RANKS_UP_TO:
        values = list(range(world))
    else:
        found = {0, world // 2, world - 1}
        free = set(params) | set(s.sizes) | {"world"} | set(elem or {})
        mid = _middle(base_sizes(s, world, elem))
        for cond in conditions(s):
            if cond.names() <= free:
                for p in params:
                    if p in cond.names():
                        found |= boundaries(cond, p, world, mid, lo=0, hi=world - 1)
        values = sorted(found)
    out = [{p: values[(i + j) % len(values)] for j, p in enumerate(params)}
           for i in range(len(values))]
    if len(params) > 1:
        out += [{p: v for p in params} for v in values]
    return _unique(out)


def divisors_to_check(world: int) -> list[int]:
    """The values a divisor parameter is checked at: every divisor of the world up to world
    ALL_RANKS_UP_TO; above it 1, the world, its least prime factor p and world / p, and the
    node sizes 2, 4, 8 and 16 where they divide it."""
    every = [d for d in range(1, world + 1) if world % d == 0] if world <= ALL_RANKS_UP_TO else None
    if every is not None:
        return every
    p = next(d for d in range(2, world + 1) if world % d == 0)
    return sorted({1, world, p, world // p} | {d for d in (2, 4, 8, 16) if world % d == 0})


# several divisor parameters take every combination of their values up to this many
DIVISOR_COMBINATIONS = 64


def _divisor_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Values of the divisor parameters (`divisors_to_check`): every combination, or past
    DIVISOR_COMBINATIONS of them, the values handed round the parameters in turn as rank
    parameters' are, and one sample per value giving it to all of them."""
    params = [x.name for x in s.int_params if x.kind is ir.ScalarKind.DIVISOR]
    if not params:
        return [{}]
    values = divisors_to_check(world)
    if len(values) ** len(params) <= DIVISOR_COMBINATIONS:
        return [dict(zip(params, combo)) for combo in itertools.product(values, repeat=len(params))]
    out = [{p: values[(i + j) % len(values)] for j, p in enumerate(params)} for i in range(len(values))]
    out += [{p: v for p in params} for v in values]
    return _unique(out)


def size_boundaries(s: ir.Schedule, world: int, mid: dict[str, int]) -> list[tuple[str, int]]:
    """(size symbol, value) pairs to check besides the base sizes, in program order: both sides of
    every condition on a size (`boundaries`), then the sizes at which a step loop's trip count
    changes (`trip_changes`)."""
    out = []
    for cond in conditions(s):
        for sym in [x for x in s.sizes if x in cond.names()]:
            out += [(sym, v) for v in sorted(boundaries(cond, sym, world, mid, lo=0))]
    for loop in size_loops(s):
        for sym in [x for x in s.sizes if x in loop.lo.names() | loop.hi.names()]:
            out += [(sym, v) for v in sorted(trip_changes(loop, sym, world, mid))]
    return out


# the trip counts a step loop whose bounds depend on a size is checked at: one chunk, two (the
# first whose offsets are not 0) and three (a chunk between two others)
TRIPS = (1, 2, 3)


def size_loops(s: ir.Schedule) -> list[ir.Loop]:
    """Every step loop (`for c in lo .. hi`) whose bounds mention a size symbol, in program order."""
    out: list[ir.Loop] = []
    sizes = set(s.sizes)

    def walk(nodes) -> None:
        for op in nodes:
            if isinstance(op, ir.If):
                walk(op.then)
                walk(op.orelse)
            elif isinstance(op, (ir.Stage, ir.Loop)):
                if isinstance(op, ir.Loop) and op.domain is ir.Domain.RANGE \
                        and (op.lo.names() | op.hi.names()) & sizes:
                    out.append(op)
                walk(op.body)

    walk(s.body)
    return out


def trip_changes(loop: ir.Loop, name: str, world: int, fixed: dict[str, int]) -> set[int]:
    """Values of the size `name` around every place where the loop's trip count (hi - lo) reaches
    1, 2 or 3 as `name` grows: for a change between v - 1 and v, the last value below (v - 1), the
    first at the count (v) and the next (v + 1), those >= 0. `for c in 0 .. 1 + n / 4096` adds
    4095, 4096, 4097 (two chunks) and 8191, 8192, 8193 (three). Each count is the condition
    `hi - lo >= k`, solved or scanned as `boundaries` does, with the same values for the other
    names."""
    trips = _elements_as_names(ir.Bin(ir.BinKind.SUB, loop.hi, loop.lo))
    others = sorted(trips.names() - {name, "world"} - fixed.keys())
    ranks = sorted({r for r in (0, 1, world // 2, world - 1) if 0 <= r < world})
    out: set[int] = set()
    for k in TRIPS:
        cond = ir.Bin(ir.BinKind.GE, trips, ir.Const(k))
        for combo in itertools.islice(itertools.product(ranks, repeat=len(others)), 64):
            env = {"world": world, **fixed, **dict(zip(others, combo))}
            env.pop(name, None)
            for v in _changes(cond, name, env):
                out.update(x for x in (v - 1, v, v + 1) if x >= 0)
    return out


def conditions(s: ir.Schedule) -> list[ir.IExpr]:
    """Every condition of an `if` in the program, once, in program order, then those of the
    conditional expressions `(a if c else b)` anywhere in it."""
    out: list[ir.IExpr] = []

    def walk(nodes) -> None:
        for op in nodes:
            if isinstance(op, ir.If):
                out.append(op.cond)
                walk(op.then)
                walk(op.orelse)
            elif isinstance(op, (ir.Stage, ir.Loop)):
                walk(op.body)

    walk(s.body)
    out += [c for e in passes.expressions(s) for c in passes.conditional_conds(e)]
    return list(dict.fromkeys(out))


def boundaries(cond: ir.IExpr, name: str, world: int, fixed: dict[str, int], lo: int = 0,
               hi: int | None = None) -> set[int]:
    """Values of `name` on both sides of every place where `cond` changes its truth as `name`
    grows: for a change between v - 1 and v, the values v - 2, v - 1, v and v + 1 (those in
    [lo, hi]). The other names of the condition: world, those in `fixed`, and any other (rank, a
    loop variable, a rank parameter) each of 0, 1, world / 2 and world - 1. A condition linear in
    `name` is solved (all its changes); any other is scanned (`_changes`: its first two)."""
    cond = _elements_as_names(cond)
    others = sorted(cond.names() - {name, "world"} - fixed.keys())
    ranks = sorted({r for r in (0, 1, world // 2, world - 1) if 0 <= r < world})
    out: set[int] = set()
    for combo in itertools.islice(itertools.product(ranks, repeat=len(others)), 64):
        env = {"world": world, **fixed, **dict(zip(others, combo))}
        env.pop(name, None)
        for v in _changes(cond, name, env):
            out.update(x for x in (v - 2, v - 1, v, v + 1) if x >= lo and (hi is None or x <= hi))
    return out


def _elements_as_names(e: ir.IExpr) -> ir.IExpr:
    """e with each array element it reads (`t[i]`) a name of its own (`t[i]` as text), which the
    samples give the values they give a rank or a var: an element is the running rank's, like
    them."""
    if isinstance(e, ir.Elem):
        return ir.Var(str(e))
    if isinstance(e, ir.Bin):
        return ir.Bin(e.kind, _elements_as_names(e.lhs), _elements_as_names(e.rhs))
    if isinstance(e, ir.Sel):
        return ir.Sel(*(_elements_as_names(x) for x in (e.cond, e.then, e.orelse)))
    return e


def _changes(cond: ir.IExpr, name: str, env: dict[str, int]) -> list[int]:
    """The values v where cond's truth at v differs from its truth at v - 1."""
    if not isinstance(cond, ir.Bin):
        return []
    line = _linear(ir.Bin(ir.BinKind.SUB, cond.lhs, cond.rhs), name, env)
    if line is not None:
        a, b = line
        root = Fraction(-b, a)
        out = []
        for v in range(math.floor(root) - 1, math.ceil(root) + 3):
            try:
                if cond.eval({**env, name: v}) != cond.eval({**env, name: v - 1}):
                    out.append(v)
            except (ZeroDivisionError, OverflowError):
                pass
        return out
    limit = min(SCAN_LIMIT, max(64, 2 * (_magnitude(cond, name, env) + 1) ** 2))
    v = np.arange(limit + 1, dtype=np.int64)
    valid = np.ones(v.shape, dtype=bool)
    with np.errstate(all="ignore"):
        try:
            truth = np.broadcast_to(np.asarray(_over(cond, name, env, v, valid)) != 0, v.shape)
        except (KeyError, OverflowError, TypeError, ValueError):
            return []
    change = (truth[1:] != truth[:-1]) & valid[1:] & valid[:-1]
    return [int(i) + 1 for i in np.nonzero(change)[0][:2]]


def _linear(d: ir.IExpr, name: str, env: dict[str, int]) -> tuple[int, int] | None:
    """(a, b) if d = a * name + b with a != 0 at every probe, else None."""
    try:
        ys = [d.eval({**env, name: x}) for x in _PROBES]
    except (ZeroDivisionError, KeyError, OverflowError):
        return None
    a, b = ys[1] - ys[0], ys[0]
    if a == 0 or any(y != a * x + b for x, y in zip(_PROBES, ys)):
        return None
    return a, b


def _magnitude(e: ir.IExpr, name: str, env: dict[str, int]) -> int:
    """The largest magnitude of e's subexpressions that do not involve `name`."""
    if name not in e.names():
        try:
            return abs(e.eval(env))
        except (ZeroDivisionError, KeyError, OverflowError):
            return 0
    if isinstance(e, ir.Bin):
        return max(_magnitude(e.lhs, name, env), _magnitude(e.rhs, name, env))
    if isinstance(e, ir.Sel):
        return max(_magnitude(x, name, env) for x in (e.cond, e.then, e.orelse))
    return 0


def _over(e: ir.IExpr, name: str, env: dict[str, int], v: np.ndarray, valid: np.ndarray):
    """e with `name` taking every value of v (the others from env), floor semantics like
    ir.IExpr.eval; a division by zero clears `valid` where it happens."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return v if e.name == name else env[e.name]
    if isinstance(e, ir.Sel):   # a division by zero counts only where its branch is taken
        c = np.broadcast_to(np.asarray(_over(e.cond, name, env, v, valid)) != 0, valid.shape)
        va, vb = valid.copy(), valid.copy()
        a, b = _over(e.then, name, env, v, va), _over(e.orelse, name, env, v, vb)
        valid &= np.where(c, va, vb)
        return np.where(c, a, b)
    a, b = _over(e.lhs, name, env, v, valid), _over(e.rhs, name, env, v, valid)
    k = e.kind
    if k in (ir.BinKind.DIV, ir.BinKind.MOD):
        zero = np.asarray(b) == 0
        if zero.any():
            valid &= ~np.broadcast_to(zero, valid.shape)
            b = np.where(zero, 1, b)
        return np.floor_divide(a, b) if k is ir.BinKind.DIV else np.mod(a, b)
    ops = {ir.BinKind.ADD: np.add, ir.BinKind.SUB: np.subtract, ir.BinKind.MUL: np.multiply,
           ir.BinKind.MIN: np.minimum, ir.BinKind.MAX: np.maximum, ir.BinKind.LT: np.less, ir.BinKind.LE: np.less_equal,
           ir.BinKind.GT: np.greater, ir.BinKind.GE: np.greater_equal, ir.BinKind.EQ: np.equal,
           ir.BinKind.NE: np.not_equal}
    out = ops[k](a, b)
    return out.astype(np.int64) if k not in (ir.BinKind.ADD, ir.BinKind.SUB, ir.BinKind.MUL,
                                             ir.BinKind.MIN, ir.BinKind.MAX) else out


# ---- MoE and AllToAllV ----

def moe_experts(world: int) -> int:
    """2 experts per rank up to world 64, one above (every rank holds the world x experts counts)."""
    return 2 * world if world <= 64 else world


def _moe_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """MOE_SAMPLES' token counts and routings (rows of MOE_HIDDEN elements, top-MOE_TOPK,
    `moe_experts`; capacity as `_moe_sample` says), then the role values on both sides of every
    condition on a size symbol, each under the uniform routing with 5 tokens otherwise; other size
    symbols (a window's row count) get the bound world * tokens * topk; each kept while the
    simulation stays within budget (large worlds keep only the one-token sample)."""
    roles = moe_roles(s)
    role_of = {sym: role for role, sym in roles.items()}
    samples = [_moe_sample(s, world, role_of, routing, tokens=t) for t, routing in MOE_SAMPLES]
    mid = samples[1]
    if "capacity" in roles:
        # every slot of some (expert, source) pairs in use: the capacity exactly what the routing
        # needs, the least that holds all of its entries
        samples.append(_moe_sample(s, world, role_of, routing_mod.FULL, tokens=MOE_FULL_TOKENS))
    if "bound" in roles:
        # the bound exactly what the routing needs (within it) and one row less (over it: reported,
        # nothing placed), under a skewed and a uniform routing
        for t, routing in MOE_BOUND_SAMPLES:
            base = _moe_sample(s, world, role_of, routing, tokens=t)
            if not _drawn_cheaply(s, world, base):
                continue
            need = _received(s, world, base, routing)
            for v in (need, need - 1):
                if v >= 0:
                    samples.append(_moe_sample(s, world, role_of, routing, tokens=t, bound=v))
    experts = moe_experts(world)
    for sym, v in size_boundaries(s, world, dict(mid)):
        role = role_of.get(sym)
        if role == "tokens":
            # every sample routing: under one alone a wrong arm can place what the right one
            # does (at world 1, uniform routing makes every token pick every expert)
            for routing in routing_mod.ROUTINGS:
                samples.append(_moe_sample(s, world, role_of, routing, tokens=v))
        elif role == "topk" and 1 <= v <= experts:
            samples.append(_moe_sample(s, world, role_of, "uniform", tokens=5, topk=v))
        elif role == "hidden" and v >= 1:
            samples.append(_moe_sample(s, world, role_of, "uniform", tokens=5, hidden=v))
        elif role == "experts":
            # a multiple of the world size, at least topk: the nearest on each side of v
            for e in {v // world * world, -(-v // world) * world}:
                if e >= max(world, MOE_TOPK):
                    samples.append(_moe_sample(s, world, role_of, "uniform", tokens=5,
                                               experts=e))
        elif role == "bound" and v >= 0:
            samples.append(_moe_sample(s, world, role_of, "uniform", tokens=5, bound=v))
        elif role == "capacity":
            # a capacity below what the routing needs is refused at the call
            if _drawn_cheaply(s, world, mid) and v >= _need(s, world, mid, "uniform"):
                samples.append(_moe_sample(s, world, role_of, "uniform", tokens=5, capacity=v))
        else:
            extra = Sample({**mid, sym: v})
            extra.routing = "uniform"
            samples.append(extra)
    out: list[Sample] = []
    seen = set()
    ranks = rank_samples(s, world)
    for sample in samples:
        for rs in ranks:
            full = Sample({**sample, **rs})
            full.routing = sample.routing
            key = (tuple(sorted(full.items())), full.routing)
            if key in seen:
                continue
            seen.add(key)
            if _within_budget(s, world, full) or not out:
                out.append(full)
    return out


def _moe_sample(s: ir.Schedule, world: int, role_of: dict[str, str], routing: str, tokens: int,
                topk: int = MOE_TOPK, hidden: int = MOE_HIDDEN, experts: int | None = None,
                capacity: int | None = None, bound: int | None = None) -> Sample:
    """One MoE sample. The capacity, unless given: the least that holds the routing (the most
    entries one rank sends one expert) when that is below the token count, else tokens + 2, so
    that it never equals the token count and lies on either side of it; under routing.FULL the
    least that holds all of a rank's entries, ceil(tokens x topk / experts), which it fills."""
    experts = experts or moe_experts(world)
    if capacity is None and routing == routing_mod.FULL:
        capacity = max(1, -(-tokens * topk // experts))
    value = {"tokens": tokens, "topk": topk, "hidden": hidden,
             "experts": experts,
             "capacity": tokens + 2 if capacity is None else capacity,
             "bound": world * tokens * topk if bound is None else bound}
    sample = Sample({sym: value.get(role_of.get(sym, ""), world * tokens * topk) for sym in s.sizes})
    sample.routing = routing
    hid = next((sym for sym, role in role_of.items() if role == "hidden"), None)
    if hid is not None and window_row_faults(s, ir.DType.F32, {"world": world, **sample}):
        # an int8 window whose rows are not whole 32-byte blocks is refused at every call
        # (passes.window_row_faults): check the least hidden at or above this one that a call takes
        sample[hid] = ir.padded_row(sample[hid], ir.DType.I8)
    if capacity is None and "capacity" in role_of.values() and _drawn_cheaply(s, world, sample):
        need = _need(s, world, sample, routing)
        if 0 < need < tokens:
            sample[next(sym for sym, role in role_of.items() if role == "capacity")] = need
    return sample


def _drawn_cheaply(s: ir.Schedule, world: int, sample: dict[str, int]) -> bool:
    """Whether every rank's sample routing (world x tokens x experts random keys) costs at most
    SIM_ELEMENT_BUDGET to draw. Beyond it (world 8,192: 335 M keys for 5 tokens) the samples that
    only refine a capacity or a bound to what a routing needs are not drawn: a one-token sample
    needs no refinement, and the larger ones are over the budget anyway."""
    c = s.contract
    env = {"world": world, **sample}
    try:
        tokens = s.param(c.inputs[1]).dims[0].eval(env)
        experts = s.param(c.outputs[1] if c.kind.dispatch else c.inputs[3]).dims[-1].eval(env)
    except ZeroDivisionError:
        return True
    return world * tokens * experts <= SIM_ELEMENT_BUDGET


def _received(s: ir.Schedule, world: int, sample: dict[str, int], routing: str) -> int:
    """The most rows one rank receives under a sample routing (what a packed window's bound must
    hold): the entries of every rank for the experts it owns; with per_expert(R), the most rows one
    expert receives (what R must hold)."""
    c = s.contract
    env = {"world": world, **sample}
    try:
        T, K = (tuple(d.eval(env) for d in s.param(c.inputs[1]).dims) + (1,))[:2]
        E = s.param(c.outputs[1] if c.kind.dispatch else c.inputs[3]).dims[-1].eval(env)
        L = 1 if c.region else E // world
        recv = np.zeros(E // L, dtype=np.int64)
        for r in range(world):
            ids = routing_mod.expert_ids(routing, r, T, K, E, capacity=capacity_of(s, env))
            picked = ids[ids >= 0]
            recv += np.bincount(picked // L, minlength=E // L)[:E // L]
        return int(recv.max())
    except (ZeroDivisionError, ValueError):
        return 0


def capacity_of(s: ir.Schedule, env: dict[str, int]) -> int | None:
    """A slotted layout's capacity in an instance (what routing.FULL fills), else None."""
    cap = s.contract.capacity
    return env.get(cap) if cap else None


def _need(s: ir.Schedule, world: int, sample: dict[str, int], routing: str) -> int:
    """The most entries one rank's sample routing sends one expert (what a capacity must hold)."""
    c = s.contract
    env = {"world": world, **sample}
    try:
        T, K = (tuple(d.eval(env) for d in s.param(c.inputs[1]).dims) + (1,))[:2]
        E = s.param(c.outputs[1] if c.kind.dispatch else c.inputs[3]).dims[-1].eval(env)
        worst = 0
        for r in range(world):
            ids = routing_mod.expert_ids(routing, r, T, K, E, capacity=capacity_of(s, env))
            picked = ids[ids >= 0]
            if picked.size:
                worst = max(worst, int(np.bincount(picked).max()))
        return worst
    except (ZeroDivisionError, ValueError):
        return 0   # instantiate or route_sample reports what is wrong with the shapes


# ---- budget ----

def _unique(samples: list[dict[str, int]]) -> list[dict[str, int]]:
    return list({tuple(sorted(x.items())): x for x in samples}.values())


def _keep(s: ir.Schedule, world: int, samples: list[dict[str, int]]) -> list[dict[str, int]]:
    out: list[dict[str, int]] = []
    for sample in _unique(samples):
        if _within_budget(s, world, sample) or not out:
            out.append(sample)
    return out


def _within_budget(s: ir.Schedule, world: int, sizes: dict[str, int]) -> bool:
    env = {"world": world, **sizes}
    try:
        total = sum(p.size.eval(env) for p in s.params) * world
    except ZeroDivisionError:
        total = 0  # instantiate reports it as a diagnostic, with the span of the size
    return total <= SIM_ELEMENT_BUDGET


def route_sample(inst: Instance, routing: str) -> None:
    """Expert ids for every rank from a sample routing; a combine also starts from the counts its
    dispatch left (its precondition)."""
    s, c = inst.schedule, inst.schedule.contract
    ids_name = c.inputs[1]
    T, K = (inst.buffer_shapes[ids_name] + (1,))[:2]
    counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    E = inst.buffer_shapes[counts][-1]
    if c.kind is ir.ContractKind.ALLTOALLV and E != inst.world:
        raise StrataError(error(Codes.SHAPE, f"alltoallv's {counts} needs world x world counts (one column "
                                f"per destination rank), it has {E} columns ({context(inst)})",
                                s.param(counts).span))
    if K > E:
        raise StrataError(error(Codes.SHAPE, f"topk ({K}) exceeds the number of experts ({E}) "
                                f"({context(inst)})", s.param(ids_name).span))
    cap = capacity_of(s, {"world": inst.world, **inst.sizes})
    ids = [routing_mod.expert_ids(routing, r, T, K, E, capacity=cap) for r in range(inst.world)]
    inst.routing = routing
    inst.data = {(r, ids_name): ids[r] for r in range(inst.world)}
    if c.kind is ir.ContractKind.MOE_COMBINE:
        counted = ids
        if inst.active is not None:
            # the masked dispatch before it counted only entries of live ranks' experts, and left
            # a masked rank's row as it was (here: counts no routing makes, which the combine must
            # not read)
            counted = [live_entries(i, E, inst.active) for i in ids]
        matrix = np.stack([np.bincount(i[i >= 0], minlength=E)[:E] for i in counted])
        if inst.active is not None:
            for q in range(inst.world):
                if not inst.active[q]:
                    matrix[q] = 1000 + q
        matrix = matrix.reshape(-1)
        inst.data.update({(r, counts): matrix for r in range(inst.world)})


def live_entries(ids: np.ndarray, experts: int, live) -> np.ndarray:
    """ids with -1 for every entry that is not an expert of a live rank (one bool per rank): a
    masked call drops the entries of masked ranks' experts (docs/robustness.md, "Masked ranks")."""
    live = np.asarray(live, dtype=bool)
    owner = np.clip(ids, 0, experts - 1) // max(1, experts // len(live))
    return np.where((ids >= 0) & (ids < experts) & live[owner], ids, -1)


def live_text(active: tuple[bool, ...]) -> str:
    """The live ranks of a mask as diagnostics name them: {0, 2}."""
    return "{" + ", ".join(str(r) for r, v in enumerate(active) if v) + "}"


def context(inst: Instance) -> str:
    """The instance as diagnostics name it: world, sizes and routing."""
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(inst.sizes.items()))
    routing = f", routing={inst.routing}" if inst.routing else ""
    mask = "" if inst.active is None else f", active ranks {live_text(inst.active)}"
    return f"world={inst.world}" + (f", {sizes}" if sizes else "") + routing + mask
