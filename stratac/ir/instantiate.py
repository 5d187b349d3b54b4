"""Instantiate a schedule for a concrete world size and concrete sizes: per-rank event lists.

Each rank's timeline is ENTRY, then its stages and sync operations in program order, then EXIT.
A stage is one event: everything in it runs concurrently (cores, SDMA queues). Each data movement
becomes a Move (for the contract simulation) and Accesses with element intervals (for races).
Consecutive signals (or waits) merge into one event, since nothing happens between them. A barrier
event carries the value ranks meet at: its stamp on the IR after the passes (what the kernel
compares), before them its place in the program, numbered here on its own by the rule of the epoch
pass (passes._stamp_barriers): 1 + the places before it, the k-th barrier of either arm of an if
one place, the if the places of its longer arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from stratac import ir
from stratac.diagnostics import Codes, Note, Span, StrataError, error
from stratac.ir import lockstep
from stratac.ir.events import (INT64 as _INT64, Access, BadOperand as _BadOperand, Event, EventKind,
                               Move, NegativeOperand as _NegativeOperand, RouteInst,
                               barred as _barred, div as _div, has_barrier as _has_barrier,
                               log2 as _log2, mod as _mod, shl as _shl, shr as _shr)


@dataclass
class Instance:
    schedule: ir.Schedule
    world: int
    sizes: dict[str, int]
    timelines: list[list[Event]]
    buffer_sizes: dict[str, int]
    flag_sizes: dict[str, int]
    buffer_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    data: dict = field(default_factory=dict)   # (rank, buffer) -> initial values (MoE expert ids)
    routing: str | None = None                 # the name of the sample routing data came from
    active: tuple[bool, ...] | None = None     # a masked call's live ranks (None: every rank)
    flag_rounds: dict[str, int] = field(default_factory=dict)   # flag -> its rounds per call

    def live(self, r: int) -> bool:
        return self.active is None or self.active[r]


Const = ir.Const


_CHECKED = {ir.BinKind.DIV: "_div", ir.BinKind.MOD: "_mod", ir.BinKind.SHL: "_shl",
            ir.BinKind.SHR: "_shr"}
_COMPARE = (ir.BinKind.LT, ir.BinKind.LE, ir.BinKind.GT, ir.BinKind.GE, ir.BinKind.EQ, ir.BinKind.NE)


class _Py:
    """Python source of expressions over `env`, for one compiled function. / and % go through _div
    and _mod: the generated C++ truncates toward zero where Python floors, so the two agree only on
    non-negative operands, and the verifier must not accept what the device computes differently
    (e.g. (rank - 1) % world).

    A subexpression written more than once in the function (a let is substituted wherever it is
    used, so `let S = ...` used ten times is ten copies of S) is computed once: its first
    evaluation is an assignment expression `(_tN := ...)` and later ones read `_tN`. Only an
    evaluation that always runs assigns: one inside a branch of a conditional (`a if c else b`
    evaluates one branch, whose operands may be undefined otherwise) is written out in full unless
    an earlier one already assigned it."""

    def __init__(self, exprs) -> None:
        self.keys: dict[int, object] = {}       # id(node) -> structural key
        self.count: dict[object, int] = {}
        self.names: dict[object, str] = {}      # key -> _tN, once assigned
        self.nodes: list = []                   # keeps the nodes keyed by id alive
        for e in exprs:
            self._count(e)

    def _key(self, e) -> object:
        k = self.keys.get(id(e))
        if k is None:
            if isinstance(e, (ir.Const, ir.Var)):
                k = e
            elif isinstance(e, ir.Elem):
                k = ("[]", e.name, self._key(e.index))
            elif isinstance(e, ir.Sel):
                k = ("?", self._key(e.cond), self._key(e.then), self._key(e.orelse))
            else:
                k = (e.kind, self._key(e.lhs), self._key(e.rhs))
            self.keys[id(e)] = k
            self.nodes.append(e)
        return k

    def _count(self, e) -> None:
        k = self._key(e)
        self.count[k] = self.count.get(k, 0) + 1
        if self.count[k] == 1:      # the children of a repeated node are counted once
            for child in _children(e):
                self._count(child)

    def __call__(self, e, cond: bool = False) -> str:
        """e's source; cond: e is evaluated only under a conditional's choice."""
        k = self._key(e)
        name = self.names.get(k)
        if name is not None:
            return name
        code = self._code(e, cond)
        if self.count[k] > 1 and not cond and not isinstance(e, (ir.Const, ir.Var)):
            name = self.names[k] = f"_t{len(self.names)}"
            return f"({name} := {code})"
        return code

    def _code(self, e, cond: bool) -> str:
        if isinstance(e, ir.Sel):   # only the branch taken is evaluated (and checked)
            c = self(e.cond, cond)
            return f"({self(e.then, True)} if {c} else {self(e.orelse, True)})"
        if isinstance(e, ir.Elem):
            return f"_element(env[{e.name!r}], {self(e.index, cond)}, {e.name!r})"
        if isinstance(e, ir.Bin):
            if e.kind is ir.BinKind.LOG2:
                return f"_log2({self(e.lhs, cond)})"
            a, b = self(e.lhs, cond), self(e.rhs, cond)
            if e.kind in _CHECKED:
                return f"{_CHECKED[e.kind]}({a}, {b})"
            if e.kind in (ir.BinKind.MIN, ir.BinKind.MAX):
                return f"{e.kind.value}({a}, {b})"
            if e.kind in _COMPARE:
                return f"int({a} {e.kind.value} {b})"
            return f"({a} {e.kind.value} {b})"
        return ir.py_source(e)


def _children(e) -> tuple:
    if isinstance(e, ir.Sel):
        return (e.cond, e.then, e.orelse)
    if isinstance(e, ir.Elem):
        return (e.index,)
    if isinstance(e, ir.Bin):
        return (e.lhs, e.rhs)
    return ()


def _function(exprs, body) -> Callable[[dict], object]:
    """`lambda env: body(py)` compiled, py writing the expressions of `exprs` with their common
    subexpressions computed once (_Py)."""
    return eval(f"lambda env: {body(_Py(exprs))}", {  # noqa: S307 - from the IR only
        "_div": _div, "_mod": _mod, "_shl": _shl, "_shr": _shr, "_log2": _log2,
        "_element": ir.element})


_COMPILED: dict[int, tuple[ir.IExpr, Callable[[dict], int]]] = {}


def _compiled(e: ir.IExpr) -> Callable[[dict], int]:
    """The expression as a Python function, cached by node identity: hashing a frozen expression
    tree on every evaluation cost more than evaluating it (the entry keeps the node alive, so its
    id cannot be reused)."""
    hit = _COMPILED.get(id(e))
    if hit is not None and hit[0] is e:
        return hit[1]
    fn = _function([e], lambda py: py(e))
    if len(_COMPILED) > 65536:
        _COMPILED.clear()
    _COMPILED[id(e)] = (e, fn)
    return fn


_REGIONS: dict[int, tuple[ir.Region, Callable[[dict], tuple]]] = {}


def _region_fn(r: ir.Region) -> Callable[[dict], tuple]:
    """(owner, lo, length, part index, parts) of a region as one compiled function, cached like
    `_compiled`: a step loop evaluates every region once per step and rank."""
    hit = _REGIONS.get(id(r))
    if hit is not None and hit[0] is r:
        return hit[1]
    # in order of evaluation: owner, lo, length, part index and parts, then inside a part
    # (part[i][lo:hi], chunk[i][c]) a, b, limit with 0 <= a <= b <= limit (a chunk c of k: c,
    # c + 1, k)
    exprs = [r.rank or ir.Var("rank"), r.lo, r.length, *(r.part or (ir.Const(0), ir.Const(1)))]
    if r.sub is not None:
        exprs += [r.sub[1], r.sub[2], r.sub[3]] if r.sub[0] == "range" else [
            r.sub[1], ir.Bin(ir.BinKind.ADD, r.sub[1], ir.Const(1)), r.sub[2]]
    else:
        exprs += [ir.Const(0)] * 3
    fn = _function(exprs, lambda py: "(" + ", ".join(py(x) for x in exprs) + ")")
    if len(_REGIONS) > 65536:
        _REGIONS.clear()
    _REGIONS[id(r)] = (r, fn)
    return fn


def _signal_fn(op: ir.Signal) -> Callable[[dict], tuple]:
    """(owner, slot, round) of a signal as one compiled function, cached like `_region_fn`."""
    hit = _REGIONS.get(id(op))
    if hit is not None and hit[0] is op:
        return hit[1]
    exprs = (op.rank, op.index, op.round)
    fn = _function(exprs, lambda py: "(" + ", ".join(py(x) for x in exprs) + ")")
    _REGIONS[id(op)] = (op, fn)
    return fn


def _ev(e: ir.IExpr, env: dict, span: Span, what: str) -> int:
    try:
        v = _compiled(e)(env)
        if not -_INT64 <= v < _INT64:
            raise _BadOperand(f"the value {v} overflows int64")
        return v
    except ZeroDivisionError:
        raise StrataError(error(Codes.BAD_WORLD, f"division by zero evaluating {what} ({e}) with "
                                f"{_env_text(env)}", span)) from None
    except _NegativeOperand as exc:
        raise StrataError(error(Codes.BAD_WORLD, f"negative operand in {exc} evaluating {what} ({e}) "
                                f"with {_env_text(env)}: / truncates toward zero on the device, so keep "
                                "its operands non-negative", span)) from None
    except _BadOperand as exc:
        where = f" with {_env_text(env)}" if env else ""
        raise StrataError(error(Codes.BAD_WORLD, f"{exc} evaluating {what} ({ir.bare(e)}){where}",
                                span)) from None
    except IndexError as exc:     # an array's element outside it (ir.element says which)
        raise StrataError(error(Codes.SHAPE, f"{exc} evaluating {what} ({ir.bare(e)}) with "
                                f"{_env_text(env)}", span)) from None


def _truth(cond: ir.IExpr, env: dict, span: Span) -> bool:
    """Whether a condition holds: the compiled call, or on any evaluation error `_ev`'s report."""
    try:
        return bool(_compiled(cond)(env))
    except (ArithmeticError, IndexError):
        return bool(_ev(cond, env, span, "a condition"))


