"""Declarations: a schedule's parameters and contract, scratch buffers, splits (views), lets and
world constraints (`requires`).

`Decls.lower` is the walk of one schedule: it declares the parameters (tensors with their element
types and shapes, rank and redop scalars), checks the sizes can be read off the shapes, checks the
contract, then lowers the body (`block`, in the package's `_Lowering`) and builds the ir.Schedule.

In: ast.Schedule parts (Param, Contract, ScratchDecl, Assign of a split, Let, Requires). Out: the
declarations recorded in the scope (params, views, lets, requires) and the ir.Contract; the whole
schedule as ir.Schedule, or a StrataError with every diagnostic of the schedule.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes, Span, StrataError
from stratac.lang import ast
from stratac.lang.sema.scope import CALL_OPTIONS, RESERVED, Scope, _names, _text, _View


class Decls(Scope):
    # ---- declarations
    def lower(self) -> ir.Schedule | None:
        s = self.s
        size_names: set[str] = set()
        for p in s.params:
            for d in p.dims or ():
                size_names |= _names(d)
        size_names -= RESERVED | {p.name for p in s.params if p.dims is None}   # scalars are not sizes
        self.sizes = sorted(size_names)
        size_env = set(self.sizes) | {"world"}
        typevar_seen: dict[str, Span] = {}
        for p in s.params:
            if self.taken(p.name):
                self.err(Codes.DUPLICATE_NAME, f"parameter {p.name!r} is already defined", p.span)
                continue
            if p.name in CALL_OPTIONS:   # still declared, so its uses and the contract do not cascade
                name = Span(p.span.source, p.span.line, p.span.col, p.span.line, p.span.col + len(p.name))
                self.err(Codes.DUPLICATE_NAME, f"parameter {p.name!r} would clash with the option "
                         f"`{p.name}=` of a call from Python ({s.name}(..., {p.name}=8) picks the vector "
                         "cores): name it otherwise", name)
            if p.dims is None:
                kinds = {k.value: k for k in ir.ScalarKind}
                if p.dtype not in kinds or p.symmetric:
                    self.err(Codes.BAD_TYPE, f"{p.name} has no size, so it is a scalar: its type is "
                             "`rank`, `divisor` or `redop` (a tensor needs a size: T[n])", p.dtype_span)
                    continue
                self.scalars[p.name] = ir.Scalar(p.name, kinds[p.dtype], p.span)
                continue
            dtype = ir.DType.parse(p.dtype)
            typevar = None
            if dtype is None:
                typevar = p.dtype
                if not p.dtype[:1].isupper():
                    # still declare the parameter, so its uses and the contract do not cascade
                    self.err(Codes.BAD_TYPE, f"unknown element type {p.dtype!r}: use f32, f16, bf16, "
                             "i32, i8 or a type variable (a capitalised name such as T)", p.dtype_span)
                    self.bad_types.add(p.name)
                else:
                    typevar_seen.setdefault(p.dtype, p.dtype_span)
            size, shape = self.shape(p.dims, size_env, p.name, p.span)
            self.params[p.name] = ir.Buffer(p.name, dtype, typevar, p.symmetric, size, p.span,
                                            shape=shape)
        if len(typevar_seen) > 1:
            names = sorted(typevar_seen)
            self.err(Codes.BAD_TYPE, f"one type variable per schedule is supported, found {names}",
                     typevar_seen[names[1]])
            self.bad_types |= {p.name for p in self.params.values() if p.typevar not in (None, names[0])}
        _, unread = ir.size_rules(tuple(self.params.values()), tuple(self.sizes))
        for sym in unread if not self.diags else ():   # not after a size refused (it reads nothing)
            self.err(Codes.BAD_SIZE, f"size {sym!r} must be read off some parameter's shape: some "
                     f"extent must be {sym} times a factor of world and of sizes read elsewhere (such as "
                     f"{sym}, {sym} * world or experts * {sym})", s.span)
        if sum(x.kind is ir.ScalarKind.REDOP for x in self.scalars.values()) > 1:
            self.err(Codes.BAD_TYPE, "one redop parameter per schedule is supported", s.span)
        contract = self.contract(s.contract)
        # a MoE dispatch or combine: its calls take a mask of live ranks (ir.takes_mask)
        self.masked = contract is not None and contract.kind in ir.MASKED_KINDS
        self.routed = contract is not None and contract.kind.moe
        if contract is not None and contract.kind.moe and self.teams:
            # a MoE call takes a mask of live ranks, and a team's places are not ranks: the masked
            # variants of team loops and team barriers are not built (dsl/README.md, "Teams")
            self.err(Codes.BAD_REF, f"a {contract.kind.value} schedule cannot declare teams (its calls "
                     "take a mask of live ranks, which teams do not follow yet)",
                     next(iter(self.teams.values())).span)
        if self.routed:
            for x in self.scalars.values():
                if x.kind is ir.ScalarKind.DIVISOR:
                    self.err(Codes.BAD_REF, f"a {contract.kind.value} schedule cannot take a divisor "
                             f"parameter yet ({x.name}): its calls and `stratac run` do not pass one",
                             x.span)
        body = self.block(s.body, top=True, loop_vars=())
        if self.diags or contract is None:
            raise StrataError(self.diags)
        return ir.Schedule(s.name, self.source_name, tuple(self.params.values()), tuple(self.sizes),
                           tuple(self.flags.values()), contract, tuple(body), s.span,
                           scalars=tuple(self.scalars.values()), requires=tuple(self.requires),
                           teams=tuple(self.teams.values()), calls=tuple(self.calls), elem=self.elem)

    # kind: (takes an op, takes a root, may be in place, may be out of place)

    CONTRACTS = {
        ir.ContractKind.ALLREDUCE: (True, False, True, True),
        ir.ContractKind.ALLGATHER: (False, False, True, True),
        ir.ContractKind.REDUCESCATTER: (True, False, True, True),
        ir.ContractKind.BROADCAST: (False, True, True, True),
        ir.ContractKind.REDUCE: (True, True, True, True),
        ir.ContractKind.ALLTOALL: (False, False, True, True),
    }

    def contract(self, c: ast.Contract) -> ir.Contract | None:
        kinds = {k.value: k for k in ir.ContractKind}
        if c.kind not in kinds:
            self.err(Codes.BAD_CONTRACT, f"unknown contract {c.kind!r}; known: {', '.join(kinds)}",
                     c.span)
            return None
        kind = kinds[c.kind]
        if kind.moe:
            return self.moe_contract(kind, c)
        takes_op, takes_root, in_place, out_of_place = self.CONTRACTS[kind]
        form = [f"{c.kind}(x{' -> out' if not in_place else ''}"
                + (", sum|max|min|OP" if takes_op else "") + (", ROOT" if takes_root else "") + ")"]
        usage = f"{c.kind} is written {form[0]}" + (" (or x -> out)" if in_place and out_of_place else "")
        if not c.args:
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        data, rest = c.args[0], c.args[1:]
        if data.form is not None:
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        for n in (data.name, data.out):
            if n and n not in self.params:
                self.err(Codes.UNKNOWN_NAME, f"the contract names {n!r}, which is not a tensor parameter",
                         data.span)
                return None
        if (data.out is None and not in_place) or (data.out is not None and not out_of_place):
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        op, root = None, None
        for a in rest:
            x = self.scalars.get(a.name)
            if a.form is not None:
                self.err(Codes.BAD_CONTRACT, f"unexpected {a.form}({a.name}): {usage}", a.span)
                return None
            if a.out is None and (a.name in {o.value for o in ir.ReduceOp}
                                  or (x and x.kind is ir.ScalarKind.REDOP)) and takes_op and op is None:
                op = self.op(a.name, a.span)
            elif a.out is None and x and x.kind is ir.ScalarKind.RANK and takes_root and root is None:
                root = a.name
            else:
                self.err(Codes.BAD_CONTRACT, f"unexpected {a.name!r}: {usage}", a.span)
                return None
        if (takes_op and op is None) or (takes_root and root is None):
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        src = self.params[data.name]
        dst = self.params[data.out] if data.out else src
        if src.type_text != dst.type_text and not {src.name, dst.name} & self.bad_types:
            self.err(Codes.BAD_TYPE, f"{c.kind} needs {src.name} and {dst.name} of one element type",
                     c.span)
        return ir.Contract(kind, (src.name,), (dst.name,), op, c.span, root)

    def shape(self, dims, env: set[str], name: str, span: Span) -> tuple[ir.IExpr, tuple[ir.IExpr, ...]]:
        """(the element count, the shape) of a declaration T[d] or T[rows, cols]."""
        if len(dims) > 2:
            self.err(Codes.BAD_SIZE, f"{name} has {len(dims)} extents; tensors have one or two "
                     "(T[n] or T[rows, cols])", span)
        ds = tuple(self.expr(d, env, f"the size of {name}") for d in dims)
        size = ds[0]
        for d in ds[1:]:
            size = ir.Bin(ir.BinKind.MUL, size, d)
        return ir.simplify(size), (ds if len(ds) > 1 else ())

    def scratch_decl(self, st: ast.ScratchDecl, top: bool) -> None:
        if not top:
            self.err(Codes.BAD_REF, "scratch buffers are declared at the top of a schedule", st.span)
            return
        if self.taken(st.name):
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.span)
            return
        dtype = ir.DType.parse(st.dtype)
        typevar = None
        if dtype is None:
            if st.dtype not in {p.typevar for p in self.params.values() if p.typevar}:
                self.err(Codes.BAD_TYPE, f"unknown element type {st.dtype!r}: use f32, f16, bf16, i32, i8 "
                         "or the schedule's type variable", st.dtype_span)
                return
            typevar = st.dtype
        size, shape = self.shape(st.dims, self.static_env(), st.name, st.span)
        self.params[st.name] = ir.Buffer(st.name, dtype, typevar, st.symmetric, size, st.span,
                                         scratch=True, shape=shape)

    def view(self, st: ast.Assign, top: bool) -> None:
        t, call = st.target, st.value
        if not top or t.selector is not None or t.rank is not None:
            self.err(Codes.BAD_REF, "a split is named at the top of a schedule: `part = split(x, k)`",
                     st.span)
            return
        if self.taken(t.name):
            self.err(Codes.DUPLICATE_NAME, f"{t.name!r} is already defined", t.name_span)
            return
        parent = self.views.get(call.buffer)
        if parent is not None and parent.of is not None:
            self.err(Codes.BAD_REF, f"{call.buffer} already splits the parts of {parent.of}; split "
                     "a buffer or a split of one (two levels)", call.buffer_span)
            return
        if call.buffer not in self.params and parent is None:
            self.err(Codes.UNKNOWN_NAME, f"unknown buffer {call.buffer!r}", call.buffer_span)
            return
        parts = self.expr(call.parts, self.static_env(), "the number of parts")
        if parent is not None:   # every part of the parent split again into `parts` chunks
            self.views[t.name] = _View(parent.buffer, parts, st.span, of=call.buffer)
        else:
            self.views[t.name] = _View(call.buffer, parts, st.span)

    def let(self, st: ast.Let, loop_vars, in_stage: bool = False) -> ir.Local | None:
        """A let is substituted where it is used (outside a stage it is also an inline ir.Local,
        which names it in the kernel), unless its value reads a var outside a stage: then it is a
        local holding the value the var had when the let ran (a later `set` does not change it)."""
        if st.name in loop_vars or self.taken(st.name) or st.name in self.sizes:
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.name_span)
            return None
        value = ir.simplify(self.expr(st.value, self.env(loop_vars), f"let {st.name}"))
        if in_stage or not value.names() & self.locals.keys():
            self.lets[st.name] = value
            if in_stage or not isinstance(value, (ir.Bin, ir.Sel)):
                return None
            # substituted, and named in the kernel (ir.Local.inline)
            return ir.Local(st.name, value, st.span, mutable=False, inline=True)
        self.lets[st.name] = ir.Var(st.name, local=True)
        self.locals[st.name] = False
        return ir.Local(st.name, value, st.span, mutable=False)

    def var(self, st: ast.VarDecl | ast.SetVar, loop_vars, in_stage: bool) -> ir.Local | ir.Set | None:
        """`var v = e` declares loop state; `set v = e` changes it. Both run on every core of the
        rank, outside stages (a stage's moves are counted and then made, each core its share:
        their values must not change inside it). `var t[K] = e` declares an array of K integers,
        `set t[i] = e` changes one: K is a size every rank agrees on (world, the size symbols and
        the lets of those), at most ir.ARRAY_CAPACITY (checked at every instance)."""
        decl = isinstance(st, ast.VarDecl)
        word = "var" if decl else "set"
        if in_stage:
            self.err(Codes.BAD_REF, f"`{word} {st.name}` inside a stage: a var is declared and set "
                     "outside stages (a stage's moves read it; they do not change it)", st.span)
            return None
        if decl and (st.name in loop_vars or self.taken(st.name) or st.name in self.sizes):
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.name_span)
            return None
        if not decl and not self.locals.get(st.name, False):
            what = ("a let: declare it with `var` to change it" if st.name in self.lets
                    and st.name not in loop_vars else
                    "a loop variable: the loop sets it" if st.name in loop_vars else
                    "not a var in scope: declare it first with `var`")
            self.err(Codes.UNKNOWN_NAME, f"`set {st.name}`: {st.name} is {what}", st.name_span)
            return None
        array = st.size if decl else st.index
        if not decl and (array is not None) != (st.name in self.arrays):
            form = (f"an array of {ir.bare(self.arrays[st.name])} integers: set one element, "
                    f"`set {st.name}[i] = ...`" if st.name in self.arrays
                    else f"one integer: `set {st.name} = ...`")
            self.err(Codes.BAD_REF, f"`set {st.name}`: {st.name} is {form}", st.span)
            return None
        value = ir.simplify(self.expr(st.value, self.env(loop_vars), f"{word} {st.name}"))
        if not decl:
            index = None if array is None else ir.simplify(
                self.expr(array, self.env(loop_vars), f"the index of {st.name}"))
            return ir.Set(st.name, value, st.span, index)
        size = None if array is None else ir.simplify(self.expr(
            array, self.static_env(), f"the size of array {st.name} (every rank's the same)"))
        self.lets[st.name] = ir.Var(st.name, local=True)
        self.locals[st.name] = True
        if size is not None:
            self.arrays[st.name] = size
        return ir.Local(st.name, value, st.span, mutable=True, size=size)

    def requirement(self, st: ast.Requires, top: bool) -> None:
        if not top:
            self.err(Codes.BAD_REF, "a world constraint (`requires ...`) is written at the top of a "
                     "schedule", st.span)
            return
        reported = len(self.diags)
        cond = self.cond(st.cond, (), allowed={"world"}, what="a world constraint (on world alone)")
        if len(self.diags) == reported:
            self.requires.append(ir.Requirement(cond, _text(st.cond.span), st.span))
