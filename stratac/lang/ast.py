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
class BinOp:
    op: str  # one of + - * / %
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span


Expr = Union[IntLit, Name, BinOp, Neg]


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
    """``name``, ``name[i]``, ``name[lo:hi]``, each optionally ``@rank``."""

    name: str
    selector: Index | Range | None
    rank: Expr | None
    span: Span
    name_span: Span


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
    value: Ref | SplitCall | ReduceCall | RouteCall
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
class If:
    cond: Cond
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


@dataclass(frozen=True)
class Stage:
    engine: str  # aiv | sdma | auto
    body: tuple["Stmt", ...]
    span: Span


@dataclass(frozen=True)
class For:
    var: str
    domain: str
    body: tuple["Stmt", ...]
    span: Span
    var_span: Span


@dataclass(frozen=True)
class FlagDecl:
    name: str
    size: Expr
    span: Span


@dataclass(frozen=True)
class Signal:
    ref: Ref
    span: Span


@dataclass(frozen=True)
class Wait:
    ref: Ref
    span: Span


Stmt = Union[Assign, Accum, If, ScratchDecl, Barrier, Stage, For, FlagDecl, Signal, Wait]


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