def evaluate(e: ir.IExpr, env: dict, span: Span, what: str) -> int:
    """e's value under env with the kernel's rules (/ of non-negative operands, floored % by a
    positive number, shifts within int64, log2 of a positive number), or a StrataError at span."""
    return _ev(e, env, span, what)


def local_value(op: "ir.Local | ir.Set", env: dict) -> "int | tuple[int, ...]":
    """The value a var declaration or a `set` gives its name in env (not changed): an integer, or
    an array's elements as a tuple (its size and the index checked, StrataError at the statement)."""
    value = _ev(op.value, env, op.span, f"the value of {op.name}")
    if type(op) is ir.Local and op.size is not None:
        k = _ev(op.size, env, op.span, f"the size of array {op.name}")
        if not 0 <= k <= ir.ARRAY_CAPACITY:
            raise StrataError(error(Codes.SHAPE, f"array {op.name} would hold {k} integers with "
                                    f"{_env_text(env)}: an array holds 0 to {ir.ARRAY_CAPACITY} (it "
                                    "lives on the scalar unit's stack)", op.span))
        return (value,) * k
    if type(op) is ir.Set and op.index is not None:
        old = env[op.name]
        i = _ev(op.index, env, op.span, f"the index of {op.name}")
        if not 0 <= i < len(old):
            raise StrataError(error(Codes.SHAPE, f"`set {op.name}[{i}]` is outside {op.name}'s "
                                    f"{len(old)} elements (0 .. {len(old) - 1}) with "
                                    f"{_env_text(env)}", op.span))
        return old[:i] + (value,) + old[i + 1:]
    return value


