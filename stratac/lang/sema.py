"""Semantic checks and lowering from the syntax tree to the schedule IR.

Names, types, symmetric memory, engines and contracts are checked here; everything that needs a
concrete world size (shapes, races, deadlocks, the contract itself) is the verifier's job.
All problems of a schedule are collected and raised together.

In: the syntax tree of one file (stratac.lang.ast). Out: its schedules as IR, or a StrataError.

Over 500 lines on purpose: it is one walk of the tree with one scope (names, views, loop
variables, the engine of the enclosing stage), and the checks and the lowering of each statement
read the same scope in the same place; split apart, every statement would be visited twice and the
scope passed around.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, Note, Span, StrataError, error
from stratac.ir import passes
from stratac.ir.inline import inline as ir_inline
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


class _Lowering:
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
        self.requires: list[ir.Requirement] = []
        self.teams: dict[str, ir.Team] = {}
        self.loop_bounds: list[tuple[ir.IExpr, ir.IExpr, Span]] = []   # of the step loops around
        # per open block, the asynchronous stages posted in it and not yet awaited: handle -> span
        self.pending: list[dict[str, Span]] = []

    def taken(self, name: str) -> bool:
        return (name in RESERVED or name in self.params or name in self.views or name in self.flags
                or name in self.scalars or name in self.lets or name in self.teams)

    def env(self, loop_vars=()) -> set[str]:
        """Names an index or rank expression may use."""
        ranks = {x.name for x in self.scalars.values() if x.kind is ir.ScalarKind.RANK}
        return {"rank", "world", *self.sizes, *ranks, *loop_vars, *self.lets}

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
                self.err(Codes.UNKNOWN_NAME, f"unknown name {e.id!r} in {what}{hint}", e.span)
                return ir.Const(0)
            return self.lets.get(e.id, ir.Var(e.id))
        if isinstance(e, ast.Neg):
            return ir.Bin(ir.BinKind.SUB, ir.Const(0), self.expr(e.operand, allowed, what))
        if isinstance(e, (ast.Attr, ast.Member)):
            return self.team_expr(e, allowed, what)
        if isinstance(e, ast.Call):
            arg = self.expr(e.arg, allowed, what)
            if e.fn != "log2":
                self.err(Codes.UNKNOWN_NAME, f"unknown function {e.fn!r}: the integer functions are "
                         "log2(x) (floor of the base-2 logarithm, x >= 1); for 2^k write 1 << k",
                         e.fn_span)
                return ir.Const(0)
            return self.checked(ir.log2(arg), e.span)
        kind = {"+": ir.BinKind.ADD, "-": ir.BinKind.SUB, "*": ir.BinKind.MUL,
                "/": ir.BinKind.DIV, "%": ir.BinKind.MOD, "<<": ir.BinKind.SHL, ">>": ir.BinKind.SHR,
                "&": ir.BinKind.AND, "^": ir.BinKind.XOR, "|": ir.BinKind.OR}[e.op]
        return self.checked(ir.Bin(kind, self.expr(e.lhs, allowed, what),
                                   self.expr(e.rhs, allowed, what)), e.span)

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
                self.err(Codes.BAD_REF, f"across(team) takes a block team; {of.name} is "
                         f"{of.kind}({ir.bare(of.t)})", st.arg.span)
                return
            self.teams[st.name] = ir.Team(st.name, "stride", of.t, st.span)
            return
        if st.kind not in ("block", "stride"):
            self.err(Codes.UNKNOWN_NAME, f"unknown kind of team {st.kind!r}: block(T) (consecutive "
                     "ranks), stride(T) (ranks T apart) or across(team)", st.kind_span)
            return
        reported = len(self.diags)
        size = ir.simplify(self.expr(st.arg, self.env(), "a team's size (an expression of world)"))
        if len(self.diags) > reported:
            return
        if size.names() - {"world"}:
            self.err(Codes.BAD_REF, f"a team's size is an expression of world alone (every rank must "
                     f"agree on it); this one uses {', '.join(sorted(size.names() - {'world'}))}",
                     st.arg.span)
            return
        if isinstance(size, ir.Const) and size.value < 1:
            self.err(Codes.BAD_WORLD, f"a team has at least one rank; this one would have "
                     f"{size.value}", st.arg.span)
            return
        self.teams[st.name] = ir.Team(st.name, st.kind, size, st.span)

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

    # ---- declarations
    def lower(self) -> ir.Schedule | None:
        s = self.s
        size_names: set[str] = set()
        for p in s.params:
            for d in p.dims or ():
                size_names |= _names(d)
        size_names -= RESERVED
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
                             "`rank` or `redop` (a tensor needs a size: T[n])", p.dtype_span)
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
        for sym in unread:
            self.err(Codes.BAD_SIZE, f"size {sym!r} must be read off some parameter's shape: some "
                     f"extent must be {sym} times a factor of world and of sizes read elsewhere (such as "
                     f"{sym}, {sym} * world or experts * {sym})", s.span)
        if sum(x.kind is ir.ScalarKind.REDOP for x in self.scalars.values()) > 1:
            self.err(Codes.BAD_TYPE, "one redop parameter per schedule is supported", s.span)
        contract = self.contract(s.contract)
        if contract is not None and contract.kind.moe and self.teams:
            # a MoE call takes a mask of live ranks, and a team's places are not ranks: the masked
            # variants of team loops and team barriers are not built (dsl/README.md, "Teams")
            self.err(Codes.BAD_REF, f"a {contract.kind.value} schedule cannot declare teams (its calls "
                     "take a mask of live ranks, which teams do not follow yet)",
                     next(iter(self.teams.values())).span)
        body = self.block(s.body, top=True, loop_vars=())
        if self.diags or contract is None:
            raise StrataError(self.diags)
        return ir.Schedule(s.name, self.source_name, tuple(self.params.values()), tuple(self.sizes),
                           tuple(self.flags.values()), contract, tuple(body), s.span,
                           scalars=tuple(self.scalars.values()), requires=tuple(self.requires),
                           teams=tuple(self.teams.values()), calls=tuple(self.calls))

    # kind: (takes an op, takes a root, may be in place, may be out of place)
    CONTRACTS = {
        ir.ContractKind.ALLREDUCE: (True, False, True, True),
        ir.ContractKind.ALLGATHER: (False, False, False, True),
        ir.ContractKind.REDUCESCATTER: (True, False, False, True),
        ir.ContractKind.BROADCAST: (False, True, True, True),
        ir.ContractKind.REDUCE: (True, True, True, True),
        ir.ContractKind.ALLTOALL: (False, False, False, True),
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

    MOE_FORMS = {
        ir.ContractKind.MOE_DISPATCH: "moe_dispatch(x, ids -> win, counts) or moe_dispatch(x, ids -> "
                                      "win, counts, CAPACITY), each optionally followed by "
                                      "rows that travel with the tokens: ..., xs -> ws",
        ir.ContractKind.MOE_COMBINE: "moe_combine(win, ids, weights, counts -> y) or moe_combine(win, "
                                     "ids, weights, counts -> y, CAPACITY)",
        ir.ContractKind.ALLTOALLV: "alltoallv(x, dest -> out, counts)",
    }

    def moe_contract(self, kind: ir.ContractKind, c: ast.Contract) -> ir.Contract | None:
        usage = f"{kind.value} is written {self.MOE_FORMS[kind]}"
        arrows = [i for i, a in enumerate(c.args) if a.out is not None]
        side_args = []
        if kind is ir.ContractKind.MOE_DISPATCH:
            # trailing `xs -> ws` pairs: rows that travel with the tokens (a quantised payload's scales)
            while len(arrows) > 1 and arrows[-1] == len(c.args) - 1 - len(side_args):
                side_args.insert(0, c.args[arrows.pop()])
        if len(arrows) != 1:
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        i = arrows[0]
        inputs = [a.name for a in c.args[:i + 1]]
        outputs = [c.args[i].out] + [a.name for a in c.args[i + 1:len(c.args) - len(side_args)]]
        capacity = None
        if outputs and outputs[-1] in self.sizes:
            capacity = outputs.pop()
        if kind is ir.ContractKind.ALLTOALLV and capacity is not None:
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        if kind.dispatch:
            # the window is symmetric where place writes it; a baseline copies into it locally
            roles = [("x", "T", False), ("ids", "i32", False)], [("win", "T", False), ("counts", "i32", True)]
        else:
            roles = [("win", "T", True), ("ids", "i32", False), ("weights", "f32", False),
                     ("counts", "i32", True)], [("y", "T", False)]
        if len(inputs) != len(roles[0]) or len(outputs) != len(roles[1]):
            self.err(Codes.BAD_CONTRACT, usage, c.span)
            return None
        payload = None
        for name, (role, dtype, sym) in zip(inputs + outputs, roles[0] + roles[1]):
            p = self.params.get(name)
            if p is None:
                self.err(Codes.UNKNOWN_NAME, f"the contract names {name!r}, which is not a tensor "
                         "parameter", c.span)
                return None
            if dtype == "T":
                tokens = (ir.DType.F32, ir.DType.F16, ir.DType.BF16) + ((ir.DType.I8,) if kind.dispatch else ())
                if p.dtype is not None and p.dtype not in tokens:
                    self.err(Codes.BAD_TYPE, f"{name} ({role}) carries the tokens: f32, f16, bf16"
                             f"{', i8' if kind.dispatch else ''} or a type variable", p.span)
                if payload is not None and p.type_text != payload.type_text and \
                        not {p.name, payload.name} & self.bad_types:
                    self.err(Codes.BAD_TYPE, f"{payload.name} and {name} must have one element type",
                             c.span)
                payload = payload or p
            elif p.type_text != dtype and p.name not in self.bad_types:
                self.err(Codes.BAD_TYPE, f"{name} ({role}) must be {dtype}, not {p.type_text}", p.span)
            if sym and not p.symmetric:
                self.err(Codes.NOT_SYMMETRIC, f"{name} ({role}) is written or read by other ranks: "
                         f"declare it `{name}: sym ...`", p.span)
                return None
        side = self.side_rows(side_args, inputs[0], outputs[0], c.span)
        if side is None:
            return None
        return ir.Contract(kind, tuple(inputs), tuple(outputs), None, c.span, capacity=capacity,
                           side=side)

    def side_rows(self, args, x_name: str, win_name: str, span: Span) -> tuple[tuple[str, str], ...] | None:
        """A dispatch's `xs -> ws` pairs: rows of their own width that go where the tokens go, row t
        of xs to the window row of ws that row t of x goes to in win (e.g. a quantised payload's
        f32 scales). xs has x's rows, ws win's rows, ws is symmetric, xs and ws one element type."""
        x, win = self.params.get(x_name), self.params.get(win_name)
        out = []
        for a in args:
            src, dst = self.params.get(a.name), self.params.get(a.out)
            if src is None or dst is None:
                self.err(Codes.UNKNOWN_NAME, f"the contract names {a.name if src is None else a.out!r}, "
                         "which is not a tensor parameter", a.span)
                return None
            if len(src.shape) != 2 or len(dst.shape) != 2:
                self.err(Codes.BAD_SIZE, f"{a.name} -> {a.out} travels with the tokens row by row: declare "
                         "both with rows and columns (xs: ...[tokens, cols], ws: sym ...[rows, cols])", a.span)
                continue
            if x is not None and x.shape and str(src.shape[0]) != str(x.shape[0]):
                self.err(Codes.BAD_SIZE, f"{a.name} has {src.shape[0]} rows but {x_name} has {x.shape[0]}: "
                         "one row per token", a.span)
            if win is not None and win.shape and str(dst.shape[0]) != str(win.shape[0]):
                self.err(Codes.BAD_SIZE, f"{a.out} has {dst.shape[0]} rows but {win_name} has "
                         f"{win.shape[0]}: one row per window row", a.span)
            if str(src.shape[1]) != str(dst.shape[1]):
                self.err(Codes.BAD_SIZE, f"{a.name} has rows of {src.shape[1]} elements, {a.out} of "
                         f"{dst.shape[1]}: they must be one row size", a.span)
            self._same_type(src, dst, a.span)
            if not dst.symmetric:
                self.err(Codes.NOT_SYMMETRIC, f"{a.out} is written by other ranks: declare it "
                         f"`{a.out}: sym ...`", dst.span)
            if a.name in (x_name, win_name) or a.out in (x_name, win_name) or \
                    any(a.name in p or a.out in p for p in out):
                self.err(Codes.BAD_CONTRACT, f"{a.name} -> {a.out} names a buffer the contract "
                         "already moves", a.span)
            out.append((a.name, a.out))
        return tuple(out)

    # ---- statements
    def block(self, stmts, top: bool, loop_vars: tuple[str, ...], engine: ir.Engine | None = None):
        out: list[ir.Node] = []
        outer = dict(self.lets)     # a let is visible to the rest of its block only
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
        for handle, span in self.pending.pop().items():
            self.err(Codes.BAD_REF, f"the asynchronous stage {handle} is never awaited: write "
                     f"`await {handle}` after it in the same block (its copies must complete before "
                     "the block ends)", span)
        return out

    def post(self, st: ast.Stage, in_stage: bool) -> bool:
        """Checks an asynchronous stage `on sdma async h:` and opens its handle; False on an error."""
        if st.engine != "sdma":
            self.err(Codes.BAD_ENGINE, f"only `on sdma` stages can be asynchronous (`on {st.engine}` "
                     "copies run on the vector cores, which finish them before going on)", st.span)
            if not in_stage:
                self.pending[-1].setdefault(st.handle, st.handle_span)   # its await is no error
            return False
        if in_stage:
            return True   # reported as a nested stage
        if any(st.handle in block for block in self.pending) or self.taken(st.handle):
            self.err(Codes.DUPLICATE_NAME, f"{st.handle!r} is already in flight or names something "
                     "else: await it first or pick another name", st.handle_span)
            return False
        self.pending[-1][st.handle] = st.handle_span
        return True

    def await_(self, st: ast.Await, in_stage: bool):
        if in_stage:
            self.err(Codes.BAD_ENGINE, "await is a statement of its own, outside stages", st.span)
            return None
        if st.handle in self.pending[-1]:
            del self.pending[-1][st.handle]
            return ir.Await(st.handle, st.span)
        if any(st.handle in block for block in self.pending):
            self.err(Codes.BAD_REF, f"await {st.handle} in the block that posted it (so that every "
                     "path through the block completes it once)", st.handle_span)
        else:
            self.err(Codes.UNKNOWN_NAME, f"{st.handle!r} is not an asynchronous stage in flight here "
                     f"(post one first: `on sdma async {st.handle}: ...`)", st.handle_span)
        return None

    def let(self, st: ast.Let, loop_vars) -> None:
        if st.name in loop_vars or self.taken(st.name) or st.name in self.sizes:
            self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.name_span)
            return
        self.lets[st.name] = ir.simplify(self.expr(st.value, self.env(loop_vars), f"let {st.name}"))

    def requirement(self, st: ast.Requires, top: bool) -> None:
        if not top:
            self.err(Codes.BAD_REF, "a world constraint (`requires ...`) is written at the top of a "
                     "schedule", st.span)
            return
        reported = len(self.diags)
        cond = self.cond(st.cond, (), allowed={"world"}, what="a world constraint (on world alone)")
        if len(self.diags) == reported:
            self.requires.append(ir.Requirement(cond, _text(st.cond.span), st.span))

    def stmt(self, st, top, loop_vars, engine):
        in_stage = engine is not None
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.SplitCall):
            self.view(st, top)
            return None
        if isinstance(st, ast.FlagDecl):
            if not top:
                self.err(Codes.BAD_REF, "flags are declared at the top of a schedule", st.span)
                return None
            if self.taken(st.name):
                self.err(Codes.DUPLICATE_NAME, f"{st.name!r} is already defined", st.span)
                return None
            self.flags[st.name] = ir.Flag(st.name, self.expr(st.size, set(self.sizes) | {"world"},
                                                            f"the size of flag {st.name}"), st.span)
            return None
        if isinstance(st, ast.ScratchDecl):
            self.scratch_decl(st, top)
            return None
        if isinstance(st, ast.Let):
            self.let(st, loop_vars)
            return None
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
            if in_stage or any(v not in self.step_vars for v in loop_vars):
                self.err(Codes.BAD_ENGINE, "a barrier is a statement of its own, outside stages and "
                         "loops over ranks (it may sit in a step loop, `for s in lo .. hi`)", st.span)
                return None
            # every rank must advance its epoch by the same stamps per call, so the loops around
            # a barrier run as often on every rank: their bounds may not depend on rank
            fixed = self.fixed_names()
            for lo, hi, span in self.loop_bounds:
                bad = (lo.names() | hi.names()) - fixed
                if bad:
                    self.err(Codes.BAD_REF, f"a barrier in a step loop whose bounds depend on "
                             f"{', '.join(sorted(bad))}: every rank passes a call's barriers the same "
                             "number of times, so the bounds of the loops around a barrier are "
                             "expressions of world, sizes and rank parameters", st.span,
                             Note("the loop", span))
                    return None
            if st.team is not None:
                team = self.team_of(st.team, st.team_span)
                return None if team is None else ir.Barrier(st.span, team=team)
            return ir.Barrier(st.span)
        if isinstance(st, ast.Stage):
            if in_stage:
                self.err(Codes.BAD_ENGINE, "stages do not nest", st.span)
                return None
            if any(v not in self.step_vars for v in loop_vars):
                self.err(Codes.BAD_ENGINE, "put the loop inside the stage: `on ENGINE: for ...` (stages "
                         "may sit in step loops, `for s in lo .. hi`)", st.span)
                return None
            if st.handle is not None and not self.post(st, in_stage):
                return None
            eng = ir.Engine(st.engine)
            body = self.block(st.body, top=False, loop_vars=loop_vars, engine=eng)
            self.stage_count += 1
            return ir.Stage(eng, tuple(body), st.span, self.stage_count, handle=st.handle)
        if isinstance(st, ast.Await):
            return self.await_(st, in_stage)
        if isinstance(st, ast.For):
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
                return self.step_loop(ir.Loop(st.var, ir.Domain.RANGE, tuple(body), st.span, lo, hi))
            if st.team is not None:
                return self.team_loop(st, loop_vars, engine)
            body = self.block(st.body, top=False, loop_vars=loop_vars + (st.var,), engine=engine)
            return ir.Loop(st.var, ir.Domain(st.domain), tuple(body), st.span)
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
        if not self.callee_fits(callee, st):
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
        typevar: dict[str, tuple[str, str]] = {}   # the callee's type variable -> (type, argument)
        for p, a in zip(tree.params, st.args):
            scalar = next((x for x in callee.scalars if x.name == p.name), None)
            if scalar is not None:    # a redop (callee_fits refused rank parameters)
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
        body, flags, requires, self.stage_count = ir_inline(callee, team, bind, ops, prefix,
                                                            self.stage_count)
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
                         "flag's size (pass a region whose length is an expression of world and sizes)",
                         st.span, Note("the flag is declared here", f.span))
            else:
                self.flags[f.name] = f
        args = ", ".join(_text(a.span) for a in st.args)
        self.calls.append(ir.CallSite(callee.name, None if team is None else team.name, args,
                                      st.span, 0, 0, prefix, requires))
        return body

    def fixed_names(self) -> set[str]:
        """What every rank of a call agrees on: world, the sizes and the rank parameters."""
        ranks = [x.name for x in self.scalars.values() if x.kind is ir.ScalarKind.RANK]
        return {"world", *self.sizes, *ranks}

    def callee_fits(self, callee: ir.Schedule, st: ast.CallStmt) -> bool:
        """What the inliner does not handle yet is refused with E0109 (dsl/README.md, Composition)."""
        why = None
        if callee.contract.kind.moe:
            why = f"it is a {callee.contract.kind.value} (routing)"
        elif callee.teams:
            why = f"it declares teams ({', '.join(t.name for t in callee.teams)})"
        elif callee.scratch:
            why = f"it declares scratch buffers ({', '.join(p.name for p in callee.scratch)})"
        elif callee.rank_params:
            why = f"it takes a rank parameter ({callee.rank_params[0].name})"
        else:
            syms = [p.size.name for p in callee.tensors if isinstance(p.size, ir.Var) and not p.shape]
            if len(syms) != len(callee.tensors) or len(set(syms)) != len(syms):
                why = ("its buffers are not each sized by a size symbol of their own (x: T[n], "
                       "y: T[m])")
        if why is None:
            return True
        self.err(Codes.CALL, f"{callee.name} cannot be called yet: {why}; calls inline schedules of "
                 "1-D buffers sized n, redop parameters, flags, barriers, loops and stages",
                 st.callee_span, Note(f"{callee.name} is defined here", callee.span))
        return False

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
        return self.step_loop(ir.Loop(st.var, ir.Domain.RANGE, body, st.span, ir.Const(0), team.size))

    def step_loop(self, loop: ir.Loop) -> ir.Loop:
        """A step loop whose iterations pass barriers: each iteration of each rank passes the same
        number (the flag stamps count on it, passes.step_barriers), an expression of world, sizes
        and rank parameters."""
        per = passes.step_barriers(loop)
        moving = per.names() - self.fixed_names()
        if moving:
            self.err(Codes.BAD_REF, f"the iterations of this step loop pass {ir.bare(per)} barriers, "
                     f"which depends on {', '.join(sorted(moving))}: every iteration of every rank "
                     "must pass the same number (give both arms of an `if` in it the same barriers)",
                     loop.span)
        return loop

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
        parts = self.expr(call.parts, set(self.sizes) | {"world"}, "the number of parts")
        if parent is not None:   # every part of the parent split again into `parts` chunks
            self.views[t.name] = _View(parent.buffer, parts, st.span, of=call.buffer)
        else:
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
        if not isinstance(ref.selector, ast.Index) or ref.sub is not None:
            self.err(Codes.BAD_REF, f"pick one slot of flag {ref.name}: {ref.name}[i]", ref.span)
            return None
        env = self.env(loop_vars)
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

    def move(self, st: ast.Assign, loop_vars, engine: ir.Engine):
        dst = self.region(st.target, loop_vars, "destination")
        if isinstance(st.value, ast.ReduceCall):
            rc = st.value
            if engine is ir.Engine.SDMA:
                self.err(Codes.BAD_ENGINE, "SDMA cannot compute: reductions run `on aiv`", rc.span)
                return None
            if rc.var in loop_vars or self.taken(rc.var) or rc.var in self.sizes:
                self.err(Codes.DUPLICATE_NAME, f"{rc.var!r} shadows another name", rc.span)
                return None
            reported = len(self.diags)
            team = None
            if rc.team is not None:
                team = self.team_of(rc.team, rc.span)
                if team is None:
                    return None
                outer = dict(self.lets)
                self.lets[rc.var] = team.member(ir.Var(rc.var))
            src = self.region(rc.operand, loop_vars + (rc.var,), "source")
            if team is not None:
                self.lets = outer
            if dst is None or src is None:
                return None
            self._same_type(dst[1], src[1], st.span)
            self._computable(dst[1], "a reduction", st.span)
            used = (src[0].rank.names() if src[0].rank else frozenset()) | src[0].lo.names()
            if len(self.diags) == reported and rc.var not in used:
                self.err(Codes.BAD_REF, f"the reduction's operand does not depend on {rc.var}, so every "
                         "term is the same element", rc.operand.span)
            op = self.op(rc.op, rc.span)
            if op is None:
                return None
            if team is not None:
                return ir.Reduce(dst[0], op, src[0], rc.var, ir.Domain(rc.domain), st.span,
                                 count=team.size, skip=team.index)
            return ir.Reduce(dst[0], op, src[0], rc.var, ir.Domain(rc.domain), st.span)
        src = self.region(st.value, loop_vars, "source")
        if dst is None or src is None:
            return None
        self._same_type(dst[1], src[1], st.span)
        if engine is ir.Engine.SDMA and dst[0].rank is not None and src[0].rank is not None:
            self.err(Codes.BAD_ENGINE, "an SDMA copy reads or writes the running rank's memory: one "
                     "side must be local (no @)", st.span)
            return None
        if engine is ir.Engine.AUTO and dst[0].rank is not None and src[0].rank is not None:
            # `auto` sends large copies to SDMA at run time, where one side must be local
            self.err(Codes.BAD_ENGINE, "an `on auto` copy may go to SDMA, which reads or writes the "
                     "running rank's memory: make one side local (no @), or copy `on aiv`", st.span)
            return None
        return ir.Copy(dst[0], src[0], st.span)

    ROUTE_TYPES = {  # operand -> element type ("T": the payload, the destination's type)
        "ids": "i32", "counts": "i32", "offs": "i32", "weights": "f32", "x": "T", "win": "T"}

    def route(self, st: ast.Assign, loop_vars, engine: ir.Engine) -> ir.Route | None:
        call: ast.RouteCall = st.value
        kind = ir.RouteKind(call.kind)
        want = ir.ROUTE_OPERANDS[kind]
        form = f"{kind.value}({', '.join(want)})"
        if len(call.args) != len(want):
            self.err(Codes.BAD_REF, f"{kind.value} takes {len(want)} operand(s): {form}", call.span)
            return None
        if loop_vars:
            self.err(Codes.BAD_REF, f"{kind.value} covers every rank itself: write it outside loops",
                     st.span)
            return None
        if kind is not ir.RouteKind.PLACE and engine is not ir.Engine.AIV:
            self.err(Codes.BAD_ENGINE, f"{kind.value} computes on the vector cores: write it `on aiv`",
                     st.span)
            return None
        if st.target.rank is not None:
            self.err(Codes.BAD_REF, f"{kind.value} writes its result on the running rank: drop the @",
                     st.target.span)
            return None
        whole = kind in (ir.RouteKind.PLACE, ir.RouteKind.GATHER)
        if whole and st.target.selector is not None:
            self.err(Codes.BAD_REF, f"{kind.value} fills the whole of its destination: drop the "
                     "selector", st.target.span)
            return None
        got = self.region(st.target, loop_vars, "destination")
        if got is None:
            return None
        dst, dbuf = got
        capacity = None
        operands: list[str] = []
        bufs: dict[str, ir.Buffer] = {}
        for role, arg in zip(want, call.args):
            if role == "capacity":
                capacity = self.expr(arg, set(self.sizes) | {"world"}, "a capacity")
                continue
            if not isinstance(arg, ast.Name) or arg.id not in self.params:
                self.err(Codes.UNKNOWN_NAME, f"operand {role} of {form} must name a tensor parameter",
                         arg.span)
                return None
            p = self.params[arg.id]
            t = self.ROUTE_TYPES[role]
            if t == "T":
                self._same_type(dbuf, p, arg.span)
            elif p.type_text != t and p.name not in self.bad_types:
                self.err(Codes.BAD_TYPE, f"operand {role} of {kind.value} holds {t}, but {p.name} holds "
                         f"{p.type_text}", arg.span)
            operands.append(p.name)
            bufs[role] = p
        if kind in (ir.RouteKind.HISTOGRAM, ir.RouteKind.EXSCAN, ir.RouteKind.SLOTS):
            if dbuf.type_text != "i32" and dbuf.name not in self.bad_types:
                self.err(Codes.BAD_TYPE, f"{kind.value} gives int32 per expert, but {dbuf.name} holds "
                         f"{dbuf.type_text}", st.target.span)
        else:
            rows = bufs["x" if kind is ir.RouteKind.PLACE else "win"]
            for b in (dbuf, rows):
                if len(b.shape) != 2:
                    self.err(Codes.BAD_SIZE, f"{kind.value} works on rows: declare {b.name} with a shape "
                             f"of rows and columns ({b.name}: ...[rows, cols])", st.span,
                             Note(f"{b.name} is declared here", b.span))
                    return None
            if str(dbuf.shape[1]) != str(rows.shape[1]):
                self.err(Codes.BAD_SIZE, f"{dbuf.name} has rows of {dbuf.shape[1]} elements, {rows.name} "
                         f"of {rows.shape[1]}: they must be one row size", st.span)
            if kind is ir.RouteKind.PLACE and not dbuf.symmetric:
                self.err(Codes.NOT_SYMMETRIC, f"place writes rows into other ranks' {dbuf.name}: "
                         f"declare it `{dbuf.name}: sym ...`", st.span,
                         Note(f"{dbuf.name} is declared here", dbuf.span))
            cols = dbuf.shape[1]
            if (kind is ir.RouteKind.PLACE and dbuf.dtype is not None and isinstance(cols, ir.Const)
                    and cols.value * dbuf.dtype.nbytes % ir.WINDOW_ROW_ALIGN):
                padded = ir.padded_row(cols.value, dbuf.dtype)
                decl = f"{dbuf.name}: sym {dbuf.type_text}[{dbuf.shape_text.rsplit(', ', 1)[0]}, {padded}]"
                self.err(Codes.BAD_SIZE, f"place writes rows of {dbuf.name} from several ranks, and a row "
                         f"of {cols.value * dbuf.dtype.nbytes} bytes ({dbuf.type_text}[..., {cols.value}]) "
                         f"shares a {ir.WINDOW_ROW_ALIGN}-byte block with its neighbours: pad the rows to "
                         f"{padded} columns ({padded * dbuf.dtype.nbytes} bytes), "
                         f"`{decl}` "
                         f"and {rows.name} likewise, the values in the first {cols.value}", st.span,
                         Note(f"{dbuf.name} is declared here", dbuf.span))
            if kind is ir.RouteKind.GATHER:
                self._computable(rows, "gather (weights and sums in f32)", st.span)
                if not rows.symmetric:
                    self.err(Codes.NOT_SYMMETRIC, f"gather reads rows of other ranks' {rows.name}: "
                             f"declare it `{rows.name}: sym ...`", st.span,
                             Note(f"{rows.name} is declared here", rows.span))
                ids, w = bufs["ids"], bufs["weights"]
                if w.dims != ids.dims and str(w.size) != str(ids.size):
                    self.err(Codes.BAD_SIZE, f"weights {w.name} must have the shape of ids {ids.name}",
                             st.span)
        return ir.Route(kind, dst, tuple(operands), st.span, capacity)

    def accum(self, st: ast.Accum, loop_vars, engine: ir.Engine):
        if engine is not ir.Engine.AIV:
            self.err(Codes.BAD_ENGINE, "reduce on write is an atomic accumulate of the vector cores' "
                     "DMA: write it `on aiv`", st.span)
            return None
        op = self.op(st.op, st.span)
        dst = self.region(st.target, loop_vars, "destination")
        src = self.region(st.value, loop_vars, "source")
        if op is None or dst is None or src is None:
            return None
        self._same_type(dst[1], src[1], st.span)
        self._computable(dst[1], "reduce on write", st.span)
        return ir.Accumulate(dst[0], op, src[0], st.span)

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
        size, shape = self.shape(st.dims, set(self.sizes) | {"world"}, st.name, st.span)
        self.params[st.name] = ir.Buffer(st.name, dtype, typevar, st.symmetric, size, st.span,
                                         scratch=True, shape=shape)

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
    if isinstance(e, ast.Call):
        return _names(e.arg)
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
            elif isinstance(op, ir.If):
                walk(op.then)
                walk(op.orelse)
            elif isinstance(op, (ir.Reduce, ir.Accumulate)) and s.contract.op is not None \
                    and op.op != s.contract.op:
                diags.append(error(Codes.CONTRACT, f"this reduces with {op.op.value}, but the schedule "
                                   f"implements {s.contract}", op.span,
                                   Note("the contract is declared here", s.contract.span)))
    walk(s.body)
    return diags


def lower(module: ast.Module) -> list[ir.Schedule]:
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
                known = ", ".join(n for n in names if n != caller) or "none"
                return f"no schedule {name!r} in this file (schedules: {known})"
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
