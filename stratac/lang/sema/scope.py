"""The scope of one schedule's lowering, and what every family of statements reads through it.

One `Scope` per schedule holds everything declared so far (parameters, scratch buffers, views, flags,
scalars, lets, teams, sizes), the loop variables and step-loop bounds around the statement being
checked, the asynchronous stages still in flight per open block, and the diagnostics collected.
Its helpers turn syntax into IR against that scope: buffer regions (x, part[i], chunk[i][c],
x[lo:hi], ...@p), reduction operations, and the type checks shared by moves and routing; the
integer expressions and conditions are its base class's (`exprs.Expressions`).

In: syntax-tree nodes (stratac.lang.ast) and the scope's state. Out: IR expressions and regions
(stratac.ir), and diagnostics appended to `diags` (an error is reported once, in place; the caller
gets a neutral value such as Const(0) or None and goes on). The statement families (decls, moves,
sync, loops, calls, moe) are subclasses of Scope that the package's `_Lowering` combines, so every
statement reads and writes this one object.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, Span, error
from stratac.lang import ast
from stratac.lang.sema.exprs import Expressions, _names, _text  # noqa: F401 - the families import them here

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


class Scope(Expressions):
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
        # the names in scope that are locals of the rank (ir.Local): vars (True: `set` may change
        # them) and the lets of a var's value (False: the value when the let ran); lets holds each
        # as its ir.Var
        self.locals: dict[str, bool] = {}
        self.arrays: dict[str, ir.IExpr] = {}   # the vars among them that are arrays: name -> size
        # the locals, loop variables and handles that inlined calls declare (renamed: c1_next)
        self.inlined: set[str] = set()
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
                or name in self.scalars or name in self.lets or name in self.teams
                or name in self.inlined)

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
