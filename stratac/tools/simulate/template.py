"""The walk of the IR, once per schedule and world. In: a schedule after the passes, a world and
the values of its size symbols and rank parameters. Out: a Template (every move of every rank with
its owners and a symbolic length, every routing construct with its shape, each rank's timeline of
stages, barriers, signals and waits) and, per size, the lengths of its moves.

Instantiation cost stays bounded at large worlds: the walk mirrors stratac.ir.instantiate but
keeps no element intervals or accesses, and each size only evaluates the distinct length
expressions. tests/simulate/test_template.py checks the template against instantiate on every
example.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from stratac import ir
from stratac.ir import control, lockstep
from stratac.tools.simulate.machine import SimulateError

# a move's kind as a small int, so that a stage's moves become numpy arrays (StageMoves.arrays)
COPY, ACCUMULATE, REDUCE = 0, 1, 2
# whether a reduction over a set of ranks (every rank, every peer, a team's members) holds its
# sources as one set, and a loop of copies inside a stage is one entry (a run; StageMoves.count)
# (False: every move and source listed; tests/simulate/test_predict.py compares the two)
HOLD_EVERY = True
# a set of ranks an entry reads from or writes to, held instead of listed (StageMoves.src_set,
# dst_set): the ranks start, start + step, ..., start + (size - 1) * step but `skip` (-1: none),
# in that order; size 0: not a set (the ranks are listed)
LISTED = (0, 0, 0, -1)


class Held(NamedTuple):
    """A set of ranks or flag slots held in a timeline's signal or wait instead of listed (a
    loop over the peers of `signal done[rank]@p`, of `wait done[p]`): as StageMoves' sets."""

    start: int
    step: int
    size: int
    skip: int

    def members(self) -> list[int]:
        return members(self)


@dataclass
class StageMoves:
    """The moves of one stage over every rank that runs it, in rank order then program order."""

    stage: ir.Stage
    issuer: list[int] = field(default_factory=list)
    key: list[int] = field(default_factory=list)       # index of the length in Template.keys
    kind: list[int] = field(default_factory=list)      # COPY, ACCUMULATE, REDUCE
    dst: list[int] = field(default_factory=list)       # owner of the destination (-1: dst_set)
    nsrc: list[int] = field(default_factory=list)
    # a reduction whose source is `x@p for p in ranks` (peers, a team's ranks or peers) reads one
    # region of every rank of a set: its sources are that set (src_set), not listed (at world
    # 8,192 a one-shot AllReduce's W sources per rank would be 67 M entries)
    src_set: list[tuple[int, int, int, int]] = field(default_factory=list)
    # a loop inside the stage of one copy whose length does not depend on its variable, written to
    # and read from the issuer, a fixed rank or a rank of the form b + a * var (the variable's rank,
    # a team's member), is one entry standing for `count` moves of that length, in the loop's
    # order: a run. Written to the variable's ranks, its destinations are that set (dst_set); read
    # from them, its sources (src_set, as a reduction's). Else count is 1 and dst_set LISTED.
    count: list[int] = field(default_factory=list)
    dst_set: list[tuple[int, int, int, int]] = field(default_factory=list)
    src_move: list[int] = field(default_factory=list)  # one entry per listed source: its move
    src_owner: list[int] = field(default_factory=list)
    scale: list[int] = field(default_factory=list)     # bytes of the destination's element type
                                                       # (0: the schedule's T)
    phase: dict[int, int] = field(default_factory=dict)   # rank -> the barrier place before the stage
    arrays: dict = field(default_factory=dict)
    routes: list[tuple[int, ir.RouteKind, dict]] = field(default_factory=list)   # issuer, kind, shape


