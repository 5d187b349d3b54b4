"""Integer expressions and conditions of one schedule's lowering: the base class of `scope.Scope`.

In: syntax-tree expressions (stratac.lang.ast: literals, names, operators, log2/min/max/sizeof,
conditional expressions, the team expressions node.rank, node.size, node[i]), conditions, and the
names an expression may use there. Out: IR expressions (stratac.ir), folded where the operands are
constants (with the rules `instantiate.evaluate` checks at every instance), and diagnostics appended
to the scope's `diags`; an error gives a neutral value (Const(0), sizeof's Const(1)) and goes on.
The scope's state it reads (lets, parameters, teams, the schedule) is `Scope`'s.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes, Span, StrataError
from stratac.ir.instantiate import evaluate
from stratac.lang import ast


class Expressions:
    """Expression lowering against the names in scope (mixed into `scope.Scope`)."""

    def expr(self, e: ast.Expr, allowed: set[str], what: str) -> ir.IExpr:
        if isinstance(e, ast.IntLit):
            return ir.Const(e.value)
        if isinstance(e, ast.Name):
            if e.id not in allowed:
                hint = ""
                if e.id == "rank" or e.id in self.loop_vars_seen:
                    hint = f" ({what} cannot depend on {e.id})"
                elif e.id in self.locals:
                    kind = "var" if self.locals[e.id] else "let of a var"
                    hint = f" ({e.id} is the running rank's {kind}, which {what} cannot depend on)"
                elif e.id in self.lets:
                    hint = (f" ({e.id} depends on "
                            f"{', '.join(sorted(self.lets[e.id].names() - allowed))}, which {what} cannot)")
                self.err(Codes.UNKNOWN_NAME, f"unknown name {e.id!r} in {what}{hint}", e.span)
                return ir.Const(0)
            if e.id in self.arrays:
                self.err(Codes.BAD_REF, f"{e.id} is an array of {ir.bare(self.arrays[e.id])} integers: "
                         f"read one element, {e.id}[i]", e.span)
                return ir.Const(0)
            return self.lets.get(e.id, ir.Var(e.id))
        if isinstance(e, ast.Neg):
            return ir.Bin(ir.BinKind.SUB, ir.Const(0), self.expr(e.operand, allowed, what))
        if isinstance(e, ast.Member) and e.team in self.arrays:
            if e.team not in allowed:
                self.err(Codes.UNKNOWN_NAME, f"{e.team} is the running rank's array, which {what} "
                         "cannot depend on", e.span)
                return ir.Const(0)
            return ir.Elem(e.team, self.expr(e.index, allowed, what))
        if isinstance(e, (ast.Attr, ast.Member)):
            return self.team_expr(e, allowed, what)
        if isinstance(e, ast.Call) and e.fn == "sizeof":
            return self.sizeof(e, allowed, what)
        if isinstance(e, ast.Call):
            args = [self.expr(a, allowed, what) for a in e.args]
            arity = {"log2": 1, "min": 2, "max": 2}
            if e.fn not in arity:
                self.err(Codes.UNKNOWN_NAME, f"unknown function {e.fn!r}: the integer functions are "
                         "log2(x) (floor of the base-2 logarithm, x >= 1; for 2^k write 1 << k), "
                         "min(a, b), max(a, b) and sizeof(T) (an element type's size in bytes)",
                         e.fn_span)
                return ir.Const(0)
            if len(args) != arity[e.fn]:
                form = "log2(x)" if e.fn == "log2" else f"{e.fn}(a, b)"
                self.err(Codes.BAD_REF, f"{e.fn} takes {arity[e.fn]} argument{'s' * (arity[e.fn] > 1)}: "
                         f"{form}", e.span)
                return ir.Const(0)
            if e.fn == "log2":
                return self.checked(ir.log2(args[0]), e.span)
            kind = ir.BinKind.MIN if e.fn == "min" else ir.BinKind.MAX
            return self.checked(ir.Bin(kind, *args), e.span)
        if isinstance(e, ast.CondExpr):
            c = self.cond(e.cond, (), allowed, what)
            then, orelse = self.expr(e.then, allowed, what), self.expr(e.orelse, allowed, what)
            return ir.simplify(ir.Sel(c, then, orelse)) if isinstance(ir.simplify(c), ir.Const) \
                else ir.Sel(c, then, orelse)
        kind = {"+": ir.BinKind.ADD, "-": ir.BinKind.SUB, "*": ir.BinKind.MUL,
                "/": ir.BinKind.DIV, "%": ir.BinKind.MOD, "<<": ir.BinKind.SHL, ">>": ir.BinKind.SHR,
                "&": ir.BinKind.AND, "^": ir.BinKind.XOR, "|": ir.BinKind.OR}[e.op]
        return self.checked(ir.Bin(kind, self.expr(e.lhs, allowed, what),
                                   self.expr(e.rhs, allowed, what)), e.span)

    def sizeof(self, e: ast.Call, allowed: set[str], what: str) -> ir.IExpr:
        """sizeof(TYPE): a fixed type's size as a constant; the type variable's as ir.ELEM, which
        every instance binds (the verifier to each of ir.elem_sizes, a call to its tensors'). After an
        error, 1: a size that divides nothing by zero."""
        arg = e.args[0] if len(e.args) == 1 else None
        if not isinstance(arg, ast.Name):
            self.err(Codes.BAD_REF, "sizeof takes one element type: sizeof(T) of the schedule's type "
                     "variable, or sizeof(f16)", e.span)
            return ir.Const(1)
        fixed = ir.DType.parse(arg.id)
        if fixed is not None:
            return ir.Const(fixed.nbytes)
        if ir.ELEM not in allowed:
            self.err(Codes.UNKNOWN_NAME, f"sizeof({arg.id}) cannot be used in {what}: a parameter's "
                     "size reads the tensors the caller passes, whatever their element type (and a "
                     "`requires` is a condition on world alone)", e.span)
            return ir.Const(1)
        typevars = {p.typevar for p in self.params.values() if p.typevar}
        if arg.id not in typevars:
            have = (f"its type variable {', '.join(sorted(typevars))}" if typevars
                    else "it has no type variable")
            self.err(Codes.UNKNOWN_NAME, f"{arg.id!r} is not an element type of {self.s.name}: sizeof "
                     f"takes f32, f16, bf16, i32, i8 or the schedule's type variable ({have})", arg.span)
            return ir.Const(1)
        if self.routed:
            self.err(Codes.BAD_REF, f"sizeof({arg.id}) of a {self.s.contract.kind} schedule is not "
                     "supported yet: its verifier samples do not range over the element size (write "
                     "the tokens' type, or sizeof(f16) of a fixed type)", e.span)
            return ir.Const(1)
        self.elem = True
        return ir.Var(ir.ELEM)

    def checked(self, e: ir.Bin, span: Span) -> ir.IExpr:
        """e, with an operation on constants checked now (1 << 64, log2(0), 5 % 0): the rules of
        `instantiate.evaluate`, which checks the others at every instance."""
        if isinstance(e.lhs, ir.Const) and isinstance(e.rhs, ir.Const):
            try:
                return ir.Const(evaluate(e, {}, span, "this expression"))
            except StrataError as exc:
                self.diags.extend(exc.diagnostics)
                return ir.Const(0)
        return e

    def cond(self, c: ast.Cond | ast.CondIs, loop_vars, allowed: set[str] | None = None,
             what: str = "a condition") -> ir.IExpr:
        env = self.env(loop_vars) if allowed is None else allowed
        if isinstance(c, ast.CondIs):
            x = self.expr(c.lhs, env, what)
            if c.prop != "pow2":
                self.err(Codes.BAD_TYPE, f"unknown property {c.prop!r}: write `x is pow2` (x is a power "
                         "of two: 1, 2, 4, ...)", c.prop_span)
                return ir.Const(0)
            # x > 0 and x & (x - 1) == 0 (comparisons are 0 or 1, so & is their conjunction)
            return ir.Bin(ir.BinKind.AND, ir.Bin(ir.BinKind.GT, x, ir.Const(0)),
                          ir.Bin(ir.BinKind.EQ, ir.Bin(ir.BinKind.AND, x, ir.Bin(ir.BinKind.SUB, x,
                                                                                   ir.Const(1))),
                                 ir.Const(0)))
        kind = {k.value: k for k in (ir.BinKind.LT, ir.BinKind.LE, ir.BinKind.GT, ir.BinKind.GE,
                                     ir.BinKind.EQ, ir.BinKind.NE)}[c.op]
        return ir.Bin(kind, self.expr(c.lhs, env, what), self.expr(c.rhs, env, what))

    # ---- teams (declared by loops.Loops.team_decl)
    TEAM_ATTRS = ("rank", "size")

    def team_of(self, name: str, span: Span) -> ir.Team | None:
        team = self.teams.get(name)
        if team is None:
            known = f" (teams: {', '.join(self.teams)})" if self.teams else ""
            self.err(Codes.UNKNOWN_NAME, f"{name!r} is not a team{known}: declare one at the top of "
                     f"the schedule, `team {name} = block(T)`", span)
        return team

    def team_expr(self, e: "ast.Attr | ast.Member", allowed: set[str], what: str) -> ir.IExpr:
        """node.rank, node.size, node[i]: expressions of rank and world (and i)."""
        team = self.team_of(e.team, e.team_span)
        if team is None:
            return ir.Const(0)
        if isinstance(e, ast.Member):
            value = team.member(self.expr(e.index, allowed, what))
        elif e.attr not in self.TEAM_ATTRS:
            self.err(Codes.UNKNOWN_NAME, f"team {e.team} has no {e.attr!r}: a team has rank (the "
                     "running rank's place in it), size, and members node[i]", e.span)
            return ir.Const(0)
        else:
            value = team.index if e.attr == "rank" else team.size
        missing = value.names() - allowed
        if missing:
            self.err(Codes.UNKNOWN_NAME, f"{_text(e.span)} depends on {', '.join(sorted(missing))}, "
                     f"which {what} cannot use", e.span)
            return ir.Const(0)
        return ir.simplify(value)


def _text(span: Span) -> str:
    """The source text a (one-line) span covers."""
    line = span.source.text.split("\n")[span.line - 1]
    end = span.end_col if span.end_line == span.line else len(line) + 1
    return " ".join(line[span.col - 1:end - 1].split())


def _names(e: ast.Expr) -> set[str]:
    if isinstance(e, ast.Name):
        return {e.id}
    if isinstance(e, ast.Call) and e.fn == "sizeof":   # names a type, not an integer
        return set()
    if isinstance(e, ast.Call):
        return set().union(*(_names(a) for a in e.args))
    if isinstance(e, ast.CondExpr):
        return _names(e.cond.lhs) | _names(e.then) | _names(e.orelse) | (
            _names(e.cond.rhs) if isinstance(e.cond, ast.Cond) else set())
    if isinstance(e, ast.BinOp):
        return _names(e.lhs) | _names(e.rhs)
    if isinstance(e, ast.Neg):
        return _names(e.operand)
    if isinstance(e, ast.Member):   # a team's member or an array's element: both names count
        return {e.team} | _names(e.index)
    return set()
