"""Integer expressions of the schedule IR, symbolic in rank, world and the size symbols.

In: the expressions sema builds (offsets, lengths, conditions, loop bounds). Out: simplified
expressions, their values for one instance (`eval`), the size rules that read size symbols off the
caller's tensors, balanced split offsets, and their text as Python (`py_source`, for hot
evaluations) and as C++ (`c_source`, for codegen).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Union


@dataclass(frozen=True)
class Const:
    value: int

    def eval(self, env: Mapping[str, int]) -> int:
        return self.value

    def names(self) -> frozenset[str]:
        return frozenset()

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Var:
    """A name: rank, world, a size symbol, a rank parameter, a loop variable (all never negative),
    or a local of the running rank (`local`: a var, or a let that read one), which may be."""

    name: str
    local: bool = False

    def eval(self, env: Mapping[str, int]) -> int:
        return env[self.name]

    def names(self) -> frozenset[str]:
        return frozenset({self.name})

    def __str__(self) -> str:
        return self.name


class BinKind(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"   # floor division; operands are never negative in a valid program
    MOD = "%"   # floored: the result lies in [0, rhs) for rhs > 0 (rhs <= 0 is an error)
    MIN = "min"
    MAX = "max"
    SHL = "<<"  # shifts: lhs >= 0, 0 <= rhs < 63, no bit shifted out of int64
    SHR = ">>"
    AND = "&"   # bitwise, two's complement as int64
    XOR = "^"
    OR = "|"
    LOG2 = "log2"   # unary (rhs is Const(0)): floor(log2(lhs)), lhs >= 1
    LT = "<"    # comparisons give 1 or 0
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="


@dataclass(frozen=True)
class Bin:
    kind: BinKind
    lhs: "IExpr"
    rhs: "IExpr"

    def eval(self, env: Mapping[str, int]) -> int:
        a, b = self.lhs.eval(env), self.rhs.eval(env)
        k = self.kind
        if k is BinKind.ADD:
            return a + b
        if k is BinKind.SUB:
            return a - b
        if k is BinKind.MUL:
            return a * b
        if k is BinKind.DIV:
            if b == 0:
                raise ZeroDivisionError(str(self))
            return a // b
        if k is BinKind.MOD:
            if b == 0:
                raise ZeroDivisionError(str(self))
            return a % b
        if k is BinKind.MIN:
            return min(a, b)
        if k is BinKind.MAX:
            return max(a, b)
        if k in _BITWISE:
            return _BITWISE[k](a, b)
        return int(_COMPARE[k](a, b))

    def names(self) -> frozenset[str]:
        return self.lhs.names() | self.rhs.names()

    def __str__(self) -> str:
        if self.kind in (BinKind.MIN, BinKind.MAX):
            return f"{self.kind.value}({self.lhs}, {self.rhs})"
        if self.kind is BinKind.LOG2:
            return f"log2({bare(self.lhs)})"
        return f"({self.lhs} {self.kind.value} {self.rhs})"


@dataclass(frozen=True)
class Sel:
    """`(then if cond else orelse)`: cond is a comparison (0 or 1) or any integer (true when not
    0); only the branch taken is evaluated, so the other may divide by zero."""

    cond: "IExpr"
    then: "IExpr"
    orelse: "IExpr"

    def eval(self, env: Mapping[str, int]) -> int:
        return self.then.eval(env) if self.cond.eval(env) else self.orelse.eval(env)

    def names(self) -> frozenset[str]:
        return self.cond.names() | self.then.names() | self.orelse.names()

    def __str__(self) -> str:
        return f"({bare(self.then)} if {bare(self.cond)} else {bare(self.orelse)})"


@dataclass(frozen=True)
class Elem:
    """`t[i]`: element i of the running rank's integer array t (`var t[K] = v`). Its value is the
    one the last `set t[i] = ...` before it gave, like a var's; an index outside 0 .. K - 1 is an
    error of the instance (IndexError here; the evaluators report it at the statement)."""

    name: str
    index: "IExpr"

    def eval(self, env: Mapping[str, int]) -> int:
        return element(env[self.name], self.index.eval(env), self.name)

    def names(self) -> frozenset[str]:
        return self.index.names() | {self.name}

    def __str__(self) -> str:
        return f"{self.name}[{bare(self.index)}]"


def element(values, i: int, name: str) -> int:
    """values[i] of array `name`, i checked against its length (a negative i is not Python's from
    the end: it is out of range)."""
    if not 0 <= i < len(values):
        raise IndexError(f"{name}[{i}] is outside {name}'s {len(values)} elements "
                         f"(0 .. {len(values) - 1})")
    return values[i]


# the most integers an array may hold: it lives on the scalar unit's stack, which a table sized by
# the world would not fit (every instance is checked against it)
ARRAY_CAPACITY = 64

IExpr = Union[Const, Var, Bin, Sel, Elem]


def bare(e: "IExpr") -> str:
    """The expression as text without its outermost parentheses."""
    text = str(e)
    return text[1:-1] if isinstance(e, Bin) and text.startswith("(") else text

def _log2(a: int) -> int:
    if a < 1:
        raise ValueError(f"log2({a})")
    return a.bit_length() - 1


_BITWISE = {BinKind.SHL: lambda a, b: a << b, BinKind.SHR: lambda a, b: a >> b,
            BinKind.AND: lambda a, b: a & b, BinKind.XOR: lambda a, b: a ^ b,
            BinKind.OR: lambda a, b: a | b, BinKind.LOG2: lambda a, b: _log2(a)}


def log2(e: "IExpr") -> "Bin":
    return Bin(BinKind.LOG2, e, Const(0))


def nonnegative(e: "IExpr") -> bool:
    """Whether e is never negative, from its form alone: names (rank, world, sizes, rank
    parameters and loop variables, which the verifier keeps non-negative; not the rank's locals)
    and non-negative literals combined by anything but subtraction."""
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, Var):
        return not e.local       # a var may hold anything
    if isinstance(e, Elem):      # an array's elements may be anything
        return False
    if isinstance(e, Sel):
        return nonnegative(e.then) and nonnegative(e.orelse)
    if e.kind is BinKind.SUB:
        return False
    if e.kind in _COMPARE or e.kind in (BinKind.LOG2, BinKind.MOD):
        return True
    return nonnegative(e.lhs) and nonnegative(e.rhs)


_COMPARE = {BinKind.LT: lambda a, b: a < b, BinKind.LE: lambda a, b: a <= b,
            BinKind.GT: lambda a, b: a > b, BinKind.GE: lambda a, b: a >= b,
            BinKind.EQ: lambda a, b: a == b, BinKind.NE: lambda a, b: a != b}


def add(a: IExpr, b: IExpr) -> IExpr:
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    return Bin(BinKind.ADD, a, b)


def simplify(e: IExpr) -> IExpr:
    """Local rewrites that keep IR dumps and generated C readable: constant folding,
    (a * b) / b -> a, (a * b) % b -> 0, identities of 0 and 1, x - x -> 0, (x + y) - y -> x and
    x + (y - x) -> y (so that a range x[a:a + n] has length n, and a range x[a:b] ends at b; not
    when the term cancelled has a / or %, which may be a division by zero for instantiation to
    report), min(x, 0) and x < 0 -> 0 where x is never
    negative by its form (`nonnegative`: not `rank - root < 0`, which holds on some ranks)."""
    if isinstance(e, Sel):
        c = simplify(e.cond)
        if isinstance(c, Const):
            return simplify(e.then if c.value else e.orelse)
        return Sel(c, simplify(e.then), simplify(e.orelse))
    if isinstance(e, Elem):
        return Elem(e.name, simplify(e.index))
    if not isinstance(e, Bin):
        return e
    a, b, k = simplify(e.lhs), simplify(e.rhs), e.kind
    if isinstance(a, Const) and isinstance(b, Const):
        # not folded: what instantiation reports (a division by zero, a shift outside int64, a
        # value that overflows int64)
        if k in (BinKind.SHL, BinKind.SHR) and not 0 <= b.value < 63:
            return Bin(k, a, b)
        try:
            v = Bin(k, a, b).eval({})
        except (ZeroDivisionError, ValueError, OverflowError):
            return Bin(k, a, b)
        return Const(v) if -2**63 <= v < 2**63 else Bin(k, a, b)
    if k is BinKind.ADD:
        if a == Const(0):
            return b
        if b == Const(0):
            return a
        # a + (b - a) -> b: the end of a range x[a:b] (its start plus its length)
        if isinstance(b, Bin) and b.kind is BinKind.SUB and b.rhs == a and _divides_nothing(a):
            return b.lhs
    if k is BinKind.SUB and b == Const(0):
        return a
    if k is BinKind.SUB and _divides_nothing(b):
        if a == b:
            return Const(0)
        if isinstance(a, Bin) and a.kind is BinKind.ADD and b in (a.lhs, a.rhs):
            return a.lhs if b == a.rhs else a.rhs
    if k is BinKind.MUL:
        if Const(0) in (a, b):
            return Const(0)
        if a == Const(1):
            return b
        if b == Const(1):
            return a
    if k in (BinKind.DIV, BinKind.MOD) and isinstance(a, Bin) and a.kind is BinKind.MUL and \
            b in (a.lhs, a.rhs):
        return (a.lhs if b == a.rhs else a.rhs) if k is BinKind.DIV else Const(0)
    if k is BinKind.DIV and b == Const(1):
        return a
    if k is BinKind.MOD and b == Const(1):
        return Const(0)
    if k in (BinKind.MIN, BinKind.LT) and b == Const(0) and nonnegative(a):
        return Const(0)
    return Bin(k, a, b)


def _divides_nothing(e: IExpr) -> bool:
    if isinstance(e, Elem):      # its index may be out of range, which instantiation reports
        return False
    if isinstance(e, Sel):
        return all(_divides_nothing(x) for x in (e.cond, e.then, e.orelse))
    if isinstance(e, Bin):
        return e.kind not in (BinKind.DIV, BinKind.MOD) and _divides_nothing(e.lhs) and \
            _divides_nothing(e.rhs)
    return True


def size_scale(size: IExpr, sym: str, known: frozenset[str] = frozenset({"world"})) -> IExpr | None:
    """If size = sym * k with k a function of `known` names only (world by default), returns k;
    else None. Decided numerically over a few values of the known names: exact for the polynomial
    sizes the language allows."""
    if not size.names() <= known | {sym} or sym not in size.names():
        return None
    k = simplify(_subst(size, sym, Const(1)))
    others = sorted(size.names() - {sym})
    for v in (1, 2, 3, 7):
        env = {name: v + i for i, name in enumerate(others)}
        for n in (0, 2, 5):
            try:
                if size.eval({**env, sym: n}) != n * k.eval(env):
                    return None
            except ZeroDivisionError:
                return None
    return k


def _subst(e: IExpr, name: str, value: IExpr) -> IExpr:
    if isinstance(e, Var):
        return value if e.name == name else e
    if isinstance(e, Bin):
        return Bin(e.kind, _subst(e.lhs, name, value), _subst(e.rhs, name, value))
    if isinstance(e, Sel):
        return Sel(*(_subst(x, name, value) for x in (e.cond, e.then, e.orelse)))
    if isinstance(e, Elem):
        return Elem(e.name, _subst(e.index, name, value))
    return e


def substitute(e: IExpr, value_of) -> IExpr:
    """e with every variable v replaced by value_of(v.name) at once (the replacements are not
    substituted again); value_of returns None to keep v."""
    if isinstance(e, Var):
        got = value_of(e.name)
        if isinstance(got, Var) and e.local:     # a local renamed (inlining) is still one
            return Var(got.name, local=True)
        return e if got is None else got
    if isinstance(e, Bin):
        return Bin(e.kind, substitute(e.lhs, value_of), substitute(e.rhs, value_of))
    if isinstance(e, Sel):
        return Sel(*(substitute(x, value_of) for x in (e.cond, e.then, e.orelse)))
    if isinstance(e, Elem):     # the array's own name is renamed only (a value for it is a Var)
        got = value_of(e.name)
        return Elem(got.name if isinstance(got, Var) else e.name, substitute(e.index, value_of))
    return e


def affine(e: IExpr, name: str) -> tuple[IExpr, IExpr] | None:
    """(b, a) with e == b + a * name for every value of name, neither naming it; None when e is not
    of that form by +, - and * alone (name under a division, a modulo, a min or a condition).
    Integer +, - and * are exact, so the form holds for every value, not only those tried. The parts
    are not simplified: they may be negative (`rank - p`), which ir.simplify does not promise to keep."""
    if name not in e.names():
        return e, Const(0)
    if isinstance(e, Var):
        return Const(0), Const(1)
    if not isinstance(e, Bin):
        return None
    if e.kind in (BinKind.ADD, BinKind.SUB):
        lhs, rhs = affine(e.lhs, name), affine(e.rhs, name)
        if lhs is None or rhs is None:
            return None
        return Bin(e.kind, lhs[0], rhs[0]), Bin(e.kind, lhs[1], rhs[1])
    if e.kind is BinKind.MUL:
        if name in e.lhs.names() and name in e.rhs.names():
            return None
        k, other = (e.rhs, e.lhs) if name in e.lhs.names() else (e.lhs, e.rhs)
        inner = affine(other, name)
        if inner is None:
            return None
        return Bin(BinKind.MUL, k, inner[0]), Bin(BinKind.MUL, k, inner[1])
    return None


def split_part(total: IExpr, parts: IExpr, index: IExpr) -> tuple[IExpr, IExpr]:
    """(offset, length) of part `index` of `total` elements split into `parts` balanced parts:
    the first total % parts parts get one element more."""
    base = Bin(BinKind.DIV, total, parts)
    extra = Bin(BinKind.MOD, total, parts)
    lo = add(Bin(BinKind.MUL, index, base), Bin(BinKind.MIN, index, extra))
    length = add(base, Bin(BinKind.LT, index, extra))
    return simplify(lo), simplify(length)


def py_source(e: IExpr) -> str:
    """The expression as Python source over a dict `env` (used to compile hot evaluations)."""
    if isinstance(e, Const):
        return str(e.value)
    if isinstance(e, Var):
        return f"env[{e.name!r}]"
    if isinstance(e, Sel):
        return f"({py_source(e.then)} if {py_source(e.cond)} else {py_source(e.orelse)})"
    if isinstance(e, Elem):     # `_element`: ir.element, bound where the source is compiled
        return f"_element(env[{e.name!r}], {py_source(e.index)}, {e.name!r})"
    a, b = py_source(e.lhs), py_source(e.rhs)
    if e.kind in (BinKind.MIN, BinKind.MAX):
        return f"{e.kind.value}({a}, {b})"
    if e.kind is BinKind.LOG2:
        return f"(({a}).bit_length() - 1)"
    if e.kind in _COMPARE:
        return f"int({a} {e.kind.value} {b})"
    op = {BinKind.DIV: "//"}.get(e.kind, e.kind.value)
    return f"({a} {op} {b})"


# C++ precedence of the binary operators c_source prints (a smaller number binds tighter; 2 is a
# primary expression: a name, a literal, a call, a cast).
_C_PRIMARY = 2
_C_PREC = {BinKind.MUL: 5, BinKind.DIV: 5, BinKind.MOD: 5, BinKind.ADD: 6, BinKind.SUB: 6,
           BinKind.SHL: 7, BinKind.SHR: 7,
           BinKind.LT: 9, BinKind.LE: 9, BinKind.GT: 9, BinKind.GE: 9, BinKind.EQ: 10, BinKind.NE: 10,
           BinKind.AND: 11, BinKind.XOR: 12, BinKind.OR: 13}
_INT32 = range(-2**31, 2**31)


def c_source(e: IExpr, names: Mapping[str, str]) -> str:
    """The expression as C++ whose value is e's, written the way one would by hand: no parentheses
    that C++ precedence makes redundant, literals bare, comparisons bare (C++ bool, which converts
    to 0 or 1 wherever an integer is expected; an `if` takes it as it is).

    `names` maps IR names to C++ expressions of type int64_t that bind like a name (an identifier
    or a call). Arithmetic is done in int64_t: an operator with an int64_t operand converts the
    other one (an int literal, a bool), and the only cast written is on an operator neither of whose
    operands is int64_t (two literals, a literal and a comparison, two comparisons: int arithmetic,
    which could overflow), where the left operand becomes `int64_t(...)`. Division and remainder
    truncate in C++ where the IR floors: the same for the non-negative values a valid program has.
    Run `simplify` first for the shortest text (it folds constant subterms)."""
    return _c(e, names)[0]


def _c(e: IExpr, names: Mapping[str, str]) -> tuple[str, int, bool]:
    """(text, precedence, whether its C++ type is int64_t)."""
    if isinstance(e, Const):
        v = e.value
        if v == -2**63:                        # 9223372036854775808 is not an int64_t literal
            return "(-9223372036854775807 - 1)", _C_PRIMARY, True
        # an int literal outside int's range has a 64-bit type (long or long long)
        return (str(v) if v >= 0 else f"({v})"), _C_PRIMARY, v not in _INT32
    if isinstance(e, Var):
        return names[e.name], _C_PRIMARY, True
    if isinstance(e, Elem):     # a subscript binds like a name; the index is proven in range
        return f"{names[e.name]}[{_c(e.index, names)[0]}]", _C_PRIMARY, True
    if isinstance(e, Sel):
        # (c ? a : b), parenthesized (the conditional binds loosest); int64_t when either branch
        # is (the usual conversions), else the first branch is cast so that the result is
        (c, _, _), (a, _, wa), (b, _, wb) = (_c(x, names) for x in (e.cond, e.then, e.orelse))
        # a conditional as a branch of another needs no parentheses of its own (c ? d ? x : y : z
        # groups as written): they are dropped
        a, b = (x[1:-1] if isinstance(y, Sel) else x for x, y in ((a, e.then), (b, e.orelse)))
        return f"({c} ? {a if wa or wb else f'int64_t({a})'} : {b})", _C_PRIMARY, True
    (a, pa, wa), (b, pb, wb) = _c(e.lhs, names), _c(e.rhs, names)
    k = e.kind
    if k is BinKind.MIN:     # strata::Min(int64_t, int64_t): its arguments convert
        return f"strata::Min({a}, {b})", _C_PRIMARY, True
    if k is BinKind.MAX:
        return f"strata::Max({a}, {b})", _C_PRIMARY, True
    if k is BinKind.LOG2:
        return f"strata::Log2({a})", _C_PRIMARY, True
    if k is BinKind.MOD and not nonnegative(e.lhs):
        return f"strata::Mod({a}, {b})", _C_PRIMARY, True
    prec = _C_PREC[k]
    if k in _COMPARE:
        # arithmetic binds tighter; a comparison operand of a comparison is parenthesized even
        # where C++ would not need it (`a < b == c` reads as a chained comparison)
        a, b = (f"({x})" if px >= _C_PREC[BinKind.LT] else x for x, px in ((a, pa), (b, pb)))
        return f"{a} {k.value} {b}", prec, False
    if k in (BinKind.SHL, BinKind.SHR) and not wa and isinstance(e.lhs, Const):
        # a shift takes the type of its left operand, whatever the right one's: 1 << k must
        # shift an int64_t, written as one (not a conversion: a 64-bit literal)
        a, pa, wa = f"int64_t{{{a}}}", _C_PRIMARY, True
    elif not (wa or wb) or (k in (BinKind.SHL, BinKind.SHR) and not wa):
        a, pa, wa = f"int64_t({a})", _C_PRIMARY, True
    # left-associative: the left operand keeps its parentheses only if it binds looser, or, among
    # * / %, if it is a different operator ((a / b) * c reads ambiguously without them); the right
    # operand keeps them if it binds as loose or looser (a - (b - c), a * (b / c))
    # ... and a bitwise operator inside another ((a & b) | c): GCC's -Wparentheses asks for it
    if pa > prec or (pa == prec and prec != 6 and not (e.lhs.kind is k and k in (
            BinKind.MUL, BinKind.AND, BinKind.XOR, BinKind.OR))) or (pa == 7 and prec != 7) or \
            (pa in (6, 7, 9, 10) and prec >= 11) or (pa in (11, 12) and prec > pa):
        a = f"({a})"
    if pb >= prec or (pb in (6, 7) and prec >= 7) or (pb in (9, 10) and prec >= 11) or \
            (pb in (11, 12) and prec > pb):
        # (a << b) + c, a & (b + c): written with parentheses although C++ would not need them,
        # as compilers warn and readers misread shifts and bitwise operators among + and -
        b = f"({b})"
    return f"{a} {k.value} {b}", prec, True