def _env_text(env: dict) -> str:
    return ", ".join(f"{k}={list(v) if type(v) is tuple else v}" for k, v in sorted(env.items()))


# From this many live ranks on, an instance's ranks walk the program together (stratac.ir.lockstep:
# each expression evaluated once for all of them), unless that walk gives the instance back.
LOCKSTEP_FROM = 2

# From this many live ranks on, an instance is first estimated from three of its ranks (_probe) and
# refused before it is built when the estimate is over MAX_EVENTS or CLOCK_BYTES.
PROBE_FROM = 64
# The most bytes the vector clocks of an instance's execution may take (stratac.verify.timeline: an
# array of world entries per wait and per barrier).
CLOCK_BYTES = 2 << 30

# The most events, moves, move sources, signals and waits an instance may hold over all ranks. Each
# costs up to about 500 bytes with its accesses, so this bounds the verifier's memory near 2 GiB
# (world 384's ring AllReduce holds 0.9 M events, 0.3 M moves, as many sources and 0.6 M signals
# and waits); a larger instance is refused
# while it is being built, before its memory grows, naming the count.
MAX_EVENTS = 4_000_000


def instantiate(s: ir.Schedule, world: int, sizes: dict[str, int], data: dict | None = None,
                barriers_only: bool = False, active: tuple[bool, ...] | None = None) -> Instance:
    """sizes gives every size symbol and every rank parameter a value; data the initial values of
    buffers whose values steer the schedule (expert ids), by (rank, buffer). barriers_only: the
    timelines hold ENTRY, the barriers and EXIT, nothing else (what checking stamps needs).
    active: a masked call's live ranks (ir.takes_mask schedules only). A masked rank does not run
    (its timeline is ENTRY, EXIT); loops over ranks and peers and the barriers cover the live ranks
    only (what the kernel's strata::Live and strata::MaskedBarrier do); a region, signal or wait
    that names a masked rank by expression is refused."""
    if world < 1:
        raise StrataError(error(Codes.BAD_WORLD, f"world size must be at least 1, got {world}", s.span))
    if active is not None:
        if not ir.takes_mask(s):
            raise StrataError(error(Codes.BAD_WORLD, f"{s.name} does not take a mask of active ranks "
                                    "(only MoE dispatch and combine do)", s.span))
        if len(active) != world or not any(active) or world > ir.MASK_MAX_WORLD:
            raise StrataError(error(Codes.BAD_WORLD, f"a mask of active ranks needs one entry per rank "
                                    f"of a world of at most {ir.MASK_MAX_WORLD}, at least one live; got "
                                    f"{len(active)} entries, {sum(map(bool, active))} live, at world {world}",
                                    s.span))
        active = tuple(bool(v) for v in active)
        if all(active):
            active = None
    if s.elem and sizes.get(ir.ELEM) not in ir.elem_sizes(s):
        raise StrataError(error(Codes.BAD_WORLD, f"{s.name} names sizeof(T), so an instance gives it "
                                f"one of {list(ir.elem_sizes(s))} bytes; got {sizes.get(ir.ELEM)}", s.span))
    for x in s.int_params:
        v = sizes[x.name]
        if x.kind is ir.ScalarKind.RANK and not 0 <= v < world:
            raise StrataError(error(Codes.BAD_WORLD, f"{x.name} = {v} is not a rank of a "
                                    f"world of {world}", x.span))
        if x.kind is ir.ScalarKind.DIVISOR and not (v >= 1 and world % v == 0):
            raise StrataError(error(Codes.BAD_WORLD, f"{x.name} = {v} does not divide the world "
                                    f"({world})", x.span))
    base = {"world": world, **sizes}
    buffer_sizes = {p.name: _ev(p.size, base, p.span, f"the size of {p.name}") for p in s.params}
    for name, n in buffer_sizes.items():
        if n < 0:
            raise StrataError(error(Codes.BAD_WORLD, f"{name} would have {n} elements with "
                                    f"{_env_text(base)}", s.param(name).span))
    flag_sizes = {f.name: _ev(f.size, base, f.span, f"the size of flag {f.name}") for f in s.flags}
    flag_rounds = {f.name: _ev(f.rounds, base, f.span, f"the rounds of flag {f.name}") for f in s.flags}
    for f in s.flags:
        if flag_rounds[f.name] < 1:
            raise StrataError(error(Codes.BAD_WORLD, f"flag {f.name} would have "
                                    f"{flag_rounds[f.name]} rounds with {_env_text(base)}: a flag "
                                    "has at least one", f.span))
    for team in s.teams:
        if team.kind == "groups":
            groups = [_ev(x, base, team.span, f"a group size of team {team.name}") for x in team.sizes]
            if min(groups) < 1 or sum(groups) != world:
                raise StrataError(error(Codes.BAD_WORLD, f"team {team} needs groups of at least one "
                                        f"rank that add up to the world, but they are {groups} with "
                                        f"world = {world}: state the worlds it needs with `requires`",
                                        team.span))
            continue
        t = _ev(team.t, base, team.span, f"the size of team {team.name}")
        if t < 1 or world % t:
            raise StrataError(error(Codes.BAD_WORLD, f"team {team.name} = {team.kind}(T) needs T to "
                                    f"divide the world, but T = {t} with world = {world}: state "
                                    "the worlds it needs with `requires`", team.span))
    for call in s.calls:
        for r in call.requires:
            if not r.holds(world):
                team = next((t for t in s.teams if t.name == call.team), None)
                on = f"at world {world}" if team is None else (
                    f"team {team.name} has {_ev(team.size, base, team.span, 'the team size')} "
                    f"ranks at world {world}")
                raise StrataError(error(Codes.BAD_WORLD, f"{call}: {call.callee} requires {r.text}, "
                                        f"but {on}", call.span,
                                        Note(f"{call.callee} states it here", r.span)))
        for name, have, want, declared in call.shapes:   # every argument has its declared size
            for r in range(world):
                if active is not None and not active[r]:
                    continue
                env = {**base, "rank": r}
                got, need = (_ev(x, env, call.span, f"the size of {name} in {call}") for x in (have, want))
                if got != need:
                    raise StrataError(error(Codes.SHAPE, f"{call}: on rank {r}, the region passed as "
                                            f"{call.callee}'s {name} has {got} elements, but {name} "
                                            f"needs {need} ({declared}) (with {_env_text(base)})",
                                            call.span))
    shapes = {p.name: tuple(_ev(d, base, p.span, f"the shape of {p.name}") for d in p.dims)
              for p in s.params}
    b = _Builder(s, world, base, buffer_sizes, flag_sizes, barriers_only)
    b.shapes, b.flag_rounds = shapes, flag_rounds
    b.live = frozenset(r for r in range(world) if active is None or active[r])
    if len(b.live) > PROBE_FROM:
        _probe(s, world, base, buffer_sizes, flag_sizes, barriers_only, shapes, b.live, flag_rounds)
    timelines = None
    if not barriers_only and len(b.live) >= LOCKSTEP_FROM:
        timelines = lockstep.timelines(b)
    if timelines is None:   # rank by rank (the lockstep walk leaves every error to this one)
        timelines = []
        for r in range(world):
            timelines.append(b.timeline(r) if r in b.live else
                             [Event(EventKind.ENTRY, r, 0, None), Event(EventKind.EXIT, r, 1, None)])
            b.held += len(timelines[-1])
    return Instance(s, world, dict(sizes), timelines, buffer_sizes, flag_sizes, shapes, dict(data or {}),
                    active=active, flag_rounds=flag_rounds)


