"""MoE routing: the contracts moe_dispatch, moe_combine and alltoallv (with a dispatch's rows that
travel with the tokens, `xs -> ws`), and the routing statements (histogram, exscan, slots, place,
gather).

In: an ast.Contract of a MoE kind (from Decls.contract) and `dst = KIND(...)` statements (ast.Assign
of an ast.RouteCall) inside a stage. Out: ir.Contract (inputs, outputs, capacity, side rows) and
ir.Route; the operands' element types, row shapes, symmetry and row alignment are checked here.
"""

from __future__ import annotations

from stratac import ir
from stratac.diagnostics import Codes, Note, Span
from stratac.lang import ast
from stratac.lang.sema.scope import Scope


class Moe(Scope):
    MOE_FORMS = {
        ir.ContractKind.MOE_DISPATCH: "moe_dispatch(x, ids -> win, counts), moe_dispatch(x, ids -> "
                                      "win, counts, CAPACITY) or moe_dispatch(x, ids -> win, counts, "
                                      "per_expert(ROWS)), each optionally followed by "
                                      "rows that travel with the tokens: ..., xs -> ws",
        ir.ContractKind.MOE_COMBINE: "moe_combine(win, ids, weights, counts -> y), moe_combine(win, "
                                     "ids, weights, counts -> y, CAPACITY) or moe_combine(win, ids, "
                                     "weights, counts -> y, per_expert(ROWS))",
        ir.ContractKind.ALLTOALLV: "alltoallv(x, dest -> out, counts)",
    }

    def moe_contract(self, kind: ir.ContractKind, c: ast.Contract) -> ir.Contract | None:
        usage = f"{kind.value} is written {self.MOE_FORMS[kind]}"
        # `per_expert(ROWS)`: the packed window in regions of ROWS rows, one per local expert; written
        # where a slotted layout's CAPACITY is
        forms = [a for a in c.args if a.form is not None]
        for a in forms:
            if a.form != "per_expert" or kind is ir.ContractKind.ALLTOALLV or len(forms) > 1:
                self.err(Codes.BAD_CONTRACT, f"unexpected {a.form}({a.name}): {usage}", a.span)
                return None
            if a.name not in self.sizes:
                self.err(Codes.BAD_CONTRACT, f"per_expert({a.name}) names the rows of an expert's region of "
                         f"the window: {a.name} must be a size of the schedule (a dimension of a tensor "
                         "parameter)", a.span)
                return None
        if forms:
            c = ast.Contract(c.kind, tuple(ast.ContractArg(a.name, a.out, a.span) for a in c.args), c.span)
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
        region = None
        if forms:
            if capacity != forms[0].name:
                self.err(Codes.BAD_CONTRACT, usage, forms[0].span)
                return None
            region, capacity = capacity, None
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
                           side=side, region=region)

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

    ROUTE_TYPES = {  # operand -> element type ("T": the payload, the destination's type)
        "ids": "i32", "counts": "i32", "offs": "i32", "weights": "f32", "x": "T", "win": "T"}

    def route(self, st: ast.Assign, loop_vars, engine: ir.Engine) -> ir.Route | None:
        call: ast.RouteCall = st.value
        kind = ir.RouteKind(call.kind)
        want = ir.ROUTE_OPERANDS[kind]
        form = f"{kind.value}({', '.join(want)})"
        if kind is ir.RouteKind.EXSCAN and len(call.args) == 2:
            want = want + ("capacity",)   # exscan(counts, ROWS): a region of ROWS rows per local expert
        if len(call.args) != len(want):
            self.err(Codes.BAD_REF, "exscan is written exscan(counts) or exscan(counts, ROWS) (a region "
                     "of ROWS rows per local expert)" if kind is ir.RouteKind.EXSCAN else
                     f"{kind.value} takes {len(want)} operand(s): {form}", call.span)
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
                capacity = self.expr(arg, set(self.sizes) | {"world"},
                                     "a capacity" if kind is ir.RouteKind.SLOTS else "an expert's rows")
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
