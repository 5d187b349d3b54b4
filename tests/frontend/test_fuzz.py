"""A fuzz of the front end (and the verifier behind it) with hypothesis.

Every input must end in one of two ways: parse, lowering and verification complete (the verifier
may well report errors: those are results), or a StrataError carrying diagnostics. Any other
exception is a bug. Four kinds of input:

* random text (printable and some unicode);
* token soups: random sequences of the language's keywords, punctuation, names and integers;
* mutations of the example files: characters and tokens deleted, duplicated, swapped, replaced;
* generated schedules: random but well-formed programs (statements, loops, flags, splits,
  reductions), which get past the parser and exercise lowering, instantiation and the verifier.

Every diagnostic must render, carry a known code, and point inside the source.

CI runs a bounded, derandomized campaign (STRATAC_FUZZ_EXAMPLES, default 300 in all, spread over
the four kinds). A long campaign, randomized and with hypothesis' example database:

    STRATAC_FUZZ_EXAMPLES=100000 python -m pytest tests/frontend/test_fuzz.py -q

A failure prints the smallest input hypothesis found; add it to tests/frontend/corpus/ (or
tests/verify/corpus/) with its expected error once the bug is fixed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratac import verify
from stratac.diagnostics import Codes, Severity, Source, StrataError
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
TOTAL = int(os.environ.get("STRATAC_FUZZ_EXAMPLES", "300"))
LONG = "STRATAC_FUZZ_EXAMPLES" in os.environ
WORLDS = [1, 2, 3]

# share of the examples per input kind, and how many tests split that share
SHARE = {"text": (0.15, 2), "soup": (0.25, 2), "mutation": (0.35, 2), "generated": (0.25, 1)}


def fuzz_settings(kind: str):
    share, tests = SHARE[kind]
    return settings(max_examples=max(1, int(TOTAL * share / tests)), deadline=None,
                    derandomize=not LONG, database=None if not LONG else settings.default.database,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


CODES = {v for k, v in vars(Codes).items() if not k.startswith("_")}


def check_diagnostics(source: Source, diags) -> None:
    assert diags, "a StrataError without diagnostics"
    n_lines = source.text.count("\n") + 1
    for d in diags:
        assert d.code in CODES, d.code
        assert isinstance(d.message, str) and d.message
        text = d.render()
        if d.span is not None:
            assert 1 <= d.span.line <= n_lines, (d.span.line, n_lines, text)
            assert d.span.col >= 1
            assert text.startswith(f"{source.name}:{d.span.line}:{d.span.col}: "
                                   f"{d.severity.value}[{d.code}]: ")


def run_pipeline(text: str) -> None:
    source = Source("fuzz.strata", text)
    try:
        schedules = frontend.schedules(source)
    except StrataError as exc:
        check_diagnostics(source, exc.diagnostics)
        return
    for s in schedules:
        for res in verify.verify_worlds(s, WORLDS):
            if not res.ok:
                check_diagnostics(source, res.diagnostics)
                assert any(d.severity is Severity.ERROR for d in res.diagnostics)


# ---- random text ----

@fuzz_settings("text")
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200))
def test_random_text(text):
    run_pipeline(text)


@fuzz_settings("text")
@given(st.text(alphabet="schedulimpntoar{}()[]:@=,+-*/%#\n xyzfT0123456789_>", max_size=300))
def test_random_text_over_the_language_alphabet(text):
    run_pipeline(text)


# ---- token soups ----

KEYWORDS = ["schedule", "implements", "sym", "split", "sum", "max", "min", "for", "in", "barrier",
            "on", "aiv", "sdma", "auto", "ranks", "peers", "flag", "signal", "wait", "if", "else",
            "scratch", "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall",
            "rank", "world", "redop"]
PUNCT = ["{", "}", "(", ")", "[", "]", ":", ",", "->", "=", "@", "+", "-", "*", "/", "%", "+=",
         "==", "!=", "<", "<=", ">", ">="]
NAMES = ["x", "out", "part", "blk", "p", "q", "n", "m", "T", "U", "f32", "f16", "bf16", "i32",
         "f64", "ready", "done", "s", "op", "root", "buf"]
INTS = ["0", "1", "2", "3", "7", "16", "1000"]
TOKENS = KEYWORDS + PUNCT + NAMES + INTS
SEPARATORS = [" ", " ", " ", "\n", "\n  ", "", "\t", "  # a comment\n"]


@fuzz_settings("soup")
@given(st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(SEPARATORS)), max_size=80))
def test_token_soup(pairs):
    run_pipeline("".join(t + sep for t, sep in pairs))


HEADER = ["schedule s(x: sym T[n]) implements allreduce(x, sum) {",
          "schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {"]


@fuzz_settings("soup")
@given(st.sampled_from(HEADER),
       st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(SEPARATORS)), max_size=40))
def test_token_soup_inside_a_schedule(header, pairs):
    run_pipeline(header + "\n" + "".join(t + sep for t, sep in pairs) + "\n}\n")


# ---- mutations of the examples ----

EXAMPLES = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.strata"))]
EXAMPLES += [p.read_text(encoding="utf-8")
             for p in sorted((ROOT / "tests" / "verify" / "corpus").glob("good_*.strata"))]
TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|->|#[^\n]*|\s+|.", re.S)


def _mutate(draw, items: list[str], vocabulary: list[str]) -> list[str]:
    for _ in range(draw(st.integers(1, 4))):
        if not items:
            items.append(draw(st.sampled_from(vocabulary)))
            continue
        i = draw(st.integers(0, len(items) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert"]))
        if op == "delete":
            del items[i]
        elif op == "duplicate":
            items.insert(i, items[i])
        elif op == "swap":
            j = draw(st.integers(0, len(items) - 1))
            items[i], items[j] = items[j], items[i]
        elif op == "replace":
            items[i] = draw(st.sampled_from(vocabulary))
        else:
            items.insert(i, draw(st.sampled_from(vocabulary)))
    return items


@st.composite
def token_mutants(draw):
    text = draw(st.sampled_from(EXAMPLES))
    tokens = _mutate(draw, TOKEN_RE.findall(text), TOKENS + [" ", "\n"])
    return "".join(tokens)


@st.composite
def char_mutants(draw):
    text = draw(st.sampled_from(EXAMPLES))
    return "".join(_mutate(draw, list(text), list("{}()[]:@=,+-*/%#\n x0123456789_>!$\x0c")))


@fuzz_settings("mutation")
@given(token_mutants())
def test_token_mutations_of_examples(text):
    run_pipeline(text)


@fuzz_settings("mutation")
@given(char_mutants())
def test_character_mutations_of_examples(text):
    run_pipeline(text)


# ---- generated schedules ----

@st.composite
def int_expr(draw, names: list[str], depth: int = 0):
    kind = draw(st.integers(0, 5 if depth < 2 else 1))
    if kind == 0:
        return str(draw(st.integers(0, 4)))
    if kind == 1:
        return draw(st.sampled_from(names))
    if kind == 2:
        return "-" + draw(int_expr(names, depth + 1))
    op = draw(st.sampled_from(["+", "-", "*", "/", "%"]))
    return f"({draw(int_expr(names, depth + 1))} {op} {draw(int_expr(names, depth + 1))})"


@st.composite
def data_ref(draw, names: list[str], buffers: list[str]):
    name = draw(st.sampled_from(buffers + ["part"]))
    out = name
    if name == "part" or draw(st.integers(0, 4)) == 0:
        out += f"[{draw(int_expr(names))}]"
    elif draw(st.booleans()):
        out += f"[{draw(int_expr(names))}:{draw(int_expr(names))}]"
    if draw(st.booleans()):
        rank = draw(st.sampled_from(names[:1] + ["(" + draw(int_expr(names)) + ")"]))
        out += f"@{rank}"
    return out


@st.composite
def move(draw, names: list[str], buffers: list[str], depth: int = 0):
    kind = draw(st.integers(0, 3 if depth < 2 else 2))
    if kind == 3:
        var = draw(st.sampled_from(["p", "q"]))
        dom = draw(st.sampled_from(["ranks", "peers"]))
        return f"for {var} in {dom}: " + draw(move([var] + names, buffers, depth + 1))
    if kind == 2:
        var = draw(st.sampled_from(["p", "q"]))
        op = draw(st.sampled_from(["sum", "max", "min"]))
        dom = draw(st.sampled_from(["ranks", "peers"]))
        src = draw(data_ref([var] + names, buffers))
        return f"{draw(data_ref(names, buffers))} = {op}({src} for {var} in {dom})"
    return f"{draw(data_ref(names, buffers))} = {draw(data_ref(names, buffers))}"


@st.composite
def statement(draw, buffers: list[str]):
    names = ["rank", "world", "n"]
    kind = draw(st.sampled_from(["barrier", "stage", "stage", "stage", "signal", "wait", "loop"]))
    if kind == "barrier":
        return "barrier"
    if kind == "stage":
        engine = draw(st.sampled_from(["aiv", "sdma", "auto"]))
        moves = draw(st.lists(move(names, buffers), min_size=1, max_size=3))
        if len(moves) == 1:
            return f"on {engine}: {moves[0]}"
        return f"on {engine} {{\n    " + "\n    ".join(moves) + "\n  }"
    if kind == "signal":
        return f"signal f[{draw(int_expr(names))}]@{draw(st.sampled_from(['rank', '0', '(' + draw(int_expr(names)) + ')']))}"
    if kind == "wait":
        return f"wait f[{draw(int_expr(names))}]"
    var = draw(st.sampled_from(["p", "q"]))
    dom = draw(st.sampled_from(["ranks", "peers"]))
    inner = draw(st.sampled_from([f"signal f[{var}]@{var}", f"signal f[rank]@{var}",
                                  f"wait f[{var}]", "signal f[rank]@((rank + 1) % world)"]))
    return f"for {var} in {dom}: {inner}"


@st.composite
def schedules(draw):
    if draw(st.booleans()):
        header, buffers = HEADER[0], ["x"]
    else:
        header, buffers = HEADER[1], ["x", "out"]
    split_of = draw(st.sampled_from(buffers))
    parts = draw(st.sampled_from(["world", "2", "world + 1", "world - 1"]))
    body = [f"flag f[{draw(st.sampled_from(['world', '1', 'world * 2']))}]",
            f"part = split({split_of}, {parts})"]
    body += draw(st.lists(statement(buffers), min_size=1, max_size=7))
    return header + "\n" + "".join(f"  {line}\n" for line in body) + "}\n"


@fuzz_settings("generated")
@given(schedules())
def test_generated_schedules(text):
    run_pipeline(text)


def test_the_generator_reaches_the_verifier():
    """The generated schedules are not all rejected by the front end (a sanity check of the
    generator itself: otherwise the fuzz would test nothing behind sema)."""
    lowered = 0

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(schedules())
    def count(text):
        nonlocal lowered
        try:
            frontend.schedules(Source("g.strata", text))
            lowered += 1
        except StrataError:
            pass

    count()
    assert lowered >= 5
