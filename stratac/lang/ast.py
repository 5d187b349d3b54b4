"""The syntax tree of a .strata file: frozen dataclasses, every node with its span."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from stratac.diagnostics import Span

# ---- integer expressions (sizes, indices, rank expressions) ----

@dataclass(frozen=True)
class IntLit:
    value: int
    span: Span


@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class Call:
    """A built-in integer function: log2(x), min(a, b), max(a, b), sizeof(T)."""

    fn: str
    args: tuple["Expr", ...]
    span: Span
    fn_span: Span


@dataclass(frozen=True)
class CondExpr:
    """``(then if cond else orelse)``: an integer conditional."""

    cond: "Cond | CondIs"
    then: "Expr"
    orelse: "Expr"
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / % << >> & ^ |
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclass(frozen=True)
class Attr:
    """``team.rank``, ``team.size``: an attribute of a team."""

    team: str
    attr: str
    span: Span
    team_span: Span


@dataclass(frozen=True)
class Member:
    """``team[i]``: the rank of member i of a team; ``t[i]``: element i of an integer array (sema
    tells them apart by the name)."""

    team: str
    index: "Expr"
    span: Span
    team_span: Span


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span


Expr = Union[IntLit, Name, BinOp, Neg, Call, CondExpr, Attr, Member]


# ---- references to data ----

@dataclass(frozen=True)
class Index:
    index: Expr
    span: Span


@dataclass(frozen=True)
class Range:
    lo: Expr
    hi: Expr
    span: Span


@dataclass(frozen=True)
class Ref:
    """``name``, ``name[i]``, ``name[lo:hi]``, ``part[i][lo:hi]``, ``chunk[i][c]``, each optionally
    ``@rank``. ``sub`` is the second selector (inside part i)."""

    name: str
    selector: Index | Range | None
    rank: Expr | None
    span: Span
    name_span: Span
    sub: Index | Range | None = None


@dataclass(frozen=True)
class SplitCall:
    buffer: str
    parts: Expr
    span: Span
    buffer_span: Span


@dataclass(frozen=True)
class ReduceCall:
    op: str  # sum | max | min | the name of a redop parameter
    operand: Ref
    var: str
    domain: str  # ranks | peers
    span: Span
    team: str | None = None   # `for p in node.ranks`: the members of a team (domain ranks|peers)


@dataclass(frozen=True)
class ReduceList:
    """`op(a, b, ...)`: the reduction of two or more named regions, element by element."""

    op: str  # sum | max | min | the name of a redop parameter
    operands: tuple[Ref, ...]
    span: Span


# ---- statements ----

@dataclass(frozen=True)
class RouteCall:
    """A MoE routing construct: histogram, exscan, slots, place or gather, with its operands."""

    kind: str
    args: tuple["Expr", ...]
    span: Span


@dataclass(frozen=True)
class Assign:
    target: Ref
    value: Ref | SplitCall | ReduceCall | ReduceList | RouteCall
    span: Span


@dataclass(frozen=True)
class Accum:
    """dst op= src: reduce on write (an atomic DMA accumulate into dst)."""

    target: Ref
    op: str  # sum | max | min | the name of a redop parameter
    value: Ref
    span: Span


@dataclass(frozen=True)
class Cond:
    op: str  # == != < <= > >=
    lhs: Expr
    rhs: Expr
    span: Span


@dataclass(frozen=True)
class CondIs:
    """`expr is PROPERTY`: the one property is pow2 (a power of two, 1 included)."""

    lhs: Expr
    prop: str
    span: Span
    prop_span: Span


@dataclass(frozen=True)
class Let:
    """let name = expr: a named integer, visible after it in its block and the blocks inside."""

    name: str
    value: Expr
    span: Span
    name_span: Span


@dataclass(frozen=True)
class VarDecl:
    """var name = expr: an integer the running rank may change with `set` (loop state), visible
    after it in its block and the blocks inside; `var name[size] = expr`: an array of size integers,
    each starting as expr."""

    name: str
    value: Expr
    span: Span
    name_span: Span
    size: "Expr | None" = None


@dataclass(frozen=True)
class SetVar:
    """set name = expr: a new value for a var; `set name[index] = expr`: for an array's element."""

    name: str
    value: Expr
    span: Span
    name_span: Span
    index: "Expr | None" = None


