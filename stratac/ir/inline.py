"""Composition: a schedule's body inlined into a caller (`call callee(args) on team`).

In: the callee's IR (before the passes), the team (None: every rank), the caller's regions bound to
the callee's buffer parameters, the operations bound to its redop parameters, the places (integer
expressions of the caller) bound to its rank parameters, a name prefix.
Out: the caller's ops and flags. The callee's integers live in the team's places: its `rank` is
the team's rank, its `world` the team's size, its loop variables are places; a place becomes a
rank where the callee names one (after @, in a signal) through the team's member(place). Its size
symbols are the lengths of the bound regions, its offsets are added to theirs. Its flags, loop
variables and asynchronous handles are renamed with the prefix, its barriers join the team.
Its scratch buffers become the caller's, renamed with the prefix and sized in the caller's terms.
Its teams become the caller's (renamed) in a call on world. Its sizeof(T) becomes the size of the
type its arguments give T.
Sema checks the callee fits (no teams in a call on a team, no divisor parameters or routing; 1-D buffers
sized by one symbol each) before it calls `inline`.
"""

from __future__ import annotations

from dataclasses import replace

from stratac.ir.expr import Bin, BinKind, Const, IExpr, Var, add, simplify, size_scale, substitute
from stratac.ir.nodes import (
    ELEM,
    Accumulate,
    Await,
    Barrier,
    Buffer,
    Copy,
    Domain,
    Flag,
    If,
    Local,
    Loop,
    Node,
    Op,
    OpParam,
    Reduce,
    ReduceList,
    Region,
    Requirement,
    Schedule,
    Set,
    Signal,
    Stage,
    Team,
    Wait,
)


