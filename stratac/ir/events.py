"""What an instance is made of: per-rank events, their moves and accesses, and the integer rules
both walks that build them evaluate with.

In: the IR's node types. Out: `Event`, `Access`, `Move`, `RouteInst` and `EventKind` (built by
stratac.ir.instantiate rank by rank and by stratac.ir.lockstep for all ranks at once, read by the
verifier); the kernel's checked integer operations (`div`, `mod`, `shl`, `shr`, `log2`: the device
computes / on non-negative operands only, % by a positive number, shifts within int64); and
`barred` (whether an `if` has a barrier in an arm, which decides how its barriers are numbered).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from stratac import ir
from stratac.diagnostics import Span


class EventKind(enum.Enum):
    ENTRY = "entry"
    STAGE = "stage"
    BARRIER = "barrier"
    SIGNAL = "signal"
    WAIT = "wait"
    AWAIT = "await"    # the asynchronous stages it names are complete
    EXIT = "exit"


@dataclass(slots=True)   # not frozen: a frozen dataclass's __init__ costs a setattr per field,
class Access:            # and a step loop at world 384 makes millions of them
    owner: int
    buffer: str
    lo: int
    hi: int
    write: bool
    instance: int      # accesses of one move share it (a move may read and write the same elements)
    span: Span
    accumulate: str | None = None   # the op of an atomic accumulate (a write that commutes with
                                    # other accumulates of the same op)


@dataclass(slots=True)   # not frozen, like Access
class Move:
    dst: tuple[int, str, int, int]                # owner, buffer, lo, hi
    srcs: tuple[tuple[int, str, int, int], ...]
    op: ir.Op | None                              # None: a copy (one source)
    span: Span
    accumulate: bool = False                      # dst op= src (the sources are added to dst)


@dataclass(frozen=True)
class RouteInst:
    """A routing construct at concrete sizes. Its data movement depends on values (expert ids,
    counts, offsets), so the verifier expands it into accesses and moves when it executes it."""

    kind: ir.RouteKind
    rank: int
    dst: tuple[int, str, int, int]
    buffers: dict                  # operand role -> buffer name
    experts: int
    span: Span
    tokens: int = 0
    topk: int = 0
    hidden: int = 0
    rows: int = 0                  # rows of the window (place's destination, gather's source)
    capacity: int = 0              # slots: the rows per (expert, source rank)
    region: int | None = None      # exscan(counts, R): R, the rows of each local expert's region


@dataclass(slots=True)
class Event:
    kind: EventKind
    rank: int
    index: int
    span: Span | None
    # the lists an event of its kind fills are made with it (a stage: accesses, moves, routes; a
    # signal: signals; a wait: waits); the others stay the shared empty tuple: a step loop makes
    # about a million events per instance at world 384, and five new lists each cost seconds
    stage: ir.Stage | None = None
    accesses: list[Access] = ()              # type: ignore[assignment]
    moves: list[Move] = ()                   # type: ignore[assignment]
    # signals: (owner, flag, slot, round); waits: (flag, slot, round) of the rank's own flags
    signals: list[tuple[int, str, int, int, Span]] = ()   # type: ignore[assignment]
    waits: list[tuple[str, int, int, Span]] = ()  # type: ignore[assignment]
    barrier: int = -1          # the stamp (or, before the passes, the ordinal) ranks meet at
    members: tuple[int, ...] | None = None   # a team barrier: the ranks it joins (None: all)
    routes: list[RouteInst] = ()             # type: ignore[assignment]
    # an asynchronous stage's accesses are in flight from this event until the AWAIT event at
    # index `done` of the same rank; -1: they complete in the event itself
    done: int = -1

    @property
    def end(self) -> int:
        """The index of the event at which this event's accesses are complete."""
        return self.index if self.done < 0 else self.done


class NegativeOperand(ArithmeticError):
    pass


def div(a: int, b: int) -> int:
    if a < 0 or b < 0:
        raise NegativeOperand(f"{a} / {b}")
    return a // b


class BadOperand(ArithmeticError):
    pass


def mod(a: int, b: int) -> int:
    """Floored: in [0, b) for b > 0 (the kernel's strata::Mod), so (rank - 1) % world is a rank."""
    if b == 0:
        raise ZeroDivisionError
    if b < 0:
        raise BadOperand(f"{a} % {b}: the right operand of % must be positive")
    return a % b


INT64 = 1 << 63


def shl(a: int, b: int) -> int:
    if a < 0 or not 0 <= b < 63:
        raise BadOperand(f"{a} << {b}: a shift needs a non-negative left operand and a count in "
                          "[0, 63)")
    if a << b >= INT64:
        raise BadOperand(f"{a} << {b} overflows int64")
    return a << b


def shr(a: int, b: int) -> int:
    if a < 0 or not 0 <= b < 63:
        raise BadOperand(f"{a} >> {b}: a shift needs a non-negative left operand and a count in "
                          "[0, 63)")
    return a >> b


def log2(a: int) -> int:
    if a < 1:
        raise BadOperand(f"log2({a}): log2 takes a positive operand")
    return a.bit_length() - 1


def has_barrier(ops) -> bool:
    return any(type(op) is ir.Barrier or (type(op) is ir.If and barred(op))
               or (type(op) is ir.Loop and has_barrier(op.body)) for op in ops)


_BARRED: dict[int, tuple[ir.If, bool]] = {}


def barred(op: ir.If) -> bool:
    """Whether an if has a barrier in an arm (remembered per node: the per-rank walk asks on every
    rank)."""
    hit = _BARRED.get(id(op))
    if hit is None or hit[0] is not op:
        if len(_BARRED) > 65536:
            _BARRED.clear()
        hit = _BARRED[id(op)] = (op, has_barrier(op.then + op.orelse))
    return hit[1]
