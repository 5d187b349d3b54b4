"""Control blocks, and which of their loops a rank's cores share.

In: a schedule. Out: the loops of signals and waits that the kernel shares among a rank's vector
cores (`shared_loops`), read by codegen (the kernel's text) and by `stratac simulate` (its charge
for issuing flags), so that both follow one rule.

A *control block* is a run of signals and waits, and of loops and ifs that hold nothing else (the
lets of their bodies aside), at one level of a schedule's body, with nothing but lets between
them. The kernel runs a block between two `SyncAll`s of the rank's cores: after the stage before
it has ended on every core, before any core starts the stage after it (codegen.emit, the
"control" node).

By default core 0 runs a block alone, in program order. A block is *shared* when
- no signal of it comes after one of its waits in program order (a loop that holds both counts as
  one that does, since its next trip's signal follows this trip's wait), and
- it signals no flag with rounds (the rounds of a slot must land in program order, which one core
  issuing them keeps: dsl/README.md, "Reusable flag slots").
Then each loop at the top of the block, or in an if there, runs its trip v on core
(v - first) % cores, and the rest of the block runs on core 0. Two-shot with flags signals and
waits for world - 1 peers: one core issued 8,191 flags at world 8,192, the cores share them now.

Why the shared block means what the program says: the verifier orders a rank's signals and waits
one after the other. Shared, a core runs its signals before its waits (none follows a wait), and
the signals of different cores are unordered among themselves, as are the waits. A signal's place
among the rank's other signals is invisible to every other rank: what a waiter learns from it is
what happened before it, and that is everything before the block (the SyncAll) in both. A wait's
place among the other waits orders nothing, since no signal of the block follows any of them, and
everything after the block follows every wait (the SyncAll). Every signal of the block is issued
without waiting for anything, so a wait that the program order would let through at once (its
signal came before another one it already saw) still ends, a little later. No two signals of a
block set the same slot (without rounds a slot is signalled once per call, E0306), so their order
cannot change a slot's last value.
"""

from __future__ import annotations

from stratac.ir.nodes import Const, If, Local, Loop, Schedule, Signal, Wait


def is_control(op) -> bool:
    """Signals and waits, possibly under loops and ifs (and the lets of their bodies), and nothing
    else."""
    if isinstance(op, (Signal, Wait)):
        return True
    if isinstance(op, Loop):
        return all(is_control(o) or _named_let(o) for o in op.body)
    if isinstance(op, If):
        return all(is_control(o) or _named_let(o) for o in op.then + op.orelse)
    return False


def _named_let(op) -> bool:
    return isinstance(op, Local) and op.inline


def blocks(ops) -> list[list]:
    """The control blocks at this level of a body: runs of control ops with only lets between
    them (the lets are left out), in order."""
    out: list[list] = []
    run: list | None = None
    for op in ops:
        if is_control(op):
            if run is None:
                run = []
                out.append(run)
            run.append(op)
        elif not _named_let(op):
            run = None
    return out


def shared_loops(s: Schedule) -> frozenset[int]:
    """The ids of the loops (Loop nodes of s's body) whose trips the rank's cores share: the loops
    at the top of a shared block or in an if there (the module says which blocks are shared)."""
    rounds = {f.name for f in s.flags if f.rounds != Const(1)}
    out: set[int] = set()

    def level(ops) -> None:
        for block in blocks(ops):
            if _shares(block, rounds):
                out.update(id(x) for op in block for x in loops(op))
        for op in ops:                  # the levels below: step loops and ifs around stages
            if is_control(op):
                continue
            if isinstance(op, Loop):
                level(op.body)
            elif isinstance(op, If):
                level(op.then)
                level(op.orelse)

    level(s.body)
    return frozenset(out)


def loops(op) -> list[Loop]:
    """The loops at the top of a control op, or in an if there (the ones a shared block shares)."""
    if isinstance(op, Loop):
        return [op]
    if isinstance(op, If):
        return [x for o in op.then + op.orelse for x in loops(o)]
    return []


def _shares(block: list, rounds: set[str]) -> bool:
    return any(loops(op) for op in block) and not _order(block, rounds)[2]


def _order(ops, rounds: set[str]) -> tuple[bool, bool, bool]:
    """(a signal, a wait, a signal after a wait or of a flag with rounds) in ops, in order."""
    signals = waits = late = False
    for op in ops:
        if isinstance(op, Signal):
            s, w, bad = True, False, op.flag in rounds
        elif isinstance(op, Wait):
            s, w, bad = False, True, False
        elif isinstance(op, Loop):
            s, w, bad = _order(op.body, rounds)
            bad = bad or (s and w)      # the next trip's signal follows this trip's wait
        elif isinstance(op, If):
            a, b = _order(op.then, rounds), _order(op.orelse, rounds)
            s, w, bad = a[0] or b[0], a[1] or b[1], a[2] or b[2]
        else:
            continue
        late = late or bad or (waits and s)
        signals, waits = signals or s, waits or w
    return signals, waits, late