@dataclass
class Template:
    world: int
    keys: list[tuple[ir.IExpr, dict]]     # a length expression and its values of non-size names
    stages: dict                          # per stage INSTANCE: a stage outside step loops, keyed
                                          # by its index; (index, n): one step of the loops around it
    timelines: list[list[tuple]]          # per rank: ("stage", instance) | ("barrier", (place,
                                          # members or None: every rank)) | ("signal", [(owner,
                                          # flag, (slot, round), share)]) | ("wait", [(flag,
                                          # (slot, round))]) | ("await", None); an owner or a slot
                                          # may be a Held set (listed_timeline expands them);
                                          # share: None (core 0 issues it) or the tag of the
                                          # loop whose trips the cores share (ir.control)
    size_dependent: bool                  # a condition, rank or flag slot depends on a size symbol
    fused: bool = False                   # the first barrier is the agreement's (leads_with_barrier)

    def moves(self, stage_index, lengths: np.ndarray) -> list[tuple]:
        """(issuer, kind, dst owner, src owners, length) of every move of a stage instance, for the
        consistency test."""
        sm = self.stages[stage_index]
        srcs: dict[int, list[int]] = {}
        for mv, owner in zip(sm.src_move, sm.src_owner):
            srcs.setdefault(mv, []).append(owner)
        out = []
        for i in range(len(sm.issuer)):
            r, length = sm.issuer[i], int(lengths[sm.key[i]])
            src_set, dst_set, count = sm.src_set[i], sm.dst_set[i], sm.count[i]
            if count == 1 and dst_set == LISTED:                   # one move
                src = members(src_set) if src_set != LISTED else srcs.get(i, [])
                out.append((r, sm.kind[i], sm.dst[i], tuple(src), length))
                continue
            # a run: its k-th move goes to (comes from) the k-th member of its set
            dsts = members(dst_set) if dst_set != LISTED else [sm.dst[i]] * count
            src_of = [(p,) for p in members(src_set)] if src_set != LISTED else \
                [tuple(srcs.get(i, ()))] * count
            assert len(dsts) == len(src_of) == count
            out.extend((r, sm.kind[i], d, src, length) for d, src in zip(dsts, src_of))
        return out

    def listed_timeline(self, rank: int) -> list[tuple]:
        """The rank's timeline with every Held set of a signal or wait listed, member by member,
        for the consistency test."""
        out = []
        for kind, arg in self.timelines[rank]:
            if kind == "signal":
                arg = [(o, f, slot) for owner, f, slot, _ in arg
                       for o in (owner.members() if isinstance(owner, Held) else [owner])]
            elif kind == "wait":
                arg = [(f, (i, rnd)) for f, (index, rnd) in arg
                       for i in (index.members() if isinstance(index, Held) else [index])]
            out.append((kind, arg))
        return out

    def routes(self, stage_index) -> list[tuple]:
        """(issuer, kind, shape) of every routing construct of a stage, for the consistency test."""
        return [(r, k, dict(shape)) for r, k, shape in self.stages[stage_index].routes]


def members(ranks: tuple[int, int, int, int]) -> list[int]:
    """The ranks of a held set (StageMoves.src_set, dst_set), in order."""
    start, step, size, skip = ranks
    return [start + i * step for i in range(size) if start + i * step != skip]


def count(ranks) -> int:
    """How many ranks a held set has (its skipped rank is one of its progression's)."""
    return ranks[2] - (ranks[3] >= 0)


