"""The scope of one schedule's lowering, and what every family of statements reads through it.

One `Scope` per schedule holds everything declared so far (parameters, scratch buffers, views, flags,
scalars, lets, teams, sizes), the loop variables and step-loop bounds around the statement being
checked, the asynchronous stages still in flight per open block, and the diagnostics collected.
Its helpers turn syntax into IR against that scope: expressions (with the team expressions
node.rank, node.size, node[i]), conditions, buffer regions (x, part[i], chunk[i][c], x[lo:hi],
...@p), reduction operations, and the type checks shared by moves and routing.

In: syntax-tree nodes (stratac.lang.ast) and the scope's state. Out: IR expressions and regions
(stratac.ir), and diagnostics appended to `diags` (an error is reported once, in place; the caller
gets a neutral value such as Const(0) or None and goes on). The statement families (decls, moves,
sync, loops, calls, moe) are subclasses of Scope that the package's `_Lowering` combines, so every
statement reads and writes this one object.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, Span, StrataError, error
from stratac.ir.instantiate import evaluate
from stratac.lang import ast

RESERVED = {"rank", "world"}
# A call from Python takes the parameters by name beside its own option `cores=` (the vector cores
# to launch on), so a parameter of that name could not be passed. Names that clash in C++ are not
# refused but renamed in the generated code (codegen/abi.py): there the user never sees them.
CALL_OPTIONS = {"cores"}


@dataclass(frozen=True)
class _View:
    buffer: str
    parts: ir.IExpr
    span: Span
    of: str | None = None    # a split of the parts of this view (chunk = split(part, k))


class Scope:
    """The names in scope of one schedule, the diagnostics so far, and the helpers that read them."""

    def __init__(self, sched: ast.Schedule, source_name: str, resolve=None):
        self.s = sched
        # name, span -> (the callee's IR, its syntax tree) or None (reported); None: no calls
        self.resolve = resolve
        self.calls: list[ir.CallSite] = []
        self.source_name = source_name
        self.diags: list[Diagnostic] = []
        self.params: dict[str, ir.Buffer] = {}
        self.views: dict[str, _View] = {}
        self.flags: dict[str, ir.Flag] = {}
        self.sizes: list[str] = []
        self.stage_count = 0
        self.loop_vars_seen: set[str] = set()
        self.bad_types: set[str] = set()   # parameters whose element type was already reported
        self.scalars: dict[str, ir.Scalar] = {}
        self.lets: dict[str, ir.IExpr] = {}     # the named integers in scope (substituted)
        self.step_vars: set[str] = set()        # variables of step loops (for s in lo .. hi)
        self.masked = False                     # a MoE dispatch or combine (Decls.lower sets it)
        self.routed = False                     # a MoE contract: dispatch, combine or AllToAllV (likewise)
        self.elem = False                       # an expression names ir.ELEM (sizeof of the type variable)
        self.requires: list[ir.Requirement] = []
        self.teams: dict[str, ir.Team] = {}
        self.loop_bounds: list[tuple[ir.IExpr, ir.IExpr, Span]] = []   # of the step loops around
        # per open block, the asynchronous stages posted in it and not yet awaited: handle -> span
        self.pending: list[dict[str, Span]] = []

    def taken(self, name: str) -> bool:
        return (name in RESERVED or name in self.params or name in self.views or name in self.flags
                or name in self.scalars or name in self.lets or name in self.teams)

    def static_env(self) -> set[str]:
        """Names a size of the schedule (a flag's, a scratch buffer's, a split's parts) may use:
        world, the size symbols and the lets made of those alone."""
        fixed = {"world", ir.ELEM, *self.sizes, *self.divisors()}
        return fixed | {n for n, e in self.lets.items() if e.names() <= fixed}

    def divisors(self) -> list[str]:
        """The divisor parameters: integers every rank of a call is given alike."""
        return [x.name for x in self.scalars.values() if x.kind is ir.ScalarKind.DIVISOR]

    def env(self, loop_vars=()) -> set[str]:
        """Names an index or rank expression may use."""
        ints = {x.name for x in self.scalars.values() if x.kind is not ir.ScalarKind.REDOP}
        return {"rank", "world", ir.ELEM, *self.sizes, *ints, *loop_vars, *self.lets}

    def op(self, name: str, span: Span) -> ir.Op | None:
        if name in {o.value for o in ir.ReduceOp}:
            return ir.ReduceOp(name)
        x = self.scalars.get(name)
        if x is not None and x.kind is ir.ScalarKind.REDOP:
            return ir.OpParam(name)
        self.err(Codes.UNKNOWN_NAME, f"{name!r} is not a reduction: use sum, max, min or a parameter "
                 f"declared `{name}: redop`", span)
        return None

    def err(self, code: str, msg: str, span: Span | None, *notes: Note) -> None:
        self.diags.append(error(code, msg, span, *notes))

    # ---- expressions
    def expr(self, e: ast.Expr, allowed: set[str], what: str) -> ir.IExpr:
        if isinstance(e, ast.IntLit):
            return ir.Const(e.value)
        if isinstance(e, ast.Name):
            if e.id not in allowed:
                hint = ""
                if e.id == "rank" or e.id in self.loop_vars_seen:
                    hint = f" ({what} cannot depend on {e.id})"
                elif e.id in self.lets:
                    hint = (f" ({e.id} depends on "
                            f"{', '.join(sorted(self.lets[e.id].names() - allowed))}, which {what} cannot)")
                self.err(Codes.UNKNOWN_NAME, f"unknown name {e.id!r} in {what}{hint}", e.span)
                return ir.Const(0)
            return self.lets.get(e.id, ir.Var(e.id))
        if isinstance(e, ast.Neg):
            return ir.Bin(ir.BinKind.SUB, ir.Const(0), self.expr(e.operand, allowed, what))
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

    def fixed_names(self) -> set[str]:
        """What every rank of a call agrees on: world, the sizes and the rank and divisor
        parameters."""
        ints = [x.name for x in self.scalars.values() if x.kind is not ir.ScalarKind.REDOP]
        return {"world", ir.ELEM, *self.sizes, *ints}

    # ---- data
    def region(self, ref: ast.Ref, loop_vars, role: str) -> tuple[ir.Region, ir.Buffer] | None:
        env = self.env(loop_vars)
        if ref.name in self.views:
            view = self.views[ref.name]
            buf = self.params[view.buffer]
            top = self.views[view.of] if view.of is not None else view
            if not isinstance(ref.selector, ast.Index):
                self.err(Codes.BAD_REF, f"{ref.name} is a split of {view.of or view.buffer}; pick a "
                         f"part: {ref.name}[i]" + ("[c]" if view.of else ""), ref.span)
                return None
            index = self.expr(ref.selector.index, env, "a part index")
            lo, length = ir.split_part(buf.size, top.parts, index)
            part = (index, top.parts)
            sub = None
            if view.of is not None:
                if not isinstance(ref.sub, ast.Index):
                    self.err(Codes.BAD_REF, f"{ref.name} splits every part of {view.of} into chunks; "
                             f"pick one: {ref.name}[i][c]", ref.span)
                    return None
                chunk = self.expr(ref.sub.index, env, "a chunk index")
                clo, clen = ir.split_part(length, view.parts, chunk)
                sub = ("chunk", chunk, view.parts, length)
                lo, length = ir.simplify(ir.add(lo, clo)), clen
            elif isinstance(ref.sub, ast.Index):
                self.err(Codes.BAD_REF, f"part {ref.name}[i] is not split again; take elements "
                         f"{ref.name}[i][lo:hi] or split the parts: chunk = split({ref.name}, k)",
                         ref.sub.span)
                return None
            elif isinstance(ref.sub, ast.Range):
                slo = self.expr(ref.sub.lo, env, "a range bound")
                shi = self.expr(ref.sub.hi, env, "a range bound")
                sub = ("range", slo, shi, length)
                lo, length = ir.simplify(ir.add(lo, slo)), ir.simplify(ir.Bin(ir.BinKind.SUB, shi, slo))
        elif ref.name in self.params:
            buf = self.params[ref.name]
            sub = None
            if ref.sub is not None:
                self.err(Codes.BAD_REF, f"{ref.name} is not split: one selector, {ref.name}[lo:hi]",
                         ref.sub.span)
                return None
            if isinstance(ref.selector, ast.Index):
                self.err(Codes.BAD_REF, f"{ref.name} is not split; take a range {ref.name}[lo:hi] or "
                         "split it first", ref.selector.span)
                return None
            if isinstance(ref.selector, ast.Range):
                lo = self.expr(ref.selector.lo, env, "a range bound")
                hi = self.expr(ref.selector.hi, env, "a range bound")
                length = ir.Bin(ir.BinKind.SUB, hi, lo)
            else:
                lo, length = ir.Const(0), buf.size
            part = None
        else:
            known = self.flags.keys() | self.params.keys() | self.views.keys()
            what = "a flag, not data" if ref.name in self.flags else "not defined"
            self.err(Codes.UNKNOWN_NAME, f"{ref.name!r} is {what}"
                     + (f" (known: {', '.join(sorted(known))})" if known and ref.name not in known else ""),
                     ref.name_span)
            return None
        rank = None
        if ref.rank is not None:
            rank = self.expr(ref.rank, env, "a rank")
            if not buf.symmetric:
                self.err(Codes.NOT_SYMMETRIC, f"{buf.name} is not symmetric, so other ranks' instances "
                         f"do not exist: declare it `{buf.name}: sym ...`", ref.span,
                         Note(f"{buf.name} is declared here", buf.span))
                return None
        return ir.Region(buf.name, lo, length, rank, ref.span, part, sub), buf

    def _computable(self, b: ir.Buffer, what: str, span: Span) -> None:
        """int8 is moved, never computed on: A2/A3 vector arithmetic and the kernels' float
        accumulation have no int8 (runtime/README.md, the A2/A3 type rows)."""
        if b.dtype is ir.DType.I8:
            self.err(Codes.BAD_TYPE, f"{what} computes on {b.name}, which holds i8: int8 rows can only be "
                     "moved (copies, place); dequantise them before computing", span,
                     Note(f"{b.name} is declared here", b.span))

    def _same_type(self, a: ir.Buffer, b: ir.Buffer, span: Span) -> None:
        if a.type_text != b.type_text and not {a.name, b.name} & self.bad_types:
            self.err(Codes.BAD_TYPE, f"{a.name} holds {a.type_text} but {b.name} holds {b.type_text}",
                     span)


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
    return set()
