"""`ir.c_source`: IR integer expressions as C++ the way one would write them by hand (bare literals
and comparisons, no parentheses precedence makes redundant), with the IR's values: checked as text
on the forms the kernels use, and by compiling random expressions with g++ (under UBSan, so int
arithmetic that overflows where int64_t would not fails) and comparing every value with Python's.
Also: the PartOffset/PartLength helpers the kernels define compute `ir.split_part`."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stratac import ir
from stratac.ir import Bin, BinKind, Const, Var

ROOT = Path(__file__).resolve().parents[2]
K = BinKind
n, w, r, root = Var("n"), Var("world"), Var("rank"), Var("root")
a, b, c = Var("a"), Var("b"), Var("c")
NAMES = {"n": "n_", "world": "world", "rank": "rank", "root": "root_", "a": "a", "b": "b", "c": "c"}


def B(kind, x, y):
    return Bin(kind, x, y)


@pytest.mark.parametrize("e, text", [
    # literals are bare; an int64_t operand converts them
    (Const(0), "0"),
    (Const(-1), "(-1)"),
    (B(K.ADD, n, Const(1)), "n_ + 1"),
    (B(K.MUL, Const(2), n), "2 * n_"),
    # comparisons are bare: an if takes a bool, an int64_t parameter or operand converts it to 0/1
    (B(K.EQ, r, root), "rank == root_"),
    (B(K.EQ, B(K.MOD, r, Const(2)), Const(0)), "rank % 2 == 0"),
    (B(K.ADD, B(K.DIV, n, w), B(K.LT, r, B(K.MOD, n, w))), "n_ / world + (rank < n_ % world)"),
    # a part of a split
    (ir.split_part(n, w, r)[0], "rank * (n_ / world) + strata::Min(rank, n_ % world)"),
    (ir.split_part(n, w, r)[1], "n_ / world + (rank < n_ % world)"),
    # parentheses where C++ needs them (right operands of - and /, looser operands) ...
    (B(K.SUB, a, B(K.SUB, b, c)), "a - (b - c)"),
    (B(K.SUB, B(K.SUB, a, b), c), "a - b - c"),
    (B(K.SUB, B(K.ADD, a, b), c), "a + b - c"),
    (B(K.ADD, a, B(K.ADD, b, c)), "a + (b + c)"),
    (B(K.MUL, a, B(K.DIV, b, c)), "a * (b / c)"),
    (B(K.MUL, B(K.ADD, a, b), c), "(a + b) * c"),
    (B(K.MUL, B(K.MUL, a, b), c), "a * b * c"),
    (B(K.MUL, a, B(K.MUL, b, c)), "a * (b * c)"),
    # ... and where a reader would want them: / and % next to another of * / %, nested comparisons
    (B(K.MUL, B(K.DIV, a, b), c), "(a / b) * c"),
    (B(K.MOD, B(K.MUL, a, b), c), "(a * b) % c"),
    (B(K.LT, B(K.LT, a, b), c), "(a < b) < c"),
    (B(K.EQ, B(K.ADD, a, b), B(K.LT, a, b)), "a + b == (a < b)"),
    (B(K.MIN, Const(0), B(K.ADD, a, b)), "strata::Min(0, a + b)"),
    (B(K.MAX, a, Const(4)), "strata::Max(a, 4)"),
    # a conditional is parenthesized; int64_t when a branch is, else its first branch is cast
    (ir.Sel(B(K.GT, w, Const(1)), n, Const(1)), "(world > 1 ? n_ : 1)"),
    (B(K.MUL, ir.Sel(B(K.LT, a, b), Const(2), Const(3)), c), "(a < b ? int64_t(2) : 3) * c"),
    # ... but not as a branch of another conditional (its condition keeps them)
    (ir.Sel(B(K.LT, a, b), ir.Sel(B(K.LT, b, c), a, b), ir.Sel(B(K.LT, a, c), c, a)),
     "(a < b ? b < c ? a : b : a < c ? c : a)"),
    (ir.Sel(ir.Sel(B(K.LT, a, b), a, b), c, a), "((a < b ? a : b) ? c : a)"),
    # a bitwise operator inside another is parenthesized (GCC's -Wparentheses asks for it)
    (B(K.OR, B(K.SHL, a, Const(1)), B(K.AND, B(K.SHR, b, c), Const(1))), "(a << 1) | ((b >> c) & 1)"),
    (B(K.XOR, B(K.AND, a, b), c), "(a & b) ^ c"),
    (B(K.AND, B(K.AND, a, b), c), "a & b & c"),
    # a cast exactly where neither operand is int64_t (int arithmetic could overflow)
    (B(K.MUL, Const(2), Const(3)), "int64_t(2) * 3"),
    (B(K.ADD, Const(2147483647), Const(1)), "int64_t(2147483647) + 1"),
    (B(K.ADD, B(K.LT, a, b), Const(1)), "int64_t(a < b) + 1"),
    (B(K.ADD, B(K.LT, a, b), B(K.LT, b, c)), "int64_t(a < b) + (b < c)"),
    (B(K.ADD, B(K.LT, a, b), n), "(a < b) + n_"),
    # literals outside int's range have a 64-bit type already
    (B(K.ADD, Const(3 << 31), B(K.LT, a, b)), "6442450944 + (a < b)"),
    (Const(-2**63), "(-9223372036854775807 - 1)"),
])
def test_c_source_text(e, text):
    assert ir.c_source(e, NAMES) == text


def test_no_redundant_forms_after_simplify():
    """What the kernels printed before: int64_t(0), + int64_t(0), int64_t(<comparison>) as a
    condition; simplify drops + 0 and * 1, and c_source writes no cast of a literal or comparison
    that has an int64_t beside it."""
    for e in (B(K.ADD, B(K.MUL, r, Const(1)), Const(0)), B(K.EQ, B(K.MOD, r, Const(2)), Const(0)),
              B(K.ADD, B(K.DIV, n, w), B(K.LT, r, B(K.MOD, n, w))),
              B(K.SUB, B(K.ADD, B(K.MUL, r, n), n), B(K.MUL, r, n))):
        text = ir.c_source(ir.simplify(e), NAMES)
        assert "int64_t(" not in text and "+ 0" not in text and "* 1" not in text, text


# ---- values, by g++ ----

LEAVES = [Const(0), Const(1), Const(2), Const(3), Const(7), Const(2**31 - 1), Const(2**31),
          Const(3_000_000_000), a, b]
ENVS = [{"a": 0, "b": 0}, {"a": 1, "b": 5}, {"a": 5, "b": 3}, {"a": 3_000_000_000, "b": 7},
        {"a": 2**31 - 1, "b": 1}]


def _random_expr(rng: random.Random, depth: int) -> ir.IExpr:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(LEAVES)
    if rng.random() < 0.1:
        return ir.Sel(*(_random_expr(rng, depth - 1) for _ in range(3)))
    return Bin(rng.choice(list(BinKind)), _random_expr(rng, depth - 1), _random_expr(rng, depth - 1))


def _value(e: ir.IExpr, env) -> int | None:
    """e's value if every subterm is defined, non-negative (what a valid program has) and fits
    int64_t with room to spare, else None; a conditional needs only its condition and the branch
    it takes to be."""
    if isinstance(e, ir.Sel):
        cond = _value(e.cond, env)
        return None if cond is None else _value(e.then if cond else e.orelse, env)
    if isinstance(e, Bin):
        x, y = _value(e.lhs, env), _value(e.rhs, env)
        if x is None or y is None:
            return None
        if e.kind in (BinKind.SHL, BinKind.SHR) and y >= 63:
            return None   # outside int64 (the verifier refuses it)
        try:
            v = Bin(e.kind, Const(x), Const(y)).eval({})
        except (ZeroDivisionError, ValueError):   # ValueError: log2(0)
            return None
    else:
        v = e.eval(env)
    return v if 0 <= v < 2**62 else None


def _device_helpers() -> str:
    """strata::Mod and strata::Log2 as the device library defines them (the kernels call them for
    the language's floored % and log2)."""
    text = (ROOT / "runtime" / "device" / "strata_device.h").read_text()
    found = re.findall(r"__aicore__ inline int64_t (?:Mod|Log2)\(.*?\n\}\n", text, re.S)
    assert len(found) == 2
    return "namespace strata {\n" + "".join(found).replace("__aicore__ ", "") + "}\n"


def _run_cpp(tmp_path: Path, body: str, prelude: str = "") -> str:
    src = tmp_path / "t.cpp"
    src.write_text("#include <cstdint>\n#include <cstdio>\n"
                   "namespace strata { inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }\n"
                   "inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; } }\n"
                   + _device_helpers() + prelude + "int main() {\n" + body + "  return 0;\n}\n")
    exe = tmp_path / "t"
    subprocess.run(["g++", "-std=c++17", "-O0", "-w", "-fsanitize=undefined",
                    "-fno-sanitize-recover=undefined", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gxx
def test_c_source_values_match_the_ir(tmp_path):
    """Random expressions (raw and simplified) over int literals, literals beyond int's range,
    comparisons, min, max, conditionals and int64_t names, evaluated by C++ as an int64_t (as the
    kernels pass them)."""
    rng = random.Random(20240601)
    checks = []
    for _ in range(250):
        e = _random_expr(rng, 4)
        for env in ENVS:
            want = _value(e, env)
            if want is not None:
                for form in {e, ir.simplify(e)}:
                    checks.append((form, env, want))
    assert len(checks) > 300
    body = []
    for i, (e, env, want) in enumerate(checks):
        body.append(f"  {{ const int64_t a = {env['a']}, b = {env['b']}; const int64_t v = "
                    f"{ir.c_source(e, NAMES)}; if (v != {want}) std::printf(\"%d %lld\\n\", {i}, "
                    f"static_cast<long long>(v)); }}\n")
    out = _run_cpp(tmp_path, "".join(body))
    wrong = [(str(checks[int(i)][0]), checks[int(i)][1], checks[int(i)][2], int(got))
             for i, got in (line.split() for line in out.splitlines())]
    assert wrong == []


@needs_gxx
def test_floored_modulo_and_log2_match_the_ir(tmp_path):
    """% of a left operand that may be negative (ring indexing: (rank - s - 1) % world) is floored
    in the IR, and the kernel's strata::Mod gives the same; log2 is floor(log2)."""
    e = B(K.MOD, B(K.SUB, B(K.SUB, a, b), Const(1)), c)
    lg = ir.log2(a)
    text = ir.c_source(e, NAMES)
    assert text == "strata::Mod(a - b - 1, c)"
    assert ir.c_source(B(K.MOD, B(K.ADD, a, Const(1)), c), NAMES) == "(a + 1) % c"
    body, want = [], []
    for x in range(0, 20):
        for y in range(0, 20):
            for z in range(1, 9):
                env = {"a": x, "b": y, "c": z}
                want.append(f"{e.eval(env)}" + (f" {lg.eval(env)}" if x else " -"))
                log = f'std::printf(" %lld", static_cast<long long>({ir.c_source(lg, NAMES)}))' if x \
                    else 'std::printf(" -")'
                body.append(f"  {{ const int64_t a = {x}, b = {y}, c = {z}; std::printf(\"%lld\", "
                            f"static_cast<long long>({text})); {log}; std::printf(\"\\n\"); }}\n")
    assert _run_cpp(tmp_path, "".join(body)).splitlines() == want


@needs_gxx
def test_part_helpers_compute_split_part(tmp_path):
    """The PartOffset/PartLength the kernels define (read off a generated kernel) give what
    ir.split_part, the definition the verifier checks, gives."""
    text = (ROOT / "generated" / "allreduce_twoshot" / "kernel.cpp").read_text()
    helpers = re.findall(r"__aicore__ inline int64_t Part(?:Offset|Length)\(.*?\n\}\n", text, re.S)
    assert len(helpers) == 2
    lo, length = ir.split_part(Var("total"), Var("parts"), Var("i"))
    want, body = [], []
    for total in range(0, 40):
        for parts in range(1, 10):
            for i in range(parts):
                env = {"total": total, "parts": parts, "i": i}
                want.append(f"{lo.eval(env)} {length.eval(env)}")
                body.append(f'  std::printf("%lld %lld\\n", static_cast<long long>(PartOffset({total}, '
                            f'{parts}, {i})), static_cast<long long>(PartLength({total}, {parts}, {i})));\n')
    out = _run_cpp(tmp_path, "".join(body), "#define __aicore__\n" + "".join(helpers))
    assert out.splitlines() == want


def test_simplify_keeps_the_value_of_negative_terms():
    """simplify is what the kernels print, the IR's evaluation what the verifier proves: they agree
    wherever the expression is defined, negative terms included (min(x, 0) and x < 0 fold to 0 only
    where x is never negative: `rank - root < 0` holds on the ranks below root)."""
    rng = random.Random(7)
    leaves = [Const(0), Const(1), Const(2), Const(-1), a, b]
    envs = [{"a": x, "b": y} for x in (0, 1, 3) for y in (0, 2, 5)]

    def rand(depth):
        if depth == 0 or rng.random() < 0.3:
            return rng.choice(leaves)
        kind = rng.choice([K.ADD, K.SUB, K.MUL, K.DIV, K.MOD, K.MIN, K.LT, K.LE, K.EQ, K.AND, K.XOR])
        return Bin(kind, rand(depth - 1), rand(depth - 1))

    wrong, checked = [], 0
    for e in [B(K.LT, B(K.SUB, a, b), Const(0)), B(K.MIN, B(K.SUB, a, b), Const(0))] + \
            [rand(4) for _ in range(3000)]:
        s = ir.simplify(e)
        for env in envs:
            try:
                want = e.eval(env)
            except ZeroDivisionError:
                continue
            checked += 1
            try:
                got = s.eval(env)
            except ZeroDivisionError:
                got = "a division by zero"
            if got != want:
                wrong.append((str(e), str(s), env, want, got))
    assert checked > 10000
    assert wrong == []
