"""Loops and teams: loops over ranks and peers, step loops (`for s in lo .. hi`), loops over a team's
members (`for p in node.ranks|peers`), and team declarations (`team node = block(T)`, stride(T),
across(team)).

In: ast.For and ast.TeamDecl, with the loop variables and the engine around them. Out: ir.Loop
(a team loop is a step loop over the members' places) and the teams recorded in the scope; every
iteration of a step loop must pass the same number of barriers on every rank (`step_loop`).
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes
from stratac.lang import ast
from stratac.lang.sema.scope import Scope


class Loops(Scope):
    def loop(self, st: ast.For, loop_vars, engine):
        if st.var in loop_vars or self.taken(st.var) or st.var in self.sizes:
            self.err(Codes.DUPLICATE_NAME, f"loop variable {st.var!r} shadows another name",
                     st.var_span)
            return None
        self.loop_vars_seen.add(st.var)
        if st.domain == "range":
            env = self.env(loop_vars)
            lo = ir.simplify(self.expr(st.lo, env, "a loop bound"))
            hi = ir.simplify(self.expr(st.hi, env, "a loop bound"))
            self.step_vars.add(st.var)
            self.loop_bounds.append((lo, hi, st.span))
            body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=engine)
            self.loop_bounds.pop()
            self.step_vars.discard(st.var)
            read = (lo.names() | hi.names()) & self.locals.keys()
            for name, span in _sets(body):
                if name in read:   # the kernel tests its bound at every trip; the proof read it once
                    self.err(Codes.BAD_REF, f"`set {name}` in a loop whose bounds read {name}: the "
                             "bounds are read once, when the loop starts; give the loop a let of "
                             f"{name} made before it", span)
            return ir.Loop(st.var, ir.Domain.RANGE, tuple(body), st.span, lo, hi)
        if st.team is not None:
            return self.team_loop(st, loop_vars, engine)
        if engine is None and _holds_stage(st.body):
            return self.rank_step_loop(st, loop_vars)
        body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=engine)
        return ir.Loop(st.var, ir.Domain(st.domain), tuple(body), st.span)

    def rank_step_loop(self, st: ast.For, loop_vars):
        """for p in ranks|peers around stages: a step loop over i, with p standing for
        (rank + i) % world in the body, i from 0 (ranks) or 1 (peers) to world - 1: every rank
        starts with its next peer, so the ranks' first stages go to different ranks."""
        if self.masked:
            self.err(Codes.BAD_ENGINE, "a loop over ranks around stages is not built for MoE dispatch "
                     "and combine (their calls take a mask of live ranks, which its steps do not "
                     "follow yet): put the loop inside the stage", st.span)
            return None
        index = ir.Var(st.var)
        lo = ir.Const(1 if st.domain == "peers" else 0)
        outer = dict(self.lets)
        self.lets[st.var] = ir.Bin(ir.BinKind.MOD, ir.Bin(ir.BinKind.ADD, ir.Var("rank"), index), ir.Var("world"))
        self.step_vars.add(st.var)
        self.loop_bounds.append((lo, ir.Var("world"), st.span))
        body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=None)
        self.loop_bounds.pop()
        self.step_vars.discard(st.var)
        self.lets = outer
        return ir.Loop(st.var, ir.Domain.RANGE, tuple(body), st.span, lo, ir.Var("world"))

    def team_loop(self, st: ast.For, loop_vars, engine):
        """for p in node.ranks|peers: a step loop over the members' places i (0 .. node.size), with
        p standing for node[i] in the body (and node.peers leaving out i == node.rank)."""
        team = self.team_of(st.team, st.span)
        if team is None:
            return None
        index = ir.Var(st.var)
        outer = dict(self.lets)
        self.lets[st.var] = team.member(index)   # the body's p is the member's rank
        self.step_vars.add(st.var)
        self.loop_bounds.append((ir.Const(0), team.size, st.span))
        body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=engine)
        self.loop_bounds.pop()
        self.step_vars.discard(st.var)
        self.lets = outer
        body = tuple(body)
        if st.domain == "peers":
            body = (ir.If(ir.Bin(ir.BinKind.NE, index, team.index), body, (), st.span),)
        return ir.Loop(st.var, ir.Domain.RANGE, body, st.span, ir.Const(0), team.size)

    def team_decl(self, st: ast.TeamDecl, top: bool) -> None:
        if not top:
            self.err(Codes.BAD_REF, "teams are declared at the top of a schedule", st.span)
            return
        if self.taken(st.name) or st.name in self.sizes:
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.name_span)
            return
        if st.kind == "across":
            if not isinstance(st.arg, ast.Name):
                self.err(Codes.BAD_REF, "across takes a team: `team lane = across(node)`", st.arg.span)
                return
            of = self.team_of(st.arg.id, st.arg.span)
            if of is None:
                return
            if of.kind != "block":
                self.err(Codes.BAD_REF, f"across(team) takes a block team (its ranks at one place "
                         f"of every block); {of}", st.arg.span)
                return
            self.teams[st.name] = ir.Team(st.name, "stride", of.t, st.span)
            return
        if st.kind not in ("block", "stride", "groups"):
            self.err(Codes.UNKNOWN_NAME, f"unknown kind of team {st.kind!r}: block(T) (consecutive "
                     "ranks), stride(T) (ranks T apart), across(team) or groups(S0, S1, ...) "
                     "(consecutive groups of those sizes)", st.kind_span)
            return
        if st.more and st.kind != "groups":
            self.err(Codes.BAD_REF, f"{st.kind}(T) takes one size; groups(S0, S1, ...) takes one "
                     "per group", st.more[0].span)
            return
        sizes = []
        for arg in (st.arg, *st.more):
            reported = len(self.diags)
            size = ir.simplify(self.expr(arg, self.env(), "a team's size (an expression of world)"))
            if len(self.diags) > reported:
                return
            others = size.names() - {"world", *self.divisors()}
            if others:
                self.err(Codes.BAD_REF, f"a team's size is an expression of world and divisor "
                         f"parameters (every rank must agree on it); this one uses "
                         f"{', '.join(sorted(others))}", arg.span)
                return
            if isinstance(size, ir.Const) and size.value < 1:
                self.err(Codes.BAD_WORLD, f"a team has at least one rank; this one would have "
                         f"{size.value}", arg.span)
                return
            sizes.append(size)
        if st.kind == "groups":
            self.teams[st.name] = ir.Team(st.name, "groups", ir.Const(len(sizes)), st.span,
                                          sizes=tuple(sizes))
            return
        self.teams[st.name] = ir.Team(st.name, st.kind, sizes[0], st.span)


def _holds_stage(stmts) -> bool:
    """Whether statements hold a stage, at any depth of loops and ifs."""
    for st in stmts:
        if isinstance(st, ast.Stage):
            return True
        for part in ("body", "then", "orelse"):
            inner = getattr(st, part, None)
            if isinstance(inner, tuple) and _holds_stage(inner):
                return True
    return False


def _sets(ops):
    """(name, span) of every `set` in ops, at any depth."""
    for op in ops:
        if isinstance(op, ir.Set):
            yield op.name, op.span
        elif isinstance(op, ir.If):
            yield from _sets(op.then + op.orelse)
        elif isinstance(op, (ir.Loop, ir.Stage)):
            yield from _sets(op.body)