def clock_itemsize(longest: int) -> int:
    """Bytes per entry of a vector clock (stratac.verify.timeline) when the longest timeline of an
    instance has `longest` events: an entry counts a rank's events, up to its timeline's length
    (a log-step schedule's timelines at 8,192 ranks are a few dozen events: a byte per entry)."""
    return 1 if longest < 2**8 - 1 else 2 if longest < 2**15 - 1 else 4 if longest < 2**31 - 1 else 8


def _probe(s, world, base, buffer_sizes, flag_sizes, barriers_only, shapes, live, flag_rounds) -> None:
    """Refuses an instance too large for the verifier before it is built: its events, moves, move
    sources, signals and waits, and its vector clocks (one array of world entries per wait and barrier,
    stratac.verify.timeline), estimated from the timelines of its first, middle and last live ranks
    times the live ranks."""
    probe = _Builder(s, world, base, buffer_sizes, flag_sizes, barriers_only)
    probe.shapes, probe.live, probe.flag_rounds = shapes, live, flag_rounds
    ranks = sorted(live)
    events = joins = longest = 0
    for r in {ranks[0], ranks[len(ranks) // 2], ranks[-1]}:
        moves = probe.instance + probe.sources
        tl = probe.timeline(r)
        events = max(events, len(tl) + probe.instance + probe.sources - moves)
        joins = max(joins, sum(1 for ev in tl if ev.kind in (EventKind.WAIT, EventKind.BARRIER)))
        longest = max(longest, len(tl))
    total = events * len(live)
    clocks = joins * len(live) * world * clock_itemsize(longest)
    what = None
    if total > MAX_EVENTS:
        what = (f"about {total:,} events, moves, sources, signals and waits (up to {events:,} on a "
                f"rank), more than "
                f"the {MAX_EVENTS:,}")
    elif clocks > CLOCK_BYTES:
        what = (f"vector clocks of about {clocks / 2**30:.1f} GiB ({joins:,} waits and barriers on a "
                f"rank, {world:,} entries each), more than the {CLOCK_BYTES / 2**30:.0f} GiB")
    if what:
        raise StrataError(error(Codes.BAD_WORLD, f"{s.name} at {_env_text(base)} would hold {what} the "
                                "verifier holds: refused before it is built (the verifier walks every "
                                "rank's events, so its cost grows with the world's square or more); "
                                "prove it at a smaller world", s.span))


class _Builder:
    def __init__(self, s, world, base, buffer_sizes, flag_sizes, barriers_only):
        self.s, self.world, self.base = s, world, base
        self.buffer_sizes, self.flag_sizes = buffer_sizes, flag_sizes
        self.flag_rounds: dict[str, int] = {}
        self.barriers_only = barriers_only
        self.instance = 0
        self.live = frozenset(range(world))
        self.held = 0     # events of the ranks before this one
        self.max_events = MAX_EVENTS   # (read when the builder is made: tests lower it)
        # the parts of events so far: moves' sources (a reduction over the ranks: world of them),
        # signals and waits (a loop over the peers: one event of world of them)
        self.sources = 0

    def grow(self, span: Span, events: int) -> None:
        """Refuses the instance once its events (the ranks' before this one, and `events` of this
        one), moves, sources, signals and waits exceed MAX_EVENTS."""
        if self.held + events + self.instance + self.sources > MAX_EVENTS:
            raise StrataError(error(Codes.BAD_WORLD, f"{self.s.name} at {_env_text(self.base)} has more "
                                    f"than {MAX_EVENTS} events, moves, sources, signals and waits over its ranks, more than the "
                                    "verifier holds: it is refused before its memory grows; prove it at a "
                                    "smaller world or with fewer loop iterations", span))

    def timeline(self, rank: int) -> list[Event]:
        env = dict(self.base, rank=rank)
        events: list[Event] = [Event(EventKind.ENTRY, rank, 0, None)]
        barriers = 0
        posted: dict[str, Event] = {}    # asynchronous stages in flight, by handle

        def new(kind, span, **kw):
            ev = Event(kind, rank, len(events), span, **kw)
            events.append(ev)
            return ev

        # the hot loop of the verifier (about a million events per instance at world 384):
        # dispatch on the exact node type, build events positionally, skip empty arms
        flag_sizes, flag_rounds, lowered, live = (self.flag_sizes, self.flag_rounds, self.s.lowered,
                                                  self.live)
        SIGNAL, WAIT, STAGE = EventKind.SIGNAL, EventKind.WAIT, EventKind.STAGE
        Signal, Wait, If, Loop, Stage, Await, Barrier, Local, Set = (
            ir.Signal, ir.Wait, ir.If, ir.Loop, ir.Stage, ir.Await, ir.Barrier, ir.Local, ir.Set)

        def sync(op, env):
            t = type(op)
            if t is Loop:
                for v in self.values(op, env):
                    env[op.var] = v
                    for o in op.body:
                        sync(o, env)
                env.pop(op.var, None)
                return
            last = events[-1]
            if t is Signal:
                try:   # the fast path (one compiled call); errors take the checked one
                    owner, slot, rnd = _signal_fn(op)(env)
                    ok = (owner in live and 0 <= slot < flag_sizes[op.flag]
                          and 0 <= rnd < flag_rounds[op.flag])
                except (ArithmeticError, LookupError):
                    ok = False
                if not ok:
                    owner = _ev(op.rank, env, op.span, "the signalled rank")
                    self.check_rank(owner, op.span, env)
                    slot = self.flag_slot(op.flag, op.index, env, op.span)
                    rnd = self.flag_round(op, env)
                self.sources += 1
                if last.kind is SIGNAL:
                    last.signals.append((owner, op.flag, slot, rnd, op.span))
                else:
                    events.append(Event(SIGNAL, rank, len(events), op.span,
                                        signals=[(owner, op.flag, slot, rnd, op.span)]))
            else:
                try:   # the fast path, as for a signal
                    slot = _compiled(op.index)(env)
                    rnd = op.round.value if type(op.round) is Const else _compiled(op.round)(env)
                    ok = 0 <= slot < flag_sizes[op.flag] and 0 <= rnd < flag_rounds[op.flag]
                except (ArithmeticError, LookupError):
                    ok = False
                if not ok:
                    slot = self.flag_slot(op.flag, op.index, env, op.span)
                    rnd = self.flag_round(op, env)
                self.sources += 1
                if last.kind is WAIT:
                    last.waits.append((op.flag, slot, rnd, op.span))
                else:
                    events.append(Event(WAIT, rank, len(events), op.span,
                                        waits=[(op.flag, slot, rnd, op.span)]))

        def top(ops, env):
            nonlocal barriers
            declared: list[str] = []    # the block's locals, out of scope at its end
            for op in ops:
                t = type(op)
                if t is Signal or t is Wait:
                    if not self.barriers_only:
                        sync(op, env)
                elif t is If:
                    arm = op.then if _truth(op.cond, env, op.span) else op.orelse
                    start = barriers
                    if arm:
                        top(arm, env)
                    if _barred(op):   # the if takes the places of its longer arm (passes._stamp_barriers)
                        barriers = start + max(self.places(op.then, env), self.places(op.orelse, env))
                elif t is Barrier:
                    # a barrier meets the members at the same place of the program: 1 + the places
                    # before it, both arms of an if numbered alike (the kernel's stamp, passes.flag_epochs)
                    meet = (_ev(op.seq, env, op.span, "the barrier's stamp") if lowered
                            else barriers + 1)
                    members = None
                    if op.team is not None:
                        base_ = _ev(op.team.base, env, op.span, "the team's first rank")
                        step = _ev(op.team.step, env, op.span, "the team's stride")
                        size = _ev(op.team.size, env, op.span, "the team's size")
                        members = tuple(base_ + i * step for i in range(size))
                    new(EventKind.BARRIER, op.span, barrier=meet, members=members)
                    barriers += 1
                elif t is Local or t is Set:
                    # the rank's one env: a var keeps what `set` gave it after the loop or if
                    # that set it (loop variables are bound in it too; sema keeps names apart); a
                    # let's name is for the generated code alone (its uses are substituted)
                    if t is Set or not op.inline:
                        env[op.name] = local_value(op, env)
                        if t is Local:
                            declared.append(op.name)
                elif self.barriers_only and not (t is Loop and op.domain is ir.Domain.RANGE):
                    continue   # barriers sit at the top level, under ifs and in step loops (sema)
                elif t is Stage:
                    ev = Event(STAGE, rank, len(events), op.span, op, [], [])
                    ev.routes = []
                    events.append(ev)
                    for inner in op.body:
                        self.moves(inner, env, ev)
                    if op.handle is not None:
                        posted[op.handle] = ev
                elif t is Loop:
                    for v in self.values(op, env):
                        self.grow(op.span, len(events))
                        env[op.var] = v
                        top(op.body, env)
                    env.pop(op.var, None)
                elif t is Await:
                    ev = new(EventKind.AWAIT, op.span)
                    stage = posted.pop(op.handle, None)
                    if stage is not None:   # sema pairs every await with a stage before it
                        stage.done = ev.index
                else:
                    sync(op, env)
            for name in declared:
                del env[name]

        top(self.s.body, env)
        events.append(Event(EventKind.EXIT, rank, len(events), None))
        return events

    def places(self, ops, env: dict) -> int:
        """The barrier places ops take (passes._stamp_barriers' rule, counted here on its own): one
        per barrier, an if's longer arm, a step loop's trips times its body's."""
        n = 0
        for op in ops:
            t = type(op)
            if t is ir.Barrier:
                n += 1
            elif t is ir.If and _barred(op):
                n += max(self.places(op.then, env), self.places(op.orelse, env))
            elif t is ir.Loop and op.domain is ir.Domain.RANGE and _has_barrier(op.body):
                for v in self.values(op, env):
                    n += self.places(op.body, {**env, op.var: v})
        return n

    def domain(self, d: ir.Domain, rank: int):
        return [p for p in range(self.world) if (d is ir.Domain.RANKS or p != rank) and p in self.live]

    def reduce_domain(self, op: ir.Reduce, env: dict):
        """The values of a reduction's variable: ranks, or (count set) a team's places."""
        if op.count is None:
            return self.domain(op.domain, env["rank"])
        n = _ev(op.count, env, op.span, "the team's size")
        skip = _ev(op.skip, env, op.span, "the team's rank") if op.domain is ir.Domain.PEERS else -1
        return [i for i in range(n) if i != skip]

    def values(self, loop: ir.Loop, env: dict):
        """The values a loop's variable takes on this rank."""
        if loop.domain is not ir.Domain.RANGE:
            return self.domain(loop.domain, env["rank"])
        lo = _ev(loop.lo, env, loop.span, "the loop's first value")
        hi = _ev(loop.hi, env, loop.span, "the loop's end")
        if lo < 0 and hi > lo:
            raise StrataError(error(Codes.BAD_WORLD, f"loop variable {loop.var} would start at {lo} "
                                    f"(with {_env_text(env)}): loop variables are never negative, so "
                                    "that % and / agree with the kernel's", loop.span))
        return range(lo, hi)

    def check_rank(self, r: int, span: Span, env: dict) -> None:
        if not 0 <= r < self.world:
            raise StrataError(error(Codes.BAD_WORLD, f"rank {r} does not exist in a world of "
                                    f"{self.world} (with {_env_text(env)})", span))
        if r not in self.live:
            raise StrataError(error(Codes.BAD_WORLD, f"this names rank {r}, which the call's mask of "
                                    f"active ranks excludes (live: {sorted(self.live)}; with "
                                    f"{_env_text(env)}): a masked rank is neither read, written nor "
                                    "signalled; name peers with `for p in peers` so that the mask "
                                    "skips them", span))

    def flag_round(self, op: ir.Signal | ir.Wait, env: dict) -> int:
        rnd = _ev(op.round, env, op.span, f"the round of flag {op.flag}")
        if not 0 <= rnd < self.flag_rounds[op.flag]:
            raise StrataError(error(Codes.SHAPE, f"round {rnd} of flag {op.flag} is out of range "
                                    f"[0, {self.flag_rounds[op.flag]}) with {_env_text(env)}: a slot "
                                    f"of {op.flag} is signalled at most {self.flag_rounds[op.flag]} "
                                    "times per call (its `rounds`)", op.span))
        return rnd

    def flag_slot(self, flag: str, index: ir.IExpr, env: dict, span: Span) -> int:
        slot = _ev(index, env, span, f"the index of flag {flag}")
        if not 0 <= slot < self.flag_sizes[flag]:
            raise StrataError(error(Codes.SHAPE, f"slot {slot} of flag {flag} is out of range "
                                    f"[0, {self.flag_sizes[flag]}) with {_env_text(env)}", span))
        return slot

    def region(self, r: ir.Region, env: dict) -> tuple[int, str, int, int]:
        # the fast path: every expression of the region in one compiled call; any evaluation
        # error takes the slow path below, which reports it at its place
        try:
            owner, lo, n, index, parts, a, b, limit = _region_fn(r)(env)
        except (ArithmeticError, LookupError):
            return self._region(r, env)
        if not (owner in self.live and (r.part is None or 0 <= index < parts)
                and 0 <= a <= b <= limit
                and 0 <= lo and 0 <= n and lo + n <= self.buffer_sizes[r.buffer]):
            return self._region(r, env)
        return owner, r.buffer, lo, lo + n

    def _region(self, r: ir.Region, env: dict) -> tuple[int, str, int, int]:
        owner = env["rank"] if r.rank is None else _ev(r.rank, env, r.span, "a rank")
        self.check_rank(owner, r.span, env)
        lo = _ev(r.lo, env, r.span, "an offset")
        n = _ev(r.length, env, r.span, "a length")
        if r.part is not None:
            index = _ev(r.part[0], env, r.span, "a part index")
            parts = _ev(r.part[1], env, r.span, "the number of parts")
            if not 0 <= index < parts:
                raise StrataError(error(Codes.SHAPE, f"part {index} of a split of {r.buffer} into "
                                        f"{parts} parts does not exist (with {_env_text(env)})", r.span))
        if r.sub is not None:
            kind, a_e, b_e, lim_e = r.sub
            if kind == "chunk":
                c = _ev(a_e, env, r.span, "a chunk index")
                k = _ev(b_e, env, r.span, "the number of chunks")
                if not 0 <= c < k:
                    raise StrataError(error(Codes.SHAPE, f"chunk {c} of part {index} of {r.buffer} "
                                            f"split into {k} chunks does not exist (with "
                                            f"{_env_text(env)})", r.span))
            else:
                a = _ev(a_e, env, r.span, "a range bound")
                b = _ev(b_e, env, r.span, "a range bound")
                lim = _ev(lim_e, env, r.span, "a part's length")
                if not 0 <= a <= b <= lim:
                    raise StrataError(error(Codes.SHAPE, f"[{a}:{b}] is outside part {index} of "
                                            f"{r.buffer}, which has {lim} elements (with "
                                            f"{_env_text(env)})", r.span))
        size = self.buffer_sizes[r.buffer]
        if n < 0 or lo < 0 or lo + n > size:
            raise StrataError(error(Codes.SHAPE, f"{r.buffer}[{lo}:{lo + n}] is outside {r.buffer}, "
                                    f"which has {size} elements (with {_env_text(env)})", r.span))
        return owner, r.buffer, lo, lo + n

    def moves(self, op, env: dict, ev: Event) -> None:
        if isinstance(op, ir.Loop):
            for v in self.values(op, env):
                self.grow(op.span, ev.index)
                inner = dict(env)
                inner[op.var] = v
                for o in op.body:
                    self.moves(o, inner, ev)
            return
        if isinstance(op, ir.If):
            for o in (op.then if _truth(op.cond, env, op.span) else op.orelse):
                self.moves(o, env, ev)
            return
        self.instance += 1
        if isinstance(op, ir.Route):
            ev.routes.append(self.route(op, env))
            return
        dst = self.region(op.dst, env)
        if not isinstance(op, ir.Reduce):   # a copy, an accumulate, a reduction of named regions
            srcs = tuple(self.region(r, env) for r in ir.sources(op))
            red = None if isinstance(op, ir.Copy) else op.op
        else:
            srcs = []
            for v in self.reduce_domain(op, env):
                inner = dict(env)
                inner[op.var] = v
                srcs.append(self.region(op.src, inner))
            srcs = tuple(srcs)
            red = op.op
        for src in srcs:
            if src[3] - src[2] != dst[3] - dst[2]:
                raise StrataError(error(
                    Codes.SHAPE, f"this moves {src[3] - src[2]} elements ({src[1]}[{src[2]}:{src[3]}]"
                    f"@{src[0]}) into {dst[3] - dst[2]} ({dst[1]}[{dst[2]}:{dst[3]}]@{dst[0]}) with "
                    f"{_env_text(env)}", op.span))
        acc = isinstance(op, ir.Accumulate)
        self.sources += len(srcs)
        ev.moves.append(Move(dst, srcs, red, op.span, accumulate=acc))
        for src in srcs:
            if src[3] > src[2]:
                ev.accesses.append(Access(src[0], src[1], src[2], src[3], False, self.instance, op.span))
        if dst[3] > dst[2]:
            ev.accesses.append(Access(dst[0], dst[1], dst[2], dst[3], True, self.instance, op.span,
                                      accumulate=op.op.value if acc else None))



    def route(self, op: ir.Route, env: dict) -> RouteInst:
        K = ir.RouteKind
        dst = self.region(op.dst, env)
        role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
        world, rank = self.world, env["rank"]

        def fail(msg: str):
            raise StrataError(error(Codes.SHAPE, f"{op.kind.value}: {msg} (with {_env_text(env)})",
                                    op.span))

        def experts_of(n: int) -> int:
            if n % world:
                fail(f"{n} experts do not divide over {world} ranks: the number of experts must be a "
                     "multiple of the world size")
            return n
        if op.kind is K.HISTOGRAM:
            return RouteInst(op.kind, rank, dst, role, dst[3] - dst[2], op.span)
        if op.kind in (K.EXSCAN, K.SLOTS):
            e = experts_of(dst[3] - dst[2])
            cap, region = 0, None
            if op.kind is K.EXSCAN and self.buffer_sizes[role["counts"]] != world * e:
                fail(f"{role['counts']} must hold world x {e} counts (one row per source rank), it has "
                     f"{self.buffer_sizes[role['counts']]}")
            if op.kind is K.SLOTS:
                cap = _ev(op.capacity, env, op.span, "the capacity")
                if cap < 0:
                    fail(f"the capacity is {cap}")
            elif op.capacity is not None:
                region = _ev(op.capacity, env, op.span, "an expert's rows")
                if region < 0:
                    fail(f"an expert's region has {region} rows")
            return RouteInst(op.kind, rank, dst, role, e, op.span, capacity=cap, region=region)
        rows_buf = role["x"] if op.kind is K.PLACE else role["win"]
        tokens, topk = (self.shapes[role["ids"]] + (1,))[:2]   # ids [tokens, topk] or [tokens]
        e = experts_of(self.buffer_sizes[role["offs"]])
        hidden = self.shapes[rows_buf][1]
        win = op.dst.buffer if op.kind is K.PLACE else role["win"]
        mine = role["x"] if op.kind is K.PLACE else op.dst.buffer
        if self.shapes[mine][0] != tokens:
            fail(f"{mine} has {self.shapes[mine][0]} rows but {role['ids']} routes {tokens} tokens")
        if op.kind is K.GATHER and self.buffer_sizes[role["weights"]] != tokens * topk:
            fail(f"{role['weights']} must hold {tokens} x {topk} weights, one per entry of {role['ids']}")
        return RouteInst(op.kind, rank, dst, role, e, op.span, tokens=tokens, topk=topk, hidden=hidden,
                         rows=self.shapes[win][0])
