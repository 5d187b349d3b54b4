"""Parse .strata text into the syntax tree (stratac.lang.ast). Syntax errors become diagnostics."""

from __future__ import annotations

import functools

import lark
from lark import Lark, Token, Transformer, v_args

from stratac.diagnostics import Codes, Source, Span, StrataError, error
from stratac.lang import ast
from stratac.resources import resource_path


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = resource_path("dsl", "strata.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(source: Source) -> ast.Module:
    try:
        tree = _parser().parse(source.text)
    except lark.exceptions.UnexpectedInput as exc:
        raise StrataError(_syntax_diagnostic(source, exc)) from None
    return _Builder(source).transform(tree)


_PRETTY = {
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'",
    "COLON": "':'", "COMMA": "','", "EQUAL": "'='", "AT": "'@'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "PERCENT": "'%'", "NAME": "a name", "INT": "an integer",
    "REDOP": "sum/max/min", "ENGINE": "an engine (aiv, sdma, auto)", "DOMAIN": "ranks or peers",
    "SYM": "'sym'", "ROUTE": "a routing construct", "$END": "end of file", "CMP": "a comparison (== != < <= > >=)",
    "PLUSEQUAL": "'+='", "LESSTHAN": "'<'", "MORETHAN": "'>'", "CIRCUMFLEX": "'^'",
    "AMPERSAND": "'&'", "VBAR": "'|'", "SHL": "'<<'", "SHR": "'>>'", "STRING": "a quoted path",
}


def _pretty(term: str) -> str:
    if term in _PRETTY:
        return _PRETTY[term]
    if term.startswith("__ANON"):
        # anonymous punctuation such as "->": lark numbers these, so show the text itself
        pattern = next((t.pattern for t in _parser().terminals if t.name == term), None)
        if isinstance(pattern, lark.lexer.PatternStr):
            return f"'{pattern.value}'"
        return term
    if term.isupper():
        # anonymous keyword terminals: lark names them after the keyword text
        return f"'{term.lower()}'"
    return term


def _syntax_diagnostic(source: Source, exc: lark.exceptions.UnexpectedInput):
    line = getattr(exc, "line", None) or 1
    col = getattr(exc, "column", None) or 1
    width = 1
    if isinstance(exc, lark.exceptions.UnexpectedEOF) or (
        isinstance(exc, lark.exceptions.UnexpectedToken) and exc.token.type == "$END"
    ):
        # lark counts lines by "\n" only (not form feeds etc. as str.splitlines does)
        lines = source.text.rstrip("\n").split("\n")
        line, col = len(lines), len(lines[-1].rstrip("\r")) + 1
        what = "unexpected end of file"
    elif isinstance(exc, lark.exceptions.UnexpectedToken):
        what = f"unexpected {exc.token.value!r}"
        width = max(1, len(str(exc.token.value).split("\n", 1)[0]))
    else:
        ch = source.text[exc.pos_in_stream] if exc.pos_in_stream < len(source.text) else "?"
        what = f"unexpected character {ch!r}"
    expected = sorted({_pretty(t) for t in (getattr(exc, "expected", None) or ())})
    if expected:
        what += "; expected " + (", ".join(expected[:8]) + (", ..." if len(expected) > 8 else ""))
    span = Span(source, line, col, line, col + width)
    return error(Codes.SYNTAX, what, span)


def _tok_span(source: Source, tok: Token) -> Span:
    return Span(source, tok.line, tok.column, tok.end_line, tok.end_column)


@v_args(meta=True)
class _Builder(Transformer):
    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, meta) -> Span:
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    # ---- top level
    def start(self, meta, children):
        imports = tuple(c for c in children if isinstance(c, ast.Import))
        return ast.Module(tuple(c for c in children if not isinstance(c, ast.Import)), self.source.name,
                          imports)

    def import_stmt(self, meta, children):
        return ast.Import(str(children[0])[1:-1], self._span(meta))

    def schedule(self, meta, children):
        name, *rest = children
        contract, block = rest[-2], rest[-1]
        params = tuple(p for p in rest[:-2] if p is not None)
        return ast.Schedule(str(name), params, contract, block, self._span(meta),
                            _tok_span(self.source, name))

    def param(self, meta, children):
        name, sym, dtype, dims = children
        return ast.Param(str(name), sym is not None, str(dtype), dims, self._span(meta),
                         _tok_span(self.source, dtype))

    def contract(self, meta, children):
        name, *args = children
        return ast.Contract(str(name), tuple(a for a in args if a is not None), self._span(meta))

    def carg_name(self, meta, children):
        return ast.ContractArg(str(children[0]), None, self._span(meta))

    def carg_arrow(self, meta, children):
        return ast.ContractArg(str(children[0]), str(children[1]), self._span(meta))

    def carg_call(self, meta, children):
        return ast.ContractArg(str(children[1]), None, self._span(meta), form=str(children[0]))

    def block(self, meta, stmts):
        return tuple(stmts)

    def body_one(self, meta, children):
        return (children[0],)

    def body_block(self, meta, children):
        return children[0]

    # ---- statements
    def assign(self, meta, children):
        return ast.Assign(children[0], children[1], self._span(meta))

    def accum_sum(self, meta, children):
        return ast.Accum(children[0], "sum", children[1], self._span(meta))

    def accum_op(self, meta, children):
        return ast.Accum(children[0], str(children[1]), children[2], self._span(meta))

    def if_stmt(self, meta, children):
        cond, then, orelse = children
        return ast.If(cond, then, orelse or (), self._span(meta))

    def cond(self, meta, children):
        lhs, op, rhs = children
        return ast.Cond(str(op), lhs, rhs, self._span(meta))

    def cond_is(self, meta, children):
        lhs, prop = children
        return ast.CondIs(lhs, str(prop), self._span(meta), _tok_span(self.source, prop))

    def let_stmt(self, meta, children):
        name, value = children
        return ast.Let(str(name), value, self._span(meta), _tok_span(self.source, name))

    def var_stmt(self, meta, children):
        name, value = children
        return ast.VarDecl(str(name), value, self._span(meta), _tok_span(self.source, name))

    def set_stmt(self, meta, children):
        name, value = children
        return ast.SetVar(str(name), value, self._span(meta), _tok_span(self.source, name))

    def var_array(self, meta, children):
        name, size, value = children
        return ast.VarDecl(str(name), value, self._span(meta), _tok_span(self.source, name), size)

    def set_elem(self, meta, children):
        name, index, value = children
        return ast.SetVar(str(name), value, self._span(meta), _tok_span(self.source, name), index)

    def requires(self, meta, children):
        return ast.Requires(children[0], self._span(meta))

    def dims(self, meta, children):
        return tuple(children)

    def scratch_decl(self, meta, children):
        name, sym, dtype, dims = children
        return ast.ScratchDecl(str(name), sym is not None, str(dtype), dims, self._span(meta),
                               _tok_span(self.source, dtype))

    def split_call(self, meta, children):
        buf, parts = children
        return ast.SplitCall(str(buf), parts, self._span(meta), _tok_span(self.source, buf))

    def reduce_call(self, meta, children):
        op, operand, var, domain = children
        return ast.ReduceCall(str(op), operand, str(var), str(domain), self._span(meta))

    def reduce_team(self, meta, children):
        op, operand, var, team, domain = children
        return ast.ReduceCall(str(op), operand, str(var), str(domain), self._span(meta), str(team))

    def reduce_list(self, meta, children):
        op, *operands = children
        return ast.ReduceList(str(op), tuple(operands), self._span(meta))

    def route_call(self, meta, children):
        kind, *args = children
        return ast.RouteCall(str(kind), tuple(a for a in args if a is not None), self._span(meta))

    def barrier(self, meta, children):
        team = children[0] if children else None
        return ast.Barrier(self._span(meta), None if team is None else str(team),
                           None if team is None else _tok_span(self.source, team))

    def team_decl(self, meta, children):
        name, kind, arg, *more = children
        return ast.TeamDecl(str(name), str(kind), arg, self._span(meta), _tok_span(self.source, name),
                            _tok_span(self.source, kind), tuple(more))

    def stage(self, meta, children):
        return ast.Stage(str(children[0]), children[1], self._span(meta))

    def stage_async(self, meta, children):
        engine, handle, body = children
        return ast.Stage(str(engine), body, self._span(meta), str(handle),
                         _tok_span(self.source, handle))

    def call_stmt(self, meta, children):
        name, *args, team = children
        return ast.CallStmt(str(name), tuple(a for a in args if a is not None), str(team),
                            self._span(meta), _tok_span(self.source, name), _tok_span(self.source, team))

    def call_redop(self, meta, children):
        return ast.RedopArg(str(children[0]), self._span(meta))

    def call_int(self, meta, children):
        return ast.IntArg(ast.IntLit(int(children[0]), self._span(meta)), self._span(meta))

    def call_expr(self, meta, children):
        return ast.IntArg(children[0], self._span(meta))

    def call_cond(self, meta, children):
        return ast.IntArg(self.cond_expr(meta, children), self._span(meta))

    def await_stmt(self, meta, children):
        return ast.Await(str(children[0]), self._span(meta), _tok_span(self.source, children[0]))

    def for_stmt(self, meta, children):
        var, domain, body = children
        return ast.For(str(var), str(domain), body, self._span(meta), _tok_span(self.source, var))

    def for_team(self, meta, children):
        var, team, domain, body = children
        return ast.For(str(var), str(domain), body, self._span(meta), _tok_span(self.source, var),
                       team=str(team))

    def for_range(self, meta, children):
        var, lo, hi, body = children
        return ast.For(str(var), "range", body, self._span(meta), _tok_span(self.source, var), lo, hi)

    def flag_decl(self, meta, children):
        return ast.FlagDecl(str(children[0]), children[1], self._span(meta), children[2])

    def signal(self, meta, children):
        return ast.Signal(children[0], self._span(meta), children[1])

    def wait(self, meta, children):
        return ast.Wait(children[0], self._span(meta), children[1])

    def ref(self, meta, children):
        name, selector, sub, rank = children
        return ast.Ref(str(name), selector, rank, self._span(meta), _tok_span(self.source, name), sub)

    def sel_index(self, meta, children):
        return ast.Index(children[0], self._span(meta))

    def sel_range(self, meta, children):
        return ast.Range(children[0], children[1], self._span(meta))

    # ---- expressions
    def int_lit(self, meta, children):
        return ast.IntLit(int(children[0]), self._span(meta))

    def name(self, meta, children):
        return ast.Name(str(children[0]), self._span(meta))

    def call(self, meta, children):
        fn, *args = children
        return ast.Call(str(fn), tuple(args), self._span(meta), _tok_span(self.source, fn))

    def cond_expr(self, meta, children):
        then, cond, orelse = children
        return ast.CondExpr(cond, then, orelse, self._span(meta))

    def attr(self, meta, children):
        team, attr = children
        return ast.Attr(str(team), str(attr), self._span(meta), _tok_span(self.source, team))

    def member(self, meta, children):
        team, index = children
        return ast.Member(str(team), index, self._span(meta), _tok_span(self.source, team))

    def neg(self, meta, children):
        return ast.Neg(children[0], self._span(meta))

    def _bin(op):  # noqa: N805 - a small factory for the five binary operators
        def build(self, meta, children):
            return ast.BinOp(op, children[0], children[1], self._span(meta))
        return build

    add, sub, mul, div, mod = _bin("+"), _bin("-"), _bin("*"), _bin("/"), _bin("%")
    band, bxor, bor = _bin("&"), _bin("^"), _bin("|")

    def shl(self, meta, children):
        return ast.BinOp("<<", children[0], children[2], self._span(meta))

    def shr(self, meta, children):
        return ast.BinOp(">>", children[0], children[2], self._span(meta))
