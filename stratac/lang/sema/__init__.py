"""Semantic checks and lowering from the syntax tree to the schedule IR.

Names, types, symmetric memory, engines and contracts are checked here; everything that needs a
concrete world size (shapes, races, deadlocks, the contract itself) is the verifier's job.
All problems of a schedule are collected and raised together.

In: the syntax tree of one file (stratac.lang.ast). Out: its schedules as IR, or a StrataError.

One walk of the tree with one scope: `_Lowering` is that scope (`scope.Scope`: names, views, loop
variables, the engine of the enclosing stage, the diagnostics) with the checks of each family of
statements mixed in, so the checks and the lowering of a statement read the same scope in the same
place. `block` and `stmt` below walk the statements and hand each to its family:
`decls` (parameters, contract, scratch, splits, lets, requires), `moves` (stages, copies,
reductions, reduce on write, async/await), `sync` (flags, signal, wait, barriers), `loops` (loops,
step loops, team loops, team declarations), `calls` (composition), `moe` (MoE contracts and routing).
`lower` lowers every schedule of a file, callees on demand, and refuses duplicate names and
recursive calls.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, StrataError, error
from stratac.lang import ast
from stratac.lang.sema.calls import Calls
from stratac.lang.sema.decls import Decls
from stratac.lang.sema.loops import Loops
from stratac.lang.sema.moe import Moe
from stratac.lang.sema.moves import Moves
from stratac.lang.sema.scope import CALL_OPTIONS, RESERVED, Scope
from stratac.lang.sema.sync import Sync

__all__ = ["CALL_OPTIONS", "RESERVED", "Scope", "check_contract_ops", "lower"]


class _Lowering(Decls, Moves, Sync, Loops, Calls, Moe):
    """One schedule's lowering: the scope with every family's checks (`lower()` is Decls.lower)."""

    # ---- statements
    def block(self, stmts, top: bool, loop_vars: tuple[str, ...], engine: ir.Engine | None = None):
        out: list[ir.Node] = []
        outer = dict(self.lets)     # a let or var is visible to the rest of its block only
        outer_locals, outer_arrays = dict(self.locals), dict(self.arrays)
        self.pending.append({})
        for st in stmts:
            if isinstance(st, ast.CallStmt):
                start = len(out)
                out.extend(self.call(st, top, engine))
                if len(out) > start:
                    self.calls[-1] = ir.CallSite(**{**vars(self.calls[-1]), "start": start,
                                                    "end": len(out)})
                continue
            op = self.stmt(st, top, loop_vars, engine)
            if op is not None:
                out.append(op)
        self.lets = outer
        self.locals, self.arrays = outer_locals, outer_arrays
        for handle, span in self.pending.pop().items():
            self.err(Codes.BAD_REF, f"the asynchronous stage {handle} is never awaited: write "
                     f"`await {handle}` after it in the same block (its copies must complete before "
                     "the block ends)", span)
        return out

    def stmt(self, st, top, loop_vars, engine):
        in_stage = engine is not None
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.SplitCall):
            self.view(st, top)
            return None
        if isinstance(st, ast.FlagDecl):
            self.flag_decl(st, top)
            return None
        if isinstance(st, ast.ScratchDecl):
            self.scratch_decl(st, top)
            return None
        if isinstance(st, ast.Let):
            return self.let(st, loop_vars, in_stage)
        if isinstance(st, (ast.VarDecl, ast.SetVar)):
            return self.var(st, loop_vars, in_stage)
        if isinstance(st, ast.Requires):
            self.requirement(st, top)
            return None
        if isinstance(st, ast.TeamDecl):
            self.team_decl(st, top)
            return None
        if isinstance(st, ast.If):
            cond = self.cond(st.cond, loop_vars)
            then = self.block(st.then, top=False, loop_vars=loop_vars, engine=engine)
            orelse = self.block(st.orelse, top=False, loop_vars=loop_vars, engine=engine)
            return ir.If(cond, tuple(then), tuple(orelse), st.span)
        if isinstance(st, ast.Accum):
            if not in_stage:
                self.err(Codes.BAD_ENGINE, "data movement needs an engine: write it inside `on aiv:`",
                         st.span)
                return None
            return self.accum(st, loop_vars, engine)
        if isinstance(st, ast.Barrier):
            return self.barrier(st, loop_vars, in_stage)
        if isinstance(st, ast.Stage):
            return self.stage(st, loop_vars, in_stage)
        if isinstance(st, ast.Await):
            return self.await_(st, in_stage)
        if isinstance(st, ast.For):
            return self.loop(st, loop_vars, engine)
        if isinstance(st, (ast.Signal, ast.Wait)):
            return self.sync(st, loop_vars, in_stage)
        if isinstance(st, ast.Assign):
            if not in_stage:
                self.err(Codes.BAD_ENGINE, "data movement needs an engine: write it inside "
                         "`on aiv:`, `on sdma:` or `on auto:`", st.span)
                return None
            if isinstance(st.value, ast.RouteCall):
                return self.route(st, loop_vars, engine)
            return self.move(st, loop_vars, engine)
        raise TypeError(st)  # pragma: no cover


def check_contract_ops(s: ir.Schedule) -> list[Diagnostic]:
    """A reduction's operation must be the contract's."""
    diags = []

    def walk(ops):
        for op in ops:
            if isinstance(op, (ir.Stage, ir.Loop)):
                walk(op.body)
            elif isinstance(op, ir.If):
                walk(op.then)
                walk(op.orelse)
            elif isinstance(op, (ir.Reduce, ir.ReduceList, ir.Accumulate)) and s.contract.op is not None \
                    and op.op != s.contract.op:
                diags.append(error(Codes.CONTRACT, f"this reduces with {op.op.value}, but the schedule "
                                   f"implements {s.contract}", op.span,
                                   Note("the contract is declared here", s.contract.span)))
    walk(s.body)
    return diags


def lower(module: ast.Module, imported: dict | None = None) -> list[ir.Schedule]:
    """The file's schedules as IR. `imported`: {name: (IR, syntax tree, import)} of the schedules
    its imports define (stratac.lang.modules), which its schedules may call."""
    imported = imported or {}
    diags: list[Diagnostic] = []
    names: dict[str, ast.Schedule] = {}
    for sched in module.schedules:
        if sched.name in names:
            diags.append(error(Codes.DUPLICATE_NAME, f"schedule {sched.name!r} is defined twice",
                               sched.name_span, Note("first defined here", names[sched.name].name_span)))
            continue
        names[sched.name] = sched
    done: dict[str, ir.Schedule | None] = {}   # lowered (None: with errors, reported)
    active: list[str] = []                      # the schedules being lowered, callers first

    def get(name: str) -> ir.Schedule | None:
        if name not in done:
            active.append(name)
            try:
                lowered = _Lowering(names[name], module.source_name, resolve(name)).lower()
                more = check_contract_ops(lowered)
                if more:
                    diags.extend(more)
                    lowered = None
            except StrataError as exc:
                diags.extend(exc.diagnostics)
                lowered = None
            active.pop()
            done[name] = lowered
        return done[name]

    def resolve(caller: str):
        def callee(name: str):
            """(the callee's IR, its syntax tree), or why it cannot be called."""
            if name not in names:
                if name in imported:
                    return imported[name][0], imported[name][1]
                known = ", ".join(n for n in list(names) + list(imported) if n != caller) or "none"
                return f"no schedule {name!r} in this file or its imports (schedules: {known})"
            if name in active:
                chain = " -> ".join(active[active.index(name):] + [name])
                return f"{name} would call itself ({chain}): calls do not recurse"
            got = get(name)
            if got is None:
                return f"{name} has errors of its own (reported with it)"
            return got, names[name]
        return callee

    out = [s for s in (get(n) for n in names) if s is not None]
    if diags:
        raise StrataError(diags)
    return out
