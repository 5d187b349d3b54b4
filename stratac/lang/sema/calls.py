"""Composition: `call NAME(args) on TEAM`, the callee's body inlined into the caller.

In: an ast.CallStmt at the top of a schedule; the callee's IR and syntax tree come from the scope's
`resolve` (the package's `lower` refuses unknown callees and recursion). Out: the inlined IR nodes
(ir.inline), the callee's flags added to the scope (renamed with the call's prefix) and an
ir.CallSite appended to `calls`; the arguments' kinds, types and symmetry are checked against the
callee's parameters, and what the inliner does not handle yet is refused (`callee_fits`).
"""

from __future__ import annotations

import re
from dataclasses import replace

from stratac import ir
from stratac.diagnostics import Codes, Note
from stratac.ir.inline import inline as ir_inline
from stratac.lang import ast
from stratac.lang.sema.scope import Scope, _text


class Calls(Scope):
    # ---- composition
    def call(self, st: ast.CallStmt, top: bool, engine) -> tuple:
        """call callee(args) on team: the callee's body inlined (ir.inline), after checking that
        the callee exists, is not the caller or its caller, fits the inliner and takes these
        arguments."""
        if not top or engine is not None:
            self.err(Codes.CALL, "a call is a statement at the top of a schedule (outside stages, "
                     "loops and ifs)", st.span)
            return ()
        team = None
        if st.team != "world":
            team = self.team_of(st.team, st.team_span)
            if team is None:
                return ()
        got = self.resolve(st.callee) if self.resolve else f"{st.callee!r} cannot be called here"
        if isinstance(got, str):
            self.err(Codes.CALL, got, st.callee_span)
            return ()
        callee, tree = got
        if not self.callee_fits(callee, st, team):
            return ()
        signature = ", ".join(f"{p.name}: {p.dtype}" + (f"[{', '.join(_text(d.span) for d in p.dims)}]"
                                                         if p.dims else "") for p in tree.params)
        note = Note(f"{callee.name}({signature}) is defined here", tree.name_span)
        if len(st.args) != len(tree.params):
            self.err(Codes.CALL, f"{callee.name} takes {len(tree.params)} argument(s), "
                     f"{len(st.args)} given", st.span, note)
            return ()
        reported = len(self.diags)
        bind: dict[str, ir.Region] = {}
        ops: dict[str, ir.Op] = {}
        ints: dict[str, ir.IExpr] = {}             # a rank parameter -> its place on the team
        typevar: dict[str, tuple[str, str]] = {}   # the callee's type variable -> (type, argument)
        for p, a in zip(tree.params, st.args):
            scalar = next((x for x in callee.scalars if x.name == p.name), None)
            if scalar is not None and scalar.kind is ir.ScalarKind.RANK:
                value = self.rank_arg(a, p.name, callee, team, note)
                if value is not None:
                    ints[p.name] = value
                continue
            if isinstance(a, ast.IntArg):
                what = "a redop: pass sum, max, min or a redop parameter" if scalar is not None else \
                    "a buffer: pass a region of one (x, part[i], x[lo:hi])"
                self.err(Codes.BAD_TYPE, f"{p.name} of {callee.name} is {what}, not an integer",
                         a.span, note)
                continue
            if scalar is not None:    # a redop (callee_fits refused divisor parameters)
                name = a.name if isinstance(a, ast.RedopArg) else (
                    a.name if a.selector is None and a.rank is None else None)
                op = None
                if name is not None and (isinstance(a, ast.RedopArg) or (
                        name in self.scalars and self.scalars[name].kind is ir.ScalarKind.REDOP)):
                    op = self.op(name, a.span)
                if op is None:
                    self.err(Codes.BAD_TYPE, f"{p.name} of {callee.name} is a redop: pass sum, max, min "
                             "or a redop parameter", a.span, note)
                    continue
                ops[p.name] = op
                continue
            if isinstance(a, ast.RedopArg) or (a.selector is None and a.name in self.scalars):
                self.err(Codes.BAD_TYPE, f"{p.name} of {callee.name} is a buffer: pass a region of one "
                         f"(x, part[i], x[lo:hi]), not {a.name}", a.span, note)
                continue
            if a.rank is not None:
                self.err(Codes.CALL, f"pass the running rank's region (drop the @): {callee.name} "
                         "reaches the other members' own", a.span)
                continue
            got = self.region(a, (), "argument")
            if got is None:
                continue
            region, buf = got
            want = callee.param(p.name)
            if want.typevar is not None:
                seen = typevar.setdefault(want.typevar, (buf.type_text, a.name))
                if seen[0] != buf.type_text and buf.name not in self.bad_types:
                    self.err(Codes.BAD_TYPE, f"{callee.name} takes {p.name} of its type {want.typevar}, "
                             f"which {seen[1]} made {seen[0]}, but {buf.name} holds {buf.type_text}",
                             a.span, note)
            elif want.type_text != buf.type_text and buf.name not in self.bad_types:
                self.err(Codes.BAD_TYPE, f"{callee.name} takes {p.name} of {want.type_text}, but "
                         f"{buf.name} holds {buf.type_text}", a.span, note)
            if want.symmetric and not buf.symmetric:
                self.err(Codes.NOT_SYMMETRIC, f"{callee.name} reaches {p.name} on other ranks: "
                         f"{buf.name} must be symmetric (`{buf.name}: sym ...`)", a.span,
                         Note(f"{buf.name} is declared here", buf.span))
            bind[p.name] = region
        if len(self.diags) > reported:
            return ()
        prefix = f"c{len(self.calls) + 1}_"
        # the callee's sizeof(T): the size of a fixed type its arguments give T, else the caller's
        given = ir.DType.parse(next(iter(typevar.values()))[0]) if typevar else None
        elem = ir.Const(given.nbytes) if given is not None else ir.Var(ir.ELEM)
        body, flags, scratch, teams, requires, self.stage_count, shapes = ir_inline(
            callee, team, bind, ops, prefix, self.stage_count, elem, ints)
        self.elem |= callee.elem and given is None
        fixed = self.fixed_names()
        for f in flags:
            if self.taken(f.name):
                self.err(Codes.DUPLICATE_NAME, f"the flag {f.name} of this call (flag "
                         f"{f.name[len(prefix):]} of {callee.name}) is already defined: rename yours",
                         st.span)
            elif f.size.names() - fixed:
                self.err(Codes.CALL, f"flag {f.name[len(prefix):]} of {callee.name} would have "
                         f"{ir.bare(f.size)} slots, which depends on "
                         f"{', '.join(sorted(f.size.names() - fixed))}: every rank must agree on a "
                         "flag's size (pass a region whose length is an expression of world and sizes"
                         f"{_unequal(team)})", st.span, Note("the flag is declared here", f.span))
            elif f.rounds.names() - fixed:
                self.err(Codes.CALL, f"flag {f.name[len(prefix):]} of {callee.name} would have "
                         f"{ir.bare(f.rounds)} rounds, which depends on "
                         f"{', '.join(sorted(f.rounds.names() - fixed))}: every rank must reserve the "
                         "same stamps per call (pass a region whose length is an expression of world "
                         f"and sizes{_unequal(team)})", st.span, Note("the flag is declared here", f.span))
            else:
                self.flags[f.name] = f
        for name, what, span in _names_declared(body):
            if self.taken(name):   # the kernel would declare it twice
                self.err(Codes.DUPLICATE_NAME, f"the {what} {name} of this call ({what} "
                         f"{name[len(prefix):]} of {callee.name}) is already defined: rename yours",
                         st.span, Note(f"the {what} is declared here", span))
            else:
                self.inlined.add(name)
        for t in teams:
            if self.taken(t.name):
                self.err(Codes.DUPLICATE_NAME, f"the team {t.name} of this call (team {t.name[len(prefix):]} "
                         f"of {callee.name}) is already defined: rename yours", st.span)
            else:
                self.teams[t.name] = t
        for b in scratch:
            own, varying = b.name[len(prefix):], b.size.names() - fixed
            if self.taken(b.name):
                self.err(Codes.DUPLICATE_NAME, f"the scratch buffer {b.name} of this call (scratch {own} "
                         f"of {callee.name}) is already defined: rename yours", st.span)
            elif varying:
                self.err(Codes.CALL, f"scratch {own} of {callee.name} would hold {ir.bare(b.size)} "
                         f"elements, which depends on {', '.join(sorted(varying))}: "
                         "a scratch buffer has one size on every rank (pass regions whose lengths are "
                         "expressions of world and sizes)", st.span, Note("the buffer is declared here", b.span))
            elif b.typevar is not None and b.typevar not in typevar:
                self.err(Codes.CALL, f"scratch {own} of {callee.name} holds its type {b.typevar}, which no "
                         "argument gives", st.span, Note("the buffer is declared here", b.span))
            else:
                if b.typevar is not None:   # the callee's type variable: the type its arguments gave it
                    given = typevar[b.typevar][0]
                    dtype = ir.DType.parse(given)
                    b = replace(b, dtype=dtype, typevar=None if dtype is not None else given)
                self.params[b.name] = b
        args = ", ".join(_text(a.span) for a in st.args)
        site = ir.CallSite(callee.name, None if team is None else team.name, args, st.span, 0, 0, prefix,
                           requires, shapes)
        self.calls.append(site)
        # the callee's world constraints are the caller's too, read on the team: a world whose team
        # violates one is one the caller does not support (skipped by check, refused by a call)
        for r, own in zip(requires, callee.requires):
            said = own.text if team is None else re.sub(r"\bworld\b", f"{team.name}.size", own.text)
            self.requires.append(ir.Requirement(r.cond, f"{said} ({site}: {callee.name} requires "
                                                f"{own.text}, line {own.span.line})", st.span))
        return body

    def rank_arg(self, a, name: str, callee: ir.Schedule, team: ir.Team | None,
                 note: Note) -> ir.IExpr | None:
        """The value of a callee's rank parameter: a place of the team the call runs on (0 .. team
        size - 1: the callee numbers the members 0 .. its world - 1), as an integer expression of
        what every rank of the call agrees on (world, sizes, the caller's rank and divisor
        parameters, lets of those). The callee was checked with its parameter the same on every
        rank (its sema lets one bound a step loop with barriers, size a team, ...), so an argument
        that depends on the rank is refused. The verifier proves the caller with the callee
        inlined, so a place outside the team is found where it goes wrong."""
        if isinstance(a, ast.Ref) and a.selector is None and a.rank is None and \
                a.name not in self.params and a.name not in self.views and \
                a.name not in self.scalars_of(ir.ScalarKind.REDOP):
            a = ast.IntArg(ast.Name(a.name, a.span), a.span)
        if not isinstance(a, ast.IntArg):
            self.err(Codes.BAD_TYPE, f"{name} of {callee.name} is a rank: pass an integer, the "
                     f"member of {'the team' if team else 'the world'} it names (0, root, "
                     "(root / 4))", a.span, note)
            return None
        where = f"team {team.name}" if team is not None else "the world"
        value = ir.simplify(self.expr(a.value, self.env(), f"{name} of {callee.name} (a place of {where})"))
        varying = value.names() - self.fixed_names()
        if varying:
            self.err(Codes.CALL, f"{name} of {callee.name} is the same on every rank of a call, so its "
                     f"argument must be too (an expression of world, sizes and the caller's rank and "
                     f"divisor parameters), but {_text(a.span)} depends on {', '.join(sorted(varying))}",
                     a.span, note)
            return None
        return value

    def scalars_of(self, kind: ir.ScalarKind) -> set[str]:
        return {x.name for x in self.scalars.values() if x.kind is kind}

    def callee_fits(self, callee: ir.Schedule, st: ast.CallStmt, team: ir.Team | None) -> bool:
        """What the inliner does not handle yet is refused with E0109 (dsl/README.md, Composition)."""
        why = None
        divisor = next((x for x in callee.scalars if x.kind is ir.ScalarKind.DIVISOR), None)
        if callee.contract.kind.moe:
            why = f"it is a {callee.contract.kind.value} (routing)"
        elif callee.teams and self.routed:
            why = (f"it declares teams ({', '.join(t.name for t in callee.teams)}), which a MoE schedule "
                   "cannot hold (its calls take a mask of live ranks, which teams do not follow yet)")
        elif callee.teams and team is not None:
            why = (f"it declares teams ({', '.join(t.name for t in callee.teams)}), and a call on a team "
                   "cannot hold teams of its own (call it on world)")
        elif divisor is not None:
            why = f"it takes a divisor parameter ({divisor.name})"
        elif callee.requires and team is not None and team.size.names() - {"world"}:
            # a requirement is a condition on world alone (ir.Requirement.holds), and the team's
            # size, the callee's world, names what the call gives
            why = (f"it requires {callee.requires[0].text}, and the size of team {team.name} depends on "
                   f"{', '.join(sorted(team.size.names() - {'world'}))}, which a world constraint "
                   "cannot name (call it on a team whose size is an expression of world)")
        elif callee.elem and self.routed:
            why = (f"it names sizeof(T), which a {self.s.contract.kind} schedule cannot yet (its verifier "
                   "samples do not range over the element size)")
        else:
            def scaled(p: ir.Buffer) -> bool:   # T[n], T[n * world], T[2 * n]: one symbol times k
                syms = p.size.names() - {"world"}
                return len(syms) == 1 and ir.size_scale(p.size, next(iter(syms))) is not None
            if any(p.shape or not scaled(p) for p in callee.tensors):
                why = ("its buffers are not each 1-D and sized by one size symbol times an expression "
                       "of world (x: T[n], out: T[n * world])")
        if why is None:
            return True
        self.err(Codes.CALL, f"{callee.name} cannot be called yet: {why}; calls inline schedules of "
                 "1-D buffers sized n, redop and rank parameters, flags, barriers, loops and stages",
                 st.callee_span, Note(f"{callee.name} is defined here", callee.span))
        return False


def _unequal(team: ir.Team | None) -> str:
    """For a call on a team of unequal groups: why a callee's world-sized flag differs by rank."""
    if team is None or team.kind != "groups":
        return ""
    return (f"; on {team.name}, whose groups differ in size, the callee's world is the size of the "
            "running rank's group")


def _names_declared(ops):
    """(name, what, span) of the locals, loop variables and asynchronous handles ops declare, at
    any depth (an inlined body's, already renamed with its call's prefix)."""
    for op in ops:
        if isinstance(op, ir.Local):
            yield op.name, "local", op.span
        elif isinstance(op, ir.Loop):
            yield op.var, "loop variable", op.span
            yield from _names_declared(op.body)
        elif isinstance(op, ir.If):
            yield from _names_declared(op.then + op.orelse)
        elif isinstance(op, ir.Stage) and op.handle is not None:
            yield op.handle, "asynchronous stage", op.span