class _Inliner:
    def __init__(self, callee: Schedule, team: Team | None, bind: dict[str, Region],
                 ops: dict[str, Op], prefix: str, first_stage: int, elem: IExpr, ints: dict[str, IExpr]):
        self.callee, self.team, self.bind, self.ops, self.prefix = callee, team, bind, ops, prefix
        self.ints = ints   # a rank parameter -> the place the call gives it (in the caller's terms)
        self.elem = elem
        self.stage = first_stage
        # each size symbol from the first buffer sized by it (`k * n`, k an expression of world,
        # read on the team: n = the region's length / k); every buffer's region must then have its
        # size exactly (`shapes`, checked at every instance)
        self.sizes: dict[str, IExpr] = {}
        source: dict[str, str] = {}
        for p in callee.tensors:
            sym = next(iter(p.size.names() - {"world"}), None)
            k = size_scale(p.size, sym) if sym is not None else None
            if k is not None and sym not in self.sizes:
                self.sizes[sym] = simplify(Bin(BinKind.DIV, bind[p.name].length, self.e(k)))
                source[sym] = p.name
        self.shapes = tuple(
            (p.name, bind[p.name].length, self.e(p.size),
             f"{p.name}: T[{p.size}], {', '.join(f'{y} read off {source[y]}' for y in sorted(p.size.names() & source.keys()))}")
            for p in callee.tensors if bind[p.name].length != self.e(p.size))
        # the callee's scratch buffers become the caller's, renamed, sized in the caller's terms
        # (the team's size for world, the bound regions' sizes for the callee's size symbols)
        self.scratch = tuple(replace(p, name=prefix + p.name, size=self.e(p.size),
                                     shape=tuple(self.e(d) for d in p.shape)) for p in callee.scratch)
        self.bind = {**bind, **{p.name: Region(new.name, Const(0), new.size, None, p.span)
                                for p, new in zip(callee.scratch, self.scratch)}}
        # its teams (a call on world: rank and world are the caller's) become the caller's
        self.teams = {t.name: replace(t, name=prefix + t.name, t=self.e(t.t),
                                      sizes=tuple(self.e(x) for x in t.sizes)) for t in callee.teams}

    def value(self, name: str) -> IExpr:
        if name == "rank":
            return self.team.index if self.team else Var("rank")
        if name == "world":
            return self.team.size if self.team else Var("world")
        if name in self.sizes:
            return self.sizes[name]
        if name in self.ints:
            return self.ints[name]
        if name == ELEM:
            return self.elem
        return Var(self.prefix + name)       # a loop or reduction variable or a local of the callee

    def e(self, x: IExpr) -> IExpr:
        return simplify(substitute(x, self.value))

    def rank(self, place: IExpr) -> IExpr:
        """The caller's rank of the callee's rank (a place of the team)."""
        return self.team.member(self.e(place)) if self.team else self.e(place)

    def region(self, r: Region) -> Region:
        b = self.bind[r.buffer]
        part = (self.e(r.part[0]), self.e(r.part[1])) if r.part is not None else b.part
        if r.sub is not None:
            sub = (r.sub[0], self.e(r.sub[1]), self.e(r.sub[2]), self.e(r.sub[3]))
        else:
            sub = b.sub if r.part is None else None
        return Region(b.buffer, simplify(add(b.lo, self.e(r.lo))), self.e(r.length),
                      None if r.rank is None else self.rank(r.rank), r.span, part, sub)

    def op(self, o: Op) -> Op:
        return self.ops[o.name] if isinstance(o, OpParam) else o

    def nodes(self, ops) -> tuple[Node, ...]:
        return tuple(self.node(op) for op in ops)

    def node(self, op: Node) -> Node:
        if isinstance(op, Stage):
            self.stage += 1
            index = self.stage
            handle = None if op.handle is None else self.prefix + op.handle
            return replace(op, body=self.nodes(op.body), index=index, handle=handle)
        if isinstance(op, Await):
            return replace(op, handle=self.prefix + op.handle)
        if isinstance(op, Copy):
            return replace(op, dst=self.region(op.dst), src=self.region(op.src))
        if isinstance(op, Accumulate):
            return replace(op, dst=self.region(op.dst), src=self.region(op.src), op=self.op(op.op))
        if isinstance(op, ReduceList):
            return replace(op, dst=self.region(op.dst), srcs=tuple(self.region(r) for r in op.srcs),
                           op=self.op(op.op))
        if isinstance(op, Reduce):
            out = replace(op, dst=self.region(op.dst), src=self.region(op.src), op=self.op(op.op),
                          var=self.prefix + op.var)
            if op.count is not None:
                return replace(out, count=self.e(op.count), skip=self.e(op.skip))
            if self.team is not None:   # over the team's places, leaving out its rank for peers
                return replace(out, count=self.team.size, skip=self.team.index)
            return out
        if isinstance(op, If):
            return replace(op, cond=self.e(op.cond), then=self.nodes(op.then),
                           orelse=self.nodes(op.orelse))
        if isinstance(op, Loop):
            var = self.prefix + op.var
            body = self.nodes(op.body)
            if op.domain is Domain.RANGE:
                return replace(op, var=var, body=body, lo=self.e(op.lo), hi=self.e(op.hi))
            if self.team is None:
                return replace(op, var=var, body=body)
            if op.domain is Domain.PEERS:
                body = (If(Bin(BinKind.NE, Var(var), self.team.index), body, (), op.span),)
            return Loop(var, Domain.RANGE, body, op.span, Const(0), self.team.size)
        if isinstance(op, Barrier):
            if op.team is not None:   # a team of the callee (sema: only in a call on world)
                return replace(op, team=self.teams[op.team.name])
            return replace(op, team=self.team)
        if isinstance(op, Signal):
            return replace(op, flag=self.prefix + op.flag, index=self.e(op.index),
                           rank=self.rank(op.rank), round=self.e(op.round))
        if isinstance(op, Wait):
            return replace(op, flag=self.prefix + op.flag, index=self.e(op.index),
                           round=self.e(op.round))
        if isinstance(op, Local):   # the callee's locals are renamed as its loop variables
            return replace(op, name=self.prefix + op.name, value=self.e(op.value),
                           size=None if op.size is None else self.e(op.size))
        if isinstance(op, Set):
            return replace(op, name=self.prefix + op.name, value=self.e(op.value),
                           index=None if op.index is None else self.e(op.index))
        raise TypeError(f"a {type(op).__name__} cannot be inlined")   # sema refuses such callees


def inline(callee: Schedule, team: Team | None, bind: dict[str, Region], ops: dict[str, Op],
           prefix: str, first_stage: int, elem: IExpr = Var(ELEM), ints: dict[str, IExpr] | None = None
           ) -> tuple[tuple[Node, ...], tuple[Flag, ...], tuple[Buffer, ...], tuple[Team, ...],
                      tuple[Requirement, ...], int, tuple]:
    """(the caller's ops, the flags they use, the scratch buffers they use (the callee's, renamed,
    in the callee's element type: the caller retypes a type variable), the teams they use (the
    callee's, renamed; a callee with teams is called on world only), the callee's world
    constraints read on the caller's world, the last stage index used, the (buffer, region length,
    size the callee declares) of every argument whose length is not its size by form: equal at
    every instance or refused). elem: the callee's sizeof(T) in the caller's terms (the size of
    the fixed type its arguments give T, or the caller's own ELEM). ints: the places (on the team)
    the call gives the callee's rank parameters, in the caller's terms."""
    x = _Inliner(callee, team, bind, ops, prefix, first_stage, elem, ints or {})
    body = x.nodes(callee.body)
    flags = tuple(Flag(prefix + f.name, x.e(f.size), f.span, rounds=x.e(f.rounds)) for f in callee.flags)
    size = team.size if team else Var("world")
    requires = tuple(Requirement(simplify(substitute(r.cond, lambda n: size if n == "world" else None)),
                                 r.text, r.span) for r in callee.requires)
    return body, flags, x.scratch, tuple(x.teams.values()), requires, x.stage, x.shapes
