"""The parser: every statement form, the syntax tree it builds and the span of every node.

Spans are 1-based (line, col) of the first character and (end_line, end_col) one past the last,
as diagnostics underline them. Columns are computed from the source text with `at`, so a reader
can see what each span must cover.
"""

from __future__ import annotations

import pytest

from stratac.diagnostics import Codes, Source, StrataError
from stratac.lang import ast
from stratac.lang.syntax import parse

SRC = """\
schedule every_form(x: sym T[n], out: f32[n * world]) implements allgather(x -> out) {
  flag ready[world + 1]
  part = split(x, world)
  barrier
  on aiv: part[rank] = sum(part[rank]@p for p in ranks)
  on sdma {
    for p in peers: part[rank]@p = part[rank]
    out[0:n]@(rank + 1) = x
  }
  signal ready[rank]@((rank + 1) % world)
  wait ready[(rank + world - 1) % world]
  on auto: for q in peers { out = max(x@q for r in ranks) }
}
schedule second(y: i32[8]) implements allreduce(y, min) {
}
"""
LINES = SRC.split("\n")


def at(line: int, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, col) of the nth occurrence of needle on a 1-based line."""
    text = LINES[line - 1]
    col = -1
    for _ in range(nth + 1):
        col = text.index(needle, col + 1)
    return line, col + 1


def start(node) -> tuple[int, int]:
    return node.span.line, node.span.col


def end(node) -> tuple[int, int]:
    return node.span.end_line, node.span.end_col


@pytest.fixture(scope="module")
def module() -> ast.Module:
    return parse(Source("forms.strata", SRC))


@pytest.fixture(scope="module")
def body(module):
    return module.schedules[0].body


def test_module_and_schedules(module):
    assert module.source_name == "forms.strata"
    assert [s.name for s in module.schedules] == ["every_form", "second"]
    s = module.schedules[0]
    assert start(s) == (1, 1) and end(s) == (13, 2)
    assert (s.name_span.line, s.name_span.col, s.name_span.end_col) == (1, 10, 20)
    assert module.schedules[1].body == ()
    assert start(module.schedules[1]) == (14, 1)


def test_params(module):
    x, out = module.schedules[0].params
    assert (x.name, x.symmetric, x.dtype) == ("x", True, "T")
    assert x.dims[0] == ast.Name("n", x.dims[0].span) and start(x.dims[0]) == at(1, "n]")
    assert start(x) == at(1, "x:") and end(x) == (1, at(1, "]")[1] + 1)
    assert (x.dtype_span.line, x.dtype_span.col) == at(1, "T[")
    assert (out.name, out.symmetric, out.dtype) == ("out", False, "f32")
    assert (out.dtype_span.col, out.dtype_span.end_col) == (at(1, "f32")[1], at(1, "f32")[1] + 3)
    assert isinstance(out.dims[0], ast.BinOp) and out.dims[0].op == "*"
    assert (out.dims[0].lhs.id, out.dims[0].rhs.id) == ("n", "world")
    assert start(out.dims[0]) == at(1, "n * world")
    y, = module.schedules[1].params
    assert (y.dtype, y.dims[0].value, y.symmetric) == ("i32", 8, False)


def test_contracts(module):
    c = module.schedules[0].contract
    assert c.kind == "allgather"
    assert start(c) == at(1, "allgather") and end(c) == (1, at(1, ") {")[1] + 1)
    arg, = c.args
    assert (arg.name, arg.out) == ("x", "out") and start(arg) == at(1, "x -> out")
    c2 = module.schedules[1].contract
    assert c2.kind == "allreduce"
    assert [(a.name, a.out) for a in c2.args] == [("y", None), ("min", None)]
    assert start(c2.args[1]) == at(14, "min")


def test_statement_kinds_in_order(body):
    assert [type(st).__name__ for st in body] == [
        "FlagDecl", "Assign", "Barrier", "Stage", "Stage", "Signal", "Wait", "Stage"]
    assert [start(st) for st in body] == [(i, 3) for i in (2, 3, 4, 5, 6, 10, 11, 12)]


def test_flag_decl(body):
    f = body[0]
    assert f.name == "ready" and isinstance(f.size, ast.BinOp)
    assert (f.size.op, f.size.lhs.id, f.size.rhs.value) == ("+", "world", 1)
    assert end(f) == (2, len(LINES[1]) + 1)


def test_split(body):
    a = body[1]
    assert isinstance(a.value, ast.SplitCall)
    assert a.target == ast.Ref("part", None, None, a.target.span, a.target.name_span)
    assert (a.value.buffer, a.value.parts.id) == ("x", "world")
    assert start(a.value) == at(3, "split") and end(a.value) == (3, len(LINES[2]) + 1)
    assert (a.value.buffer_span.line, a.value.buffer_span.col) == at(3, "x,")


def test_barrier(body):
    assert start(body[2]) == (4, 3) and end(body[2]) == (4, 10)


def test_stage_with_colon_and_reduction(body):
    st = body[3]
    assert st.engine == "aiv" and len(st.body) == 1
    assert end(st) == (5, len(LINES[4]) + 1)
    a = st.body[0]
    assert isinstance(a, ast.Assign) and start(a) == at(5, "part[rank] =")
    t = a.target
    assert t.name == "part" and t.rank is None and isinstance(t.selector, ast.Index)
    assert t.selector.index.id == "rank" and start(t.selector) == at(5, "[rank]")
    rc = a.value
    assert isinstance(rc, ast.ReduceCall)
    assert (rc.op, rc.var, rc.domain) == ("sum", "p", "ranks")
    assert start(rc) == at(5, "sum(") and end(rc) == (5, len(LINES[4]) + 1)
    op = rc.operand
    assert op.name == "part" and op.selector.index.id == "rank" and op.rank.id == "p"
    assert start(op) == at(5, "part", 1) and end(op) == (5, at(5, "@p")[1] + 2)
    assert (op.name_span.col, op.name_span.end_col) == (at(5, "part", 1)[1], at(5, "part", 1)[1] + 4)


def test_stage_with_block_loop_and_range(body):
    st = body[4]
    assert st.engine == "sdma" and start(st) == (6, 3) and end(st) == (9, 4)
    loop, copy = st.body
    assert isinstance(loop, ast.For) and (loop.var, loop.domain) == ("p", "peers")
    assert start(loop) == at(7, "for") and (loop.var_span.line, loop.var_span.col) == at(7, "p in")
    inner, = loop.body
    assert isinstance(inner.value, ast.Ref) and inner.target.rank.id == "p"
    assert inner.value.rank is None and inner.value.selector.index.id == "rank"
    assert start(inner) == at(7, "part[rank]@p")
    # out[0:n]@(rank + 1) = x
    t = copy.target
    assert isinstance(t.selector, ast.Range)
    assert (t.selector.lo.value, t.selector.hi.id) == (0, "n")
    assert start(t.selector) == at(8, "[0:n]") and end(t.selector) == (8, at(8, "]")[1] + 1)
    assert isinstance(t.rank, ast.BinOp) and t.rank.op == "+"
    assert (t.rank.lhs.id, t.rank.rhs.value) == ("rank", 1)
    assert copy.value == ast.Ref("x", None, None, copy.value.span, copy.value.name_span)
    assert start(copy.value) == at(8, "x")


def test_signal_and_wait(body):
    sig, wait = body[5], body[6]
    assert isinstance(sig, ast.Signal) and sig.ref.name == "ready"
    assert sig.ref.selector.index.id == "rank"
    r = sig.ref.rank
    assert r.op == "%" and r.lhs.op == "+" and r.rhs.id == "world"
    assert start(sig.ref) == at(10, "ready") and end(sig) == (10, len(LINES[9]) + 1)
    assert isinstance(wait, ast.Wait) and wait.ref.rank is None
    idx = wait.ref.selector.index
    # ((rank + world) - 1) % world: left-associative sums inside the parentheses
    assert idx.op == "%" and idx.lhs.op == "-" and idx.lhs.lhs.op == "+"
    assert idx.lhs.rhs.value == 1
    assert start(wait.ref.selector) == at(11, "[")


def test_stage_with_loop_block_and_max(body):
    st = body[7]
    assert st.engine == "auto"
    loop, = st.body
    assert (loop.var, loop.domain) == ("q", "peers")
    a, = loop.body
    assert a.value.op == "max" and a.value.var == "r" and a.value.operand.rank.id == "q"
    assert a.target.selector is None and a.target.rank is None
    assert start(a) == at(12, "out =")


@pytest.mark.parametrize("text, shape", [
    ("1 + 2 * 3", ("+", 1, ("*", 2, 3))),
    ("1 * 2 + 3", ("+", ("*", 1, 2), 3)),
    ("1 - 2 - 3", ("-", ("-", 1, 2), 3)),
    ("8 / 4 / 2", ("/", ("/", 8, 4), 2)),
    ("7 % 3 * 2", ("*", ("%", 7, 3), 2)),
    ("(1 + 2) * 3", ("*", ("+", 1, 2), 3)),
    ("-1 + 2", ("+", ("neg", 1), 2)),
    ("- -a", ("neg", ("neg", "a"))),
    ("a - -b", ("-", "a", ("neg", "b"))),
])
def test_expression_precedence(text, shape):
    src = f"schedule s(x: T[{text}]) implements allreduce(x, sum) {{}}"
    size = parse(Source("e", src)).schedules[0].params[0].dims[0]

    def tree(e):
        if isinstance(e, ast.IntLit):
            return e.value
        if isinstance(e, ast.Name):
            return e.id
        if isinstance(e, ast.Neg):
            return ("neg", tree(e.operand))
        return (e.op, tree(e.lhs), tree(e.rhs))

    assert tree(size) == shape
    assert size.span.col == src.index(text) + 1 or text.startswith("(")


def test_comments_and_blank_lines_keep_positions():
    src = "# header\n\n  # indented comment\nschedule s(x: T[n]) implements allreduce(x, sum) {\n  barrier # c\n}\n"
    s = parse(Source("c", src)).schedules[0]
    assert start(s) == (4, 1) and start(s.body[0]) == (5, 3)


def test_names_that_start_with_keywords_are_names():
    src = ("schedule format(index: sym T[n], summary: T[sumn], ranks2: T[sumn]) "
           "implements allreduce(index, sum) {}")
    s = parse(Source("k", src)).schedules[0]
    assert s.name == "format"
    assert [p.name for p in s.params] == ["index", "summary", "ranks2"]
    assert s.params[1].dims[0].id == "sumn"


# ---- syntax errors: one diagnostic, E0001, at the offending token ----

def syntax_error(src: str):
    with pytest.raises(StrataError) as exc:
        parse(Source("bad.strata", src))
    d, = exc.value.diagnostics
    assert d.code == Codes.SYNTAX
    return d


HEAD = "schedule s(x: sym T[n]) implements allreduce(x, sum) {\n"


@pytest.mark.parametrize("src, line, col, width, words", [
    (HEAD + "  on aiv: x = x * 2\n}\n", 2, 17, 1, "unexpected '*'"),
    (HEAD + "  on aiv: x = x@p!\n}\n", 2, 18, 1, "unexpected character '!'"),
    (HEAD + "  on gpu: x = x\n}\n", 2, 6, 3, "unexpected 'gpu'; expected an engine (aiv, sdma, auto)"),
    (HEAD + "  for in in ranks: barrier\n}\n", 2, 7, 2, "unexpected 'in'; expected a name"),
    (HEAD + "  barrier\n", 2, 10, 1, "unexpected end of file; expected '(', 'await', 'barrier', "),
    ("schedule s(x: T[n]) implements allgather(x = y) {}", 1, 44, 1, "expected '(', ')', ',', '->'"),
    ("schedule s(sum: T[n]) implements allreduce(x, sum) {}", 1, 12, 3, "unexpected 'sum'; expected "),
    ("", 1, 1, 1, "unexpected end of file; expected 'import', 'schedule'"),
    (HEAD + "}\n\n\n", 2, 2, 1, None),   # trailing blank lines are fine: no error
])
def test_syntax_error_positions(src, line, col, width, words):
    if words is None:
        parse(Source("ok", src))
        return
    d = syntax_error(src)
    assert (d.span.line, d.span.col, d.span.end_col - d.span.col) == (line, col, width), d.render()
    assert words in d.message, d.message


def test_expected_tokens_are_listed_readably():
    d = syntax_error(HEAD + "  barrier\n")
    listed = d.message.split("; expected ", 1)[1].rstrip(", .").split(", ")
    assert {"'barrier'", "'flag'", "'for'", "'on'"} <= set(listed) or "..." in d.message
    assert all(t.startswith("'") or t in ("a name", "...") for t in listed), d.message


def test_syntax_error_names_arrow_not_lark_internals():
    d = syntax_error("schedule s(x: T[n]) implements allgather(x out) {}")
    assert "'->'" in d.message and "__anon" not in d.message.lower()


def test_unexpected_eof_points_past_the_last_line():
    d = syntax_error(HEAD + "  on aiv: part[rank] = sum(part[rank]@p for p in\n\n")
    assert (d.span.line, d.span.col) == (2, len("  on aiv: part[rank] = sum(part[rank]@p for p in") + 1)
    assert "ranks or peers" in d.message
    text = d.render()
    assert text.startswith("bad.strata:2:49: error[E0001]: unexpected end of file")
    assert text.split("\n")[2] == " " * (len("   2 | ") + 48) + "^"


def test_excerpt_shows_the_spans_line_after_a_form_feed():
    from stratac.lang import frontend
    src = "# a\x0cb\n" + HEAD + "  on aiv: y = x\n}\n"
    with pytest.raises(StrataError) as exc:
        frontend.schedules(Source("ff.strata", src))
    d, = exc.value.diagnostics
    assert d.span.line == 3
    assert d.render().split("\n")[1] == "   3 |   on aiv: y = x"