@dataclass(frozen=True)
class Requires:
    """requires COND: the world sizes the schedule supports (a condition on world alone)."""

    cond: "Cond | CondIs"
    span: Span


@dataclass(frozen=True)
class If:
    cond: Cond | CondIs
    then: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...]
    span: Span


@dataclass(frozen=True)
class ScratchDecl:
    """A buffer the schedule needs besides its parameters (staging baselines, routing offsets)."""

    name: str
    symmetric: bool
    dtype: str
    dims: tuple[Expr, ...]
    span: Span
    dtype_span: Span


@dataclass(frozen=True)
class Barrier:
    span: Span
    team: str | None = None      # barrier(node): the members of team node only
    team_span: Span | None = None


@dataclass(frozen=True)
class TeamDecl:
    """team NAME = KIND(EXPR, ...): block(T), stride(T), across(team) or groups(S0, S1, ...)."""

    name: str
    kind: str
    arg: "Expr"
    span: Span
    name_span: Span
    kind_span: Span
    more: tuple = ()     # the arguments after the first (groups' sizes)


@dataclass(frozen=True)
class Stage:
    engine: str  # aiv | sdma | auto
    body: tuple["Stmt", ...]
    span: Span
    handle: str | None = None      # `on sdma async h:` posts and returns; `await h` completes it
    handle_span: Span | None = None


@dataclass(frozen=True)
class Await:
    """await h: the copies of the asynchronous stage h are complete."""

    handle: str
    span: Span
    handle_span: Span


@dataclass(frozen=True)
class For:
    """for var in ranks|peers, or for var in lo .. hi (domain "range": lo, lo + 1, ..., hi - 1)."""

    var: str
    domain: str
    body: tuple["Stmt", ...]
    span: Span
    var_span: Span
    lo: Expr | None = None
    hi: Expr | None = None
    team: str | None = None      # for p in node.ranks|peers: over the members of a team


@dataclass(frozen=True)
class FlagDecl:
    name: str
    size: Expr
    span: Span
    rounds: Expr | None = None   # `rounds R`: each slot is signalled up to R times per call


@dataclass(frozen=True)
class Signal:
    ref: Ref
    span: Span
    round: Expr | None = None    # `round r` (None: round 0)


@dataclass(frozen=True)
class Wait:
    ref: Ref
    span: Span
    round: Expr | None = None


@dataclass(frozen=True)
class RedopArg:
    """sum, max or min as an argument of a call."""

    name: str
    span: Span


@dataclass(frozen=True)
class IntArg:
    """An integer as an argument of a call (a number, or an expression in parentheses): a rank
    parameter's value."""

    value: "Expr"
    span: Span


@dataclass(frozen=True)
class CallStmt:
    """call NAME(args) on TEAM: the schedule NAME inlined on the members of TEAM (`world`: every
    rank); an argument is a region of a buffer (a Ref without @), a redop parameter's name (a Ref
    without selector), a RedopArg, or a rank parameter's value (an IntArg, or a Ref of one name)."""

    callee: str
    args: tuple["Ref | RedopArg | IntArg", ...]
    team: str
    span: Span
    callee_span: Span
    team_span: Span


Stmt = Union[Assign, Accum, If, ScratchDecl, Barrier, Stage, Await, For, FlagDecl, Signal, Wait, Let,
             VarDecl, SetVar, Requires, TeamDecl, CallStmt]


# ---- declarations ----

@dataclass(frozen=True)
class Param:
    """A tensor parameter (dims given) or a scalar one (dims None; dtype is rank or redop)."""

    name: str
    symmetric: bool
    dtype: str
    dims: tuple[Expr, ...] | None
    span: Span
    dtype_span: Span


@dataclass(frozen=True)
class ContractArg:
    name: str
    out: str | None
    span: Span
    form: str | None = None   # `per_expert(R)`: "per_expert", name R


@dataclass(frozen=True)
class Contract:
    kind: str
    args: tuple[ContractArg, ...]
    span: Span


@dataclass(frozen=True)
class Schedule:
    name: str
    params: tuple[Param, ...]
    contract: Contract
    body: tuple[Stmt, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True)
class Module:
    schedules: tuple[Schedule, ...]
    source_name: str
    imports: tuple["Import", ...] = ()


@dataclass(frozen=True)
class Import:
    """`import "PATH"`: the schedules of another file, callable from this one."""

    path: str
    span: Span
