"""Semantic checks and lowering from the syntax tree to the schedule IR.

Names, types, symmetric memory, engines and contracts are checked here; everything that needs a
concrete world size (shapes, races, deadlocks, the contract itself) is the verifier's job.
All problems of a schedule are collected and raised together.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ast, ir
from .diagnostics import Codes, Diagnostic, Note, Span, StrataError, error

RESERVED = {"rank", "world"}


@dataclass(frozen=True)
class _View:
    buffer: str
    parts: ir.IExpr
    span: Span


class _Lowering:
    def __init__(self, sched: ast.Schedule, source_name: str):
        self.s = sched
        self.source_name = source_name
        self.diags: list[Diagnostic] = []
        self.params: dict[str, ir.Buffer] = {}
        self.views: dict[str, _View] = {}
        self.flags: dict[str, ir.Flag] = {}
        self.sizes: list[str] = []
        self.stage_count = 0
        self.loop_vars_seen: set[str] = set()
        self.bad_types: set[str] = set()   # parameters whose element type was already reported

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
                self.err(Codes.UNKNOWN_NAME, f"unknown name {e.id!r} in {what}{hint}", e.span)
                return ir.Const(0)
            return ir.Var(e.id)
        if isinstance(e, ast.Neg):
            return ir.Bin(ir.BinKind.SUB, ir.Const(0), self.expr(e.operand, allowed, what))
        kind = {"+": ir.BinKind.ADD, "-": ir.BinKind.SUB, "*": ir.BinKind.MUL,
                "/": ir.BinKind.DIV, "%": ir.BinKind.MOD}[e.op]
        return ir.Bin(kind, self.expr(e.lhs, allowed, what), self.expr(e.rhs, allowed, what))

    # ---- declarations
    def lower(self) -> ir.Schedule | None:
        s = self.s
        size_names: set[str] = set()
        for p in s.params:
            size_names |= _names(p.size)
        size_names -= RESERVED
        self.sizes = sorted(size_names)
        size_env = set(self.sizes) | {"world"}
        typevar_seen: dict[str, Span] = {}
        for p in s.params:
            if p.name in self.params or p.name in RESERVED:
                self.err(Codes.DUPLICATE_NAME, f"parameter {p.name!r} is already defined", p.span)
                continue
            dtype = ir.DType.parse(p.dtype)
            typevar = None
            if dtype is None:
                typevar = p.dtype
                if not p.dtype[:1].isupper():
                    # still declare the parameter, so its uses and the contract do not cascade
                    self.err(Codes.BAD_TYPE, f"unknown element type {p.dtype!r}: use f32, f16, bf16, "
                             "i32 or a type variable (a capitalised name such as T)", p.dtype_span)
                    self.bad_types.add(p.name)
                else:
                    typevar_seen.setdefault(p.dtype, p.dtype_span)
            size = self.expr(p.size, size_env, f"the size of {p.name}")
            self.params[p.name] = ir.Buffer(p.name, dtype, typevar, p.symmetric, size, p.span)
        if len(typevar_seen) > 1:
            names = sorted(typevar_seen)
            self.err(Codes.BAD_TYPE, f"one type variable per schedule is supported, found {names}",
                     typevar_seen[names[1]])
        for sym in self.sizes:
            if not any(isinstance(p.size, ir.Var) and p.size.name == sym for p in self.params.values()):
                self.err(Codes.BAD_SIZE, f"size {sym!r} must be the whole size of some parameter, so "
                         "it can be read off the tensors at a call", s.span)
        contract = self.contract(s.contract)
        body = self.block(s.body, top=True, loop_vars=())
        if self.diags or contract is None:
            raise StrataError(self.diags)
        return ir.Schedule(s.name, self.source_name, tuple(self.params.values()), tuple(self.sizes),
                           tuple(self.flags.values()), contract, tuple(body), s.span)

    def contract(self, c: ast.Contract) -> ir.Contract | None:
        kinds = {k.value: k for k in ir.ContractKind}
        if c.kind not in kinds:
            self.err(Codes.BAD_CONTRACT, f"unknown contract {c.kind!r}; known: {', '.join(kinds)}",
                     c.span)
            return None
        kind = kinds[c.kind]
        for a in c.args:
            for n in (a.name, a.out):
                if n and n not in self.params and n not in {o.value for o in ir.ReduceOp}:
                    self.err(Codes.UNKNOWN_NAME, f"the contract names {n!r}, which is not a parameter",
                             a.span)
        if self.diags:
            return None
        if kind is ir.ContractKind.ALLREDUCE:
            ok = (len(c.args) == 2 and c.args[0].out is None and c.args[0].name in self.params
                  and c.args[1].name in {o.value for o in ir.ReduceOp})
            if not ok:
                self.err(Codes.BAD_CONTRACT, "allreduce takes a buffer and an operation: "
                         "allreduce(x, sum|max|min)", c.span)
                return None
            return ir.Contract(kind, (c.args[0].name,), (c.args[0].name,),
                               ir.ReduceOp(c.args[1].name), c.span)
        ok = len(c.args) == 1 and c.args[0].out is not None
        if not ok:
            self.err(Codes.BAD_CONTRACT, "allgather takes input -> output: allgather(x -> out)", c.span)
            return None
        src, dst = self.params[c.args[0].name], self.params[c.args[0].out]
        if src.type_text != dst.type_text and not {src.name, dst.name} & self.bad_types:
            self.err(Codes.BAD_TYPE, f"allgather needs {src.name} and {dst.name} of one element type",
                     c.span)
        return ir.Contract(kind, (src.name,), (dst.name,), None, c.span)

    # ---- statements
    def block(self, stmts, top: bool, loop_vars: tuple[str, ...], engine: ir.Engine | None = None):
        out: list[ir.Op] = []
        for st in stmts:
            op = self.stmt(st, top, loop_vars, engine)
            if op is not None:
                out.append(op)
        return out

    def stmt(self, st, top, loop_vars, engine):
        in_stage = engine is not None
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.SplitCall):
            self.view(st, top)
            return None
        if isinstance(st, ast.FlagDecl):
            if not top:
                self.err(Codes.BAD_REF, "flags are declared at the top of a schedule", st.span)
                return None
            if st.name in self.flags or st.name in self.params or st.name in self.views:
                self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.span)
                return None
            self.flags[st.name] = ir.Flag(st.name, self.expr(st.size, set(self.sizes) | {"world"},
                                                            f"the size of flag {st.name}"), st.span)
            return None
        if isinstance(st, ast.Barrier):
            if in_stage or loop_vars:
                self.err(Codes.BAD_ENGINE, "a barrier is a statement of its own, outside stages and "
                         "loops", st.span)
                return None
            return ir.Barrier(st.span)
        if isinstance(st, ast.Stage):
            if in_stage:
                self.err(Codes.BAD_ENGINE, "stages do not nest", st.span)
                return None
            if loop_vars:
                self.err(Codes.BAD_ENGINE, "put the loop inside the stage: `on ENGINE: for ...`",
                         st.span)
                return None
            eng = ir.Engine(st.engine)
            body = self.block(st.body, top=False, loop_vars=loop_vars, engine=eng)
            self.stage_count += 1
            return ir.Stage(eng, tuple(body), st.span, self.stage_count)
        if isinstance(st, ast.For):
            if (st.var in loop_vars or st.var in RESERVED or st.var in self.params or st.var in self.views
                    or st.var in self.flags):
                self.err(Codes.DUPLICATE_NAME, f"loop variable {st.var!r} shadows another name",
                         st.var_span)
                return None
            self.loop_vars_seen.add(st.var)
            body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=engine)
            return ir.Loop(st.var, ir.Domain(st.domain), tuple(body), st.span)
        if isinstance(st, (ast.Signal, ast.Wait)):
            return self.sync(st, loop_vars, in_stage)
        if isinstance(st, ast.Assign):
            if not in_stage:
                self.err(Codes.BAD_ENGINE, "data movement needs an engine: write it inside "
                         "`on aiv:`, `on sdma:` or `on auto:`", st.span)
                return None
            return self.move(st, loop_vars, engine)
        raise TypeError(st)  # pragma: no cover

    def view(self, st: ast.Assign, top: bool) -> None:
        t, call = st.target, st.value
        if not top or t.selector is not None or t.rank is not None:
            self.err(Codes.BAD_REF, "a split is named at the top of a schedule: `part = split(x, k)`",
                     st.span)
            return
        if t.name in self.params or t.name in self.views or t.name in self.flags or t.name in RESERVED:
            self.err(Codes.DUPLICATE_NAME, f"{t.name!r} is already defined", t.name_span)
            return
        if call.buffer not in self.params:
            self.err(Codes.UNKNOWN_NAME, f"unknown buffer {call.buffer!r}", call.buffer_span)
            return
        parts = self.expr(call.parts, set(self.sizes) | {"world"}, "the number of parts")
        self.views[t.name] = _View(call.buffer, parts, st.span)

    def sync(self, st, loop_vars, in_stage):
        kind = "signal" if isinstance(st, ast.Signal) else "wait"
        if in_stage:
            self.err(Codes.BAD_ENGINE, f"{kind} is a statement of its own, outside stages: flags "
                     "travel after the stage's data is complete", st.span)
            return None
        ref = st.ref
        if ref.name not in self.flags:
            self.err(Codes.UNKNOWN_NAME, f"{ref.name!r} is not a flag (declare it: flag {ref.name}[world])",
                     ref.name_span)
            return None
        if not isinstance(ref.selector, ast.Index):
            self.err(Codes.BAD_REF, f"pick one slot of flag {ref.name}: {ref.name}[i]", ref.span)
            return None
        env = {"rank", "world", *self.sizes, *loop_vars}
        index = self.expr(ref.selector.index, env, "a flag index")
        if isinstance(st, ast.Signal):
            if ref.rank is None:
                self.err(Codes.BAD_REF, f"say whose flag is set: signal {ref.name}[i]@p", ref.span)
                return None
            return ir.Signal(ref.name, index, self.expr(ref.rank, env, "a rank"), st.span)
        if ref.rank is not None:
            self.err(Codes.BAD_REF, "a rank waits on its own flags only: drop the @", ref.span)
            return None
        return ir.Wait(ref.name, index, st.span)

    def region(self, ref: ast.Ref, loop_vars, role: str) -> tuple[ir.Region, ir.Buffer] | None:
        env = {"rank", "world", *self.sizes, *loop_vars}
        if ref.name in self.views:
            view = self.views[ref.name]
            buf = self.params[view.buffer]
            if not isinstance(ref.selector, ast.Index):
                self.err(Codes.BAD_REF, f"{ref.name} is a split of {view.buffer}; pick a part: "
                         f"{ref.name}[i]", ref.span)
                return None
            index = self.expr(ref.selector.index, env, "a part index")
            lo, length = ir.split_part(buf.size, view.parts, index)
        elif ref.name in self.params:
            buf = self.params[ref.name]
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
        return ir.Region(buf.name, lo, length, rank, ref.span), buf

    def move(self, st: ast.Assign, loop_vars, engine: ir.Engine):
        dst = self.region(st.target, loop_vars, "destination")
        if isinstance(st.value, ast.ReduceCall):
            rc = st.value
            if engine is ir.Engine.SDMA:
                self.err(Codes.BAD_ENGINE, "SDMA cannot compute: reductions run `on aiv`", rc.span)
                return None
            if (rc.var in loop_vars or rc.var in RESERVED or rc.var in self.params
                    or rc.var in self.views or rc.var in self.flags):
                self.err(Codes.DUPLICATE_NAME, f"{rc.var!r} shadows another name", rc.span)
                return None
            reported = len(self.diags)
            src = self.region(rc.operand, loop_vars + (rc.var,), "source")
            if dst is None or src is None:
                return None
            self._same_type(dst[1], src[1], st.span)
            used = (src[0].rank.names() if src[0].rank else frozenset()) | src[0].lo.names()
            if len(self.diags) == reported and rc.var not in used:
                self.err(Codes.BAD_REF, f"the reduction's operand does not depend on {rc.var}, so every "
                         "term is the same element", rc.operand.span)
            op = ir.ReduceOp(rc.op)
            return ir.Reduce(dst[0], op, src[0], rc.var, ir.Domain(rc.domain), st.span)
        src = self.region(st.value, loop_vars, "source")
        if dst is None or src is None:
            return None
        self._same_type(dst[1], src[1], st.span)
        if engine is ir.Engine.SDMA and dst[0].rank is not None and src[0].rank is not None:
            self.err(Codes.BAD_ENGINE, "an SDMA copy reads or writes the running rank's memory: one "
                     "side must be local (no @)", st.span)
            return None
        return ir.Copy(dst[0], src[0], st.span)

    def _same_type(self, a: ir.Buffer, b: ir.Buffer, span: Span) -> None:
        if a.type_text != b.type_text and not {a.name, b.name} & self.bad_types:
            self.err(Codes.BAD_TYPE, f"{a.name} holds {a.type_text} but {b.name} holds {b.type_text}",
                     span)


def _names(e: ast.Expr) -> set[str]:
    if isinstance(e, ast.Name):
        return {e.id}
    if isinstance(e, ast.BinOp):
        return _names(e.lhs) | _names(e.rhs)
    if isinstance(e, ast.Neg):
        return _names(e.operand)
    return set()


def check_contract_ops(s: ir.Schedule) -> list[Diagnostic]:
    """A reduction's operation must be the contract's."""
    diags = []

    def walk(ops):
        for op in ops:
            if isinstance(op, (ir.Stage, ir.Loop)):
                walk(op.body)
            elif isinstance(op, ir.Reduce) and s.contract.op is not None and op.op is not s.contract.op:
                diags.append(error(Codes.CONTRACT, f"this reduces with {op.op.value}, but the schedule "
                                   f"implements {s.contract}", op.span,
                                   Note("the contract is declared here", s.contract.span)))
    walk(s.body)
    return diags


def lower(module: ast.Module) -> list[ir.Schedule]:
    diags: list[Diagnostic] = []
    out: list[ir.Schedule] = []
    names: dict[str, ast.Schedule] = {}
    for sched in module.schedules:
        if sched.name in names:
            diags.append(error(Codes.DUPLICATE_NAME, f"schedule {sched.name!r} is defined twice",
                               sched.name_span, Note("first defined here", names[sched.name].name_span)))
            continue
        names[sched.name] = sched
        try:
            lowered = _Lowering(sched, module.source_name).lower()
        except StrataError as exc:
            diags.extend(exc.diagnostics)
            continue
        more = check_contract_ops(lowered)
        if more:
            diags.extend(more)
            continue
        out.append(lowered)
    if diags:
        raise StrataError(diags)
    return out