def holds(ranks, r):
    """Whether rank r is one of a held set's; `ranks`' four fields (start, step, size, skip) and r
    may each be an int or an array (one set, or one rank, per entry)."""
    start, step, size, skip = ranks
    off = r - np.asarray(start)
    step = np.maximum(np.asarray(step), 1)
    return (off >= 0) & (off % step == 0) & (off // step < np.asarray(size)) & (r != np.asarray(skip))


class _Walker:
    """Mirrors stratac.ir.instantiate's walk of the IR (program order, loop domains, merged signals
    and waits), keeping only owners and length expressions."""

    def __init__(self, s: ir.Schedule, world: int, env: dict):
        self.s, self.world, self.base = s, world, {"world": world, **env}
        self.size_syms = frozenset((*s.sizes, ir.ELEM))   # what varies from one prediction to the next
        self.keys: list[tuple[ir.IExpr, dict]] = []
        self.key_index: dict[tuple, int] = {}
        self.names: dict[int, tuple[ir.IExpr, tuple[str, ...]]] = {}
        self.stages: dict[int, StageMoves] = {}
        # (stage index, the values of the step loops around it) -> its key in self.stages: each
        # execution of a stage inside a step loop is its own instance, with only that step's moves,
        # keyed (stage index, n); ranks at the same step share one (their loads add up in the same
        # phase either way). A stage outside step loops has one instance, keyed by its index.
        self.instances: dict[tuple, tuple[int, int]] = {}
        self.size_dependent = False
        self.steering: dict[int, ir.IExpr] = {}
        self.forms: dict[int, tuple] = {}     # id of a rank expression -> (it, ir.affine in its var)
        self.stretched: dict[tuple, tuple] = {}   # a run's length -> (it, its stretches: Walker.stretches)
        self.barriers: dict[int, tuple] = {}      # id of an op -> (it, whether a barrier is inside)
        self.shared = control.shared_loops(s)     # loops whose trips the rank's cores share
        self.shares = itertools.count()           # one tag per execution of such a loop

    def ev(self, e: ir.IExpr, env: dict, what: str) -> int:
        seen = self.steering.get(id(e))
        if seen is None or seen is not e:
            self.steering[id(e)] = e      # kept alive, so its id is not reused
            if e.names() & self.size_syms:
                self.size_dependent = True
        try:
            return e.eval(env)
        except ZeroDivisionError:
            raise SimulateError(f"division by zero evaluating {what} ({e}) at world {self.world}; "
                                "run `stratac check` on the file") from None
        except IndexError as exc:   # an array's element outside it
            raise SimulateError(f"{exc} evaluating {what} ({e}) at world {self.world}; run "
                                "`stratac check` on the file") from None

    def local(self, op: "ir.Local | ir.Set", env: dict):
        """The value a var declaration or a `set` gives its name: an integer or an array's
        elements (a tuple), as ir.instantiate.local_value gives it."""
        value = self.ev(op.value, env, f"the value of {op.name}")
        if isinstance(op, ir.Local) and op.size is not None:
            k = self.ev(op.size, env, f"the size of array {op.name}")
            if not 0 <= k <= ir.ARRAY_CAPACITY:
                raise SimulateError(f"array {op.name} would hold {k} integers at world {self.world} "
                                    f"({op.span}); run `stratac check` on the file")
            return (value,) * k
        if isinstance(op, ir.Set) and op.index is not None:
            old = env[op.name]
            i = self.ev(op.index, env, f"the index of {op.name}")
            if not 0 <= i < len(old):
                raise SimulateError(f"`set {op.name}[{i}]` is outside {op.name}'s {len(old)} elements "
                                    f"at world {self.world} ({op.span}); run `stratac "
                                    "check` on the file")
            return old[:i] + (value,) + old[i + 1:]
        return value

    def owner(self, r: ir.Region, env: dict) -> int:
        o = env["rank"] if r.rank is None else self.ev(r.rank, env, "a rank")
        if not 0 <= o < self.world:
            raise SimulateError(f"rank {o} does not exist in a world of {self.world} "
                                f"({r.span}); run `stratac check` on the file")
        return o

    def length_key(self, e: ir.IExpr, env: dict) -> int:
        hit = self.names.get(id(e))
        if hit is None or hit[0] is not e:
            hit = (e, tuple(sorted(e.names() - self.size_syms)))
            self.names[id(e)] = hit
        fixed = tuple(env[n] for n in hit[1])
        k = (id(e), fixed)
        i = self.key_index.get(k)
        if i is None:
            i = self.key_index[k] = len(self.keys)
            self.keys.append((e, dict(zip(hit[1], fixed))))
        return i

    def domain(self, d: ir.Domain, rank: int) -> list[int]:
        return [p for p in range(self.world) if d is ir.Domain.RANKS or p != rank]

    def values(self, loop: ir.Loop, env: dict):
        """The values a loop's variable takes on this rank: the ranks or peers, or a step range
        (the verifier has refused a range that starts below 0)."""
        if loop.domain is not ir.Domain.RANGE:
            return self.domain(loop.domain, env["rank"])
        return range(self.ev(loop.lo, env, "the loop's first value"), self.ev(loop.hi, env, "the loop's end"))

    def timeline(self, rank: int) -> list[tuple]:
        env = dict(self.base, rank=rank)
        events: list[tuple] = []
        place = 0      # the barrier places before this point (the kernel's stamp rule), its phase
        share = None   # inside a loop whose trips the cores share: its tag

        def add(kind, item):
            if kind == "signal":
                item = (*item, share)
            if events and events[-1][0] == kind:
                events[-1][1].append(item)
            else:
                events.append((kind, [item]))

        def sync(op, env):
            if isinstance(op, ir.Loop):
                held = self.held_sync(op, env) if HOLD_EVERY else None
                if held is not None:
                    for item in held[1]:
                        add(held[0], item)
                    return
                for v in self.values(op, env):
                    for o in op.body:
                        sync(o, {**env, op.var: v})
                return
            # a slot and its round: a reused slot (a flag with rounds) is met round by round
            slot = (self.ev(op.index, env, f"the index of flag {op.flag}"),
                    self.ev(op.round, env, f"the round of flag {op.flag}"))
            if isinstance(op, ir.Signal):
                add("signal", (self.ev(op.rank, env, "the signalled rank"), op.flag, slot))
            else:
                add("wait", (op.flag, slot))

        def top(ops, env, steps):
            nonlocal place, share
            for op in ops:
                if isinstance(op, ir.Barrier):
                    place += 1
                    members = None
                    if op.team is not None:
                        base = self.ev(op.team.base, env, "the team's first rank")
                        step = self.ev(op.team.step, env, "the team's stride")
                        members = tuple(base + i * step for i in range(self.ev(op.team.size, env,
                                                                                "the team's size")))
                    events.append(("barrier", (place, members)))
                elif isinstance(op, ir.Stage):
                    key = op.index if not steps else self.instances.setdefault(
                        (op.index, steps), (op.index, len(self.instances)))
                    sm = self.stages.setdefault(key, StageMoves(op))
                    sm.phase[rank] = place
                    for inner in op.body:
                        self.moves(inner, env, sm)
                    events.append(("stage", key))
                elif isinstance(op, ir.If):
                    start = place
                    top(op.then if self.ev(op.cond, env, "a condition") else op.orelse, env, steps)
                    place = start + max(places(op.then, env), places(op.orelse, env))
                elif isinstance(op, ir.Loop):   # a loop around stages and sync (step loops)
                    if id(op) in self.shared:
                        share = next(self.shares)
                    held = self.held_sync(op, env) if HOLD_EVERY else None
                    if held is not None:        # a loop of one signal or wait, held
                        for item in held[1]:
                            add(held[0], item)
                    else:
                        for v in self.values(op, env):
                            env[op.var] = v     # in place: a var set in the body outlives the step
                            top(op.body, env, steps + ((id(op), v),))
                        env.pop(op.var, None)
                    if id(op) in self.shared:
                        share = None
                elif isinstance(op, (ir.Local, ir.Set)):
                    if isinstance(op, ir.Set) or not op.inline:   # a let's name: the kernel's alone
                        env[op.name] = self.local(op, env)
                elif isinstance(op, ir.Await):
                    # a posted stage is a "stage" item whose StageMoves.stage has a handle; the
                    # critical path overlaps it with what follows, up to its rank's next quiet
                    events.append(("await", None))
                else:
                    sync(op, env)

        def places(ops, env) -> int:
            """The barrier places ops take: one a barrier, an if its longer arm's, a loop its
            iterations'."""
            n = 0
            for op in ops:
                if isinstance(op, ir.Barrier):
                    n += 1
                elif not self.has_barrier(op):     # (NHR's arm of block-by-block loops: none)
                    continue
                elif isinstance(op, ir.If):
                    n += max(places(op.then, env), places(op.orelse, env))
                elif isinstance(op, ir.Loop) and op.domain is ir.Domain.RANGE:
                    n += sum(places(op.body, {**env, op.var: v}) for v in self.values(op, env))
            return n

        top(self.s.body, env, ())
        return events

    def has_barrier(self, op) -> bool:
        """Whether a barrier is inside op (an if's arms, a loop's body), once per op."""
        hit = self.barriers.get(id(op))
        if hit is None or hit[0] is not op:
            if isinstance(op, ir.Barrier):
                inside = True
            elif isinstance(op, ir.If):
                inside = any(self.has_barrier(o) for o in op.then + op.orelse)
            elif isinstance(op, ir.Loop):
                inside = any(self.has_barrier(o) for o in op.body)
            else:
                inside = False
            hit = self.barriers[id(op)] = (op, inside)
        return hit[1]

    def moves(self, op, env: dict, sm: StageMoves) -> None:
        if isinstance(op, ir.Loop):
            if HOLD_EVERY and self.run(op, env, sm):
                return
            for v in self.values(op, env):
                for o in op.body:
                    self.moves(o, {**env, op.var: v}, sm)
            return
        if isinstance(op, ir.If):
            for o in (op.then if self.ev(op.cond, env, "a condition") else op.orelse):
                self.moves(o, env, sm)
            return
        if isinstance(op, ir.Route):
            self.size_dependent = True      # its shape is read at these sizes (route_shape)
            sm.routes.append((env["rank"], op.kind, route_shape(self.s, op, env)))
            return
        i = len(sm.issuer)
        sm.issuer.append(env["rank"])
        sm.key.append(self.length_key(op.dst.length, env))
        sm.dst.append(self.owner(op.dst, env))
        sm.count.append(1)
        sm.dst_set.append(LISTED)
        dtype = self.s.param(op.dst.buffer).dtype
        sm.scale.append(dtype.nbytes if dtype is not None else 0)
        if isinstance(op, ir.Reduce):
            sm.kind.append(REDUCE)
            if op.count is None:     # the ranks, or the peers
                lo, hi, skip = 0, self.world, env["rank"] if op.domain is ir.Domain.PEERS else None
            else:   # a team's places (the verifier has checked the team divides the world)
                lo, hi = 0, self.ev(op.count, env, "the team's size")
                skip = self.ev(op.skip, env, "the team's rank") if op.domain is ir.Domain.PEERS else None
            held = self.progression(op.src.rank, op.var, lo, hi, skip, env) if HOLD_EVERY else None
            if held is not None:
                sm.src_set.append(held)
                sm.nsrc.append(count(held))
                return
            values = [v for v in range(lo, hi) if v != skip]
            srcs = [self.owner(op.src, {**env, op.var: v}) for v in values]
        elif isinstance(op, ir.ReduceList):
            sm.kind.append(REDUCE)
            srcs = [self.owner(r, env) for r in op.srcs]
        else:
            sm.kind.append(ACCUMULATE if isinstance(op, ir.Accumulate) else COPY)
            srcs = [self.owner(op.src, env)]
        sm.nsrc.append(len(srcs))
        sm.src_set.append(LISTED)
        sm.src_move.extend([i] * len(srcs))
        sm.src_owner.extend(srcs)

    def held_sync(self, loop: ir.Loop, env: dict) -> tuple[str, list] | None:
        """A loop of one signal (wait) whose signalled ranks (slots) are a progression in its
        variable or a rotation of one (a step loop's `(rank + i) % world`: Walker.pieces), its slot
        and round (round) not naming it, as timeline items with Held sets, in the loop's order:
        ("signal", [(Held owners, flag, (slot, round)), ...]) or ("wait", [(flag, (Held slots,
        round)), ...]); None where the loop is not of that form."""
        if len(loop.body) != 1 or not isinstance(loop.body[0], (ir.Signal, ir.Wait)):
            return None
        op, var = loop.body[0], loop.var
        lo, hi, skip = self.trips(loop, env)
        if var in op.round.names():
            return None
        if isinstance(op, ir.Signal) and var in op.index.names():
            return None
        kind = "signal" if isinstance(op, ir.Signal) else "wait"
        if hi <= lo:
            return kind, []
        rnd = self.ev(op.round, env, f"the round of flag {op.flag}")
        if kind == "signal":
            owners = self.pieces(op.rank, var, lo, hi, skip, env)
            if owners is None:
                return None
            owners = [o for o in owners if count(o) > 0]     # (a peers loop at world 1)
            index = self.ev(op.index, env, f"the index of flag {op.flag}")
            return kind, [(Held(*o), op.flag, (index, rnd)) for o in owners]
        slots = self.pieces(op.index, var, lo, hi, skip, env, ranks=False)
        if slots is None:
            return None
        slots = [x for x in slots if count(x) > 0]
        return kind, [(op.flag, (Held(*x), rnd)) for x in slots]

    def pieces(self, e: ir.IExpr, var: str, lo: int, hi: int, skip: int | None, env: dict,
               ranks: bool = True) -> list[tuple[int, int, int, int]] | None:
        """The values of e as var takes lo .. hi - 1 but skip, as held sets in that order: one
        progression (Walker.progression), or for a rotation `(b + var) % M` the stretches where it
        rises by one (at most 4; `(rank + i) % world` over i in 1 .. world is two)."""
        if not (isinstance(e, ir.Bin) and e.kind is ir.BinKind.MOD and var in e.lhs.names()
                and var not in e.rhs.names()):
            one = self.progression(e, var, lo, hi, skip, env, ranks)
            return None if one is None else [one]
        form = self.form(e.lhs, var)
        if form is None or self.ev(form[1], env, "a rank") != 1:
            return None
        b, M = self.ev(form[0], env, "a rank"), self.ev(e.rhs, env, "a modulus")
        if M < 1:
            return None
        out, i = [], lo
        while i < hi:
            v = (b + i) % M
            n = min(hi - i, M - v)
            if len(out) == 4 or (ranks and v + n > self.world):
                return None
            out.append((v, 1, n, (b + skip) % M if skip is not None and i <= skip < i + n else -1))
            i += n
        return out

    def form(self, e: ir.IExpr, var: str):
        """ir.affine(e, var), once per expression."""
        hit = self.forms.get(id(e))
        if hit is None or hit[0] is not e:
            hit = self.forms[id(e)] = (e, ir.affine(e, var))
        return hit[1]

    def trips(self, loop: ir.Loop, env: dict) -> tuple[int, int, int | None]:
        """lo, hi and the value left out (the running rank for `peers`) of a loop's variable."""
        if loop.domain is ir.Domain.RANGE:
            return (self.ev(loop.lo, env, "the loop's first value"),
                    self.ev(loop.hi, env, "the loop's end"), None)
        return 0, self.world, env["rank"] if loop.domain is ir.Domain.PEERS else None

    def progression(self, rank: ir.IExpr | None, var: str, lo: int, hi: int, skip: int | None,
                    env: dict, ranks: bool = True) -> tuple[int, int, int, int] | None:
        """The ranks `rank` names as var takes lo .. hi - 1 but skip, as a held set, when rank is
        b + a * var with a >= 1 (the variable's rank, a team's member) and every one is a rank of
        the world (not ranks: flag slots, none negative); else None (the moves are listed, and a
        rank outside the world is named)."""
        if rank is None or var not in rank.names():
            return None
        form = self.form(rank, var)
        if form is None:
            return None
        b = self.ev(form[0], env, "a rank")
        a = self.ev(form[1], env, "a rank")
        size = hi - lo
        if a < 1 or size < 1 or b + a * lo < 0 or (ranks and b + a * (hi - 1) >= self.world):
            return None
        held = skip is not None and lo <= skip < hi
        return (b + a * lo, a, size, b + a * skip if held else -1)

    def run(self, loop: ir.Loop, env: dict, sm: StageMoves) -> bool:
        """Records an in-stage loop as runs (StageMoves.count) when it is one: its body one copy or
        accumulate, possibly under `if var != X` (a team's peers), whose ranks are the issuer, a
        rank that does not name the variable, or a progression in it (Walker.progression). One run
        per stretch of the variable's values where the copy's length is the same (a split's first
        n % parts parts are one element longer), split where the `if` leaves a value out."""
        if len(loop.body) != 1:
            return False
        op, var = loop.body[0], loop.var
        lo, hi, skip = self.trips(loop, env)
        left_out = None
        if isinstance(op, ir.If):     # `for p in team.peers`: if p != team.rank
            c = op.cond
            if op.orelse or len(op.then) != 1 or not (
                    isinstance(c, ir.Bin) and c.kind is ir.BinKind.NE and c.lhs == ir.Var(var)
                    and var not in c.rhs.names()):
                return False
            left_out, op = self.ev(c.rhs, env, "a condition"), op.then[0]
        if type(op) not in (ir.Copy, ir.Accumulate):
            return False
        if hi <= lo:
            return True                    # no moves
        stretches = self.stretches(op.dst.length, var, lo, hi, env)
        if stretches is None:
            return False
        if left_out is not None:
            stretches = [part for a, b in stretches
                         for part in ((a, min(b, left_out)), (max(a, left_out + 1), b)) if part[0] < part[1]]
        held = []
        for a, b in stretches:
            sets = []
            for region in (op.dst, op.src):
                if region.rank is None or var not in region.rank.names():
                    sets.append(LISTED)
                    continue
                ranks = self.progression(region.rank, var, a, b, skip, env)
                if ranks is None:
                    return False
                sets.append(ranks)
            count = (b - a) - (skip is not None and a <= skip < b)
            if count > 0:
                held.append((a, sets, count))
        dtype = self.s.param(op.dst.buffer).dtype
        for a, sets, count in held:
            i = len(sm.issuer)
            at = {**env, var: a}       # the stretch's length (the same at each of its values)
            sm.issuer.append(env["rank"])
            sm.key.append(self.length_key(op.dst.length, at))
            sm.dst.append(self.owner(op.dst, env) if sets[0] == LISTED else -1)
            sm.count.append(count)
            sm.dst_set.append(sets[0])
            sm.scale.append(dtype.nbytes if dtype is not None else 0)
            sm.kind.append(ACCUMULATE if isinstance(op, ir.Accumulate) else COPY)
            sm.nsrc.append(1)
            sm.src_set.append(sets[1])
            if sets[1] == LISTED:
                sm.src_move.append(i)
                sm.src_owner.append(self.owner(op.src, env))
        return True

    def stretches(self, length: ir.IExpr, var: str, lo: int, hi: int,
                  env: dict) -> list[tuple[int, int]] | None:
        """The stretches [a, b) of lo .. hi - 1 where `length` is the same at every value of var;
        None where it cannot be evaluated as one array (the moves are listed then, and a length the
        walk refuses is named)."""
        if var not in length.names():
            return [(lo, hi)]
        names = sorted(length.names() - {var})
        key = (id(length), lo, hi, tuple(env.get(n) for n in names))
        hit = self.stretched.get(key)
        if hit is not None and hit[0] is length:
            return hit[1]
        if length.names() & self.size_syms:
            self.size_dependent = True     # where the stretches end depends on the sizes
        values = lockstep.over(length, env, var, np.arange(lo, hi, dtype=np.int64))
        if values is None:
            return None
        ends = np.flatnonzero(values[1:] != values[:-1]) + 1
        bounds = [lo, *(lo + ends).tolist(), hi]
        out = list(itertools.pairwise(bounds))
        self.stretched[key] = (length, out)
        return out


def route_shape(s: ir.Schedule, op: ir.Route, env: dict) -> dict:
    """What the cost of a routing construct depends on besides the ids, at these sizes (as
    stratac.ir.instantiate reads it): tokens, topk and hidden of place/gather, the experts (the
    offsets' length), the number of ids a histogram counts, and which buffer holds the ids."""
    K = ir.RouteKind
    role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
    full = {"world": env["world"], **env}

    def ev(e: ir.IExpr) -> int:
        try:
            return e.eval(full)
        except ZeroDivisionError:
            raise SimulateError(f"division by zero evaluating {e} ({op.span}); run "
                                "`stratac check` on the file") from None

    dims = lambda name: [ev(d) for d in s.param(name).dims]
    if op.kind is K.HISTOGRAM:
        return {"ids": role["ids"], "n": ev(s.param(role["ids"]).size), "experts": ev(op.dst.length)}
    sampled = s.contract.kind.moe and role.get("ids") == s.contract.inputs[1]
    if op.kind in (K.EXSCAN, K.SLOTS):
        return {"experts": ev(op.dst.length)}
    tokens, topk = (dims(role["ids"]) + [1])[:2]      # ids [tokens, topk], or [tokens] (AllToAllV)
    win = op.dst.buffer if op.kind is K.PLACE else role["win"]
    fixed = s.param(win).dtype   # rows of a fixed type (an int8 dispatch's rows and f32 scales)
    return {"ids": role["ids"], "tokens": tokens, "topk": topk, "hidden": dims(win)[1],
            "experts": ev(s.param(role["offs"]).size), "sampled": sampled,
            "row_bytes": dims(win)[1] * fixed.nbytes if fixed is not None else None,
            "joined": op.joined}   # a place made in the pass of the one before it: no scan of its own


def _routes(ops) -> bool:
    for op in ops:
        if isinstance(op, ir.Route):
            return True
        if isinstance(op, (ir.Stage, ir.Loop)) and _routes(op.body):
            return True
        if isinstance(op, ir.If) and _routes(op.then + op.orelse):
            return True
    return False


def not_modelled(s: ir.Schedule) -> str | None:
    """Why the model cannot predict this schedule, or None. MoE and AllToAllV schedules are
    modelled on a sample routing; routing constructs outside such a contract have no ids to sample."""
    divisor = next((x for x in s.int_params if x.kind is ir.ScalarKind.DIVISOR), None)
    if divisor is not None:
        return (f"it takes a divisor parameter ({divisor.name}), which the model cannot be given yet "
                f"(`stratac run --param {divisor.name}=D` runs it)")
    if _routes(s.body) and not s.contract.kind.moe:
        return ("its routing constructs move data that depends on ids, and only a MoE or AllToAllV "
                "contract says which buffer holds ids the model can sample")
    return None


# From this world on, a template is first estimated from three ranks (_probe) and refused when it
# would hold more than MAX_ENTRIES timeline entries, flag slots of signals and waits, moves and
# listed move sources over all ranks (about 500 bytes each: some 4 GiB; two-shot at world 2,048
# held 4.2 M and took 24 s before its loops of copies and its reduction were held as one entry).
PROBE_FROM = 64
MAX_ENTRIES = 8_000_000


def _probe(s: ir.Schedule, world: int, env: dict) -> None:
    w = _Walker(s, world, env)
    most = 0
    for r in {0, world // 2, world - 1}:
        before = sum(len(sm.issuer) + len(sm.src_owner) for sm in w.stages.values())
        # a signal or wait entry holds a slot per flag it names (a loop over the peers: world)
        n = sum(len(arg) if kind in ("signal", "wait") else 1 for kind, arg in w.timeline(r))
        after = sum(len(sm.issuer) + len(sm.src_owner) for sm in w.stages.values())
        most = max(most, n + after - before)
    if most * world > MAX_ENTRIES:
        raise SimulateError(f"{s.name} at world {world:,} would hold about {most * world:,} timeline "
                            f"entries, flag slots, moves and sources ({most:,} on a rank), more than "
                            f"the {MAX_ENTRIES:,} the model holds: its walk of every rank's moves and "
                            "flags grows with the world's square; predict it at a smaller world")


def template(s: ir.Schedule, world: int, env: dict) -> Template:
    """env: every size symbol and rank parameter (the values instantiate takes as `sizes`)."""
    unmet = ir.unmet_requirement(s, world)
    if unmet is not None:
        raise SimulateError(f"{s.name} does not support world {world}: it {unmet}")
    if world > PROBE_FROM:
        _probe(s, world, env)
    w = _Walker(s, world, env)
    timelines = [w.timeline(r) for r in range(world)]
    for sm in w.stages.values():
        sm.arrays = {k: np.asarray(getattr(sm, k), dtype=np.int64)
                     for k in ("issuer", "key", "kind", "dst", "nsrc", "count", "src_move", "src_owner",
                               "scale")}
        for k in ("src_set", "dst_set"):      # (entries, 4): start, step, size, skip
            sm.arrays[k] = np.asarray(getattr(sm, k), dtype=np.int64).reshape(-1, 4)
    return Template(world, w.keys, w.stages, timelines, w.size_dependent, s.leads_with_barrier)


def lengths(t: Template, env: dict) -> np.ndarray:
    """Elements of every length expression of the template at these sizes: the keys of one
    expression as one array (their fixed names' values side by side), each key on its own where
    the array evaluation gives up (the error is then named)."""
    out = np.empty(len(t.keys), dtype=np.int64)
    groups: dict[int, list[int]] = {}
    for i, (e, _) in enumerate(t.keys):
        groups.setdefault(id(e), []).append(i)
    base = {"world": t.world, **env}
    for idx in groups.values():
        e, fixed = t.keys[idx[0]]
        values = None
        if len(idx) > 1 and not any(type(v) is tuple for v in fixed.values()):  # no array
            names = {n: np.fromiter((t.keys[i][1][n] for i in idx), dtype=np.int64, count=len(idx))
                     for n in fixed}
            values = lockstep.evaluate(e, {**base, **names}, len(idx))
        if values is None or (values < 0).any():
            values = [_length(e, {**base, **t.keys[i][1]}, env) for i in idx]
        out[idx] = values
    return out


def _length(e: ir.IExpr, full: dict, env: dict) -> int:
    try:
        n = e.eval(full)
    except ZeroDivisionError:
        raise SimulateError(f"division by zero evaluating a length ({e}); run `stratac check` "
                            "on the file") from None
    if n < 0:
        raise SimulateError(f"a move of {n} elements ({e} with {env}); run `stratac check` on "
                            "the file")
    return n
