"""Races and the entry/exit rules, on an executed instance.

In: an instance and its execution (the happens-before relation; the accesses of routing constructs
are only known once executed). Out: at most MAX_RACES_REPORTED diagnostics. A race is two accesses
to overlapping elements of one rank's buffer, at least one a write, that happens-before does not
order. Every access to a peer's memory must complete before that peer returns (its memory is still
the call's). That it comes after the peer entered the call needs no check: every call begins with
the agreement of the live ranks, a barrier (timeline.Execution).
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from stratac.diagnostics import Codes, Diagnostic, Note, error
from stratac.ir.instantiate import Access, Event, EventKind, Instance
from stratac.verify.samples import context
from stratac.verify.timeline import Execution

MAX_RACES_REPORTED = 3


def check_races(inst: Instance, ex: Execution) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    exit_index = [len(tl) - 1 for tl in inst.timelines]
    # Accesses separated by a barrier of every rank are ordered by it, so only accesses between
    # the same two such barriers can race: group by (owner, buffer, barrier epoch). A team's
    # barrier (barrier(node)) orders its members only, so it starts no epoch. An asynchronous
    # stage's accesses are in flight until its await, and a barrier does not complete them
    # (strata::Barrier does not quiet the SDMA queues): they belong to every epoch from the post's
    # to the await's, as they stay open across a team's barrier. In the epochs after its first an
    # access is `carried`; two carried accesses met in an earlier epoch already, so they are
    # compared only there (each pair once).
    groups: dict[tuple[int, str, int], list[tuple[Access, Event, bool]]] = {}
    BARRIER = EventKind.BARRIER   # the hot loop: no enum lookups
    hb = ex.hb
    for tl in inst.timelines:
        epoch = 0
        for ev in tl:
            if ev.kind is BARRIER and ev.members is None:
                epoch += 1
            if not ev.accesses:
                continue
            rank, end = ev.rank, ev.end
            if ev.done < 0:          # the usual case: complete in its event, one epoch
                for a in ev.accesses:
                    key = (a.owner, a.buffer, epoch)
                    group = groups.get(key)
                    if group is None:
                        groups[key] = group = []
                    group.append((a, ev, False))
            else:
                last = epoch + sum(1 for e in tl[ev.index + 1:ev.done]
                                   if e.kind is BARRIER and e.members is None)
                for a in ev.accesses:
                    for e in range(epoch, last + 1):
                        group = groups.setdefault((a.owner, a.buffer, e), [])
                        group.append((a, ev, e > epoch))
            for a in ev.accesses:
                # (entry needs no check: every call begins with the agreement of the live ranks,
                # a barrier, timeline.Execution)
                if a.owner != rank and not hb(rank, end, a.owner, exit_index[a.owner]):
                    kind = "writes" if a.write else "reads"
                    diags.append(error(
                        Codes.EXIT, f"rank {ev.rank} {kind} {a.buffer}[{a.lo}:{a.hi}]@{a.owner}, "
                        f"but rank {a.owner} may return before that completes ({context(inst)})",
                        a.span, Note("nothing orders this before the peer's exit: add a barrier or "
                                     "a signal the peer waits for after it"), *_in_flight(inst, ev)))
                    if len(diags) >= MAX_RACES_REPORTED:
                        return diags
    for (owner, buf, _), items in groups.items():
        if len(items) >= _PAIRS_FROM and _all_ordered(ex, items):
            continue
        items.sort(key=lambda t: t[0].lo)
        # live accesses by kind, each a heap on the end of the interval: "r" reads, "w" plain
        # writes, and one per accumulate operation (accumulates of one op never conflict, so a
        # world of accumulates into one slice costs no pairwise checks)
        active: dict[str, _Live] = {"w": _Live(), "r": _Live()}
        for seq, (a, ev, carried) in enumerate(items):
            lo = a.lo
            for live in active.values():
                if live.heap and live.heap[0][0] <= lo:
                    live.drop_before(lo)
            # a write is compared with every kind; a read with all but reads, an accumulate with
            # all but accumulates of its op (in the order the kinds were first met)
            kind = "r" if not a.write else ("acc:" + a.accumulate if a.accumulate else "w")
            conflict = None
            for k, live in active.items():
                if live.heap and (k != kind or k == "w"):
                    conflict = _oldest_unordered(ex, a, ev, carried, live)
                    if conflict:
                        break
            if conflict:
                b, bev = conflict
                lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
                what_a, what_b = _verb(a), _verb(b)
                diags.append(error(
                    Codes.RACE, f"race on {buf}[{lo}:{hi}]@{owner} ({context(inst)}): rank {ev.rank} "
                    f"{what_a} it here and rank {bev.rank} {what_b} it, unordered", a.span,
                    Note(f"rank {bev.rank} {what_b} it here", b.span),
                    *_in_flight(inst, ev), *_in_flight(inst, bev), *_credit(inst, (a, ev), (b, bev))))
                if len(diags) >= MAX_RACES_REPORTED:
                    return diags
            live = active.get(kind)
            if live is None:
                active[kind] = live = _Live()
            live.add((a.hi, seq, a, ev, carried))
    return diags


# Groups of at least this many accesses are first checked pair by pair (_all_ordered); below it
# the numpy arrays cost more than the sweep.
_PAIRS_FROM = 64
# The most overlapping pairs per access _all_ordered enumerates before it leaves the group to the
# sweep (a slot written and read step after step overlaps every access of it with every other).
_PAIRS_PER_ACCESS = 8


def _all_ordered(ex: Execution, items: list[tuple[Access, Event, bool]]) -> bool:
    """Whether check_races's sweep would find no race in this group, decided from the pairs: every
    two accesses that overlap and conflict (not both reads, not accumulates of one op, not one
    move's read and write of the same elements, not both carried) are ordered: other events, one
    complete before the other starts. The sweep compares exactly these pairs (the live accesses
    when an access starts, in the order of `lo`, are those before it whose `hi` exceeds its `lo`;
    its shortcuts by program order skip only pairs that are ordered). False is no verdict: the
    sweep decides, and names the race. The usual group (a ring's slice of a rank's buffer) has a
    few accesses per element range, so its pairs are about as many as its accesses, and each costs
    one happens-before lookup instead of a step of the sweep."""
    n = len(items)
    kinds: dict[str | None, int] = {}   # 0 a read; a write: one code per accumulate op (None: plain)
    rows = np.fromiter(((a.lo, a.hi, kinds.setdefault(a.accumulate, len(kinds) + 1) if a.write else 0,
                         a.instance, carried, ev.rank, ev.index, ev.end) for a, ev, carried in items),
                       np.dtype((np.int64, 8)), n)
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    lo, hi, code, inst, carried, ranks, index, end = rows.T
    # pairs (b, a), b before a in that order and overlapping it (b's hi beyond a's lo), at least one
    # of them a write: two reads never race, and a slice every rank reads would make world^2 pairs
    after = np.searchsorted(lo, hi, side="left")    # for b: the first access starting at or after its hi
    writes = np.flatnonzero(code)
    reads = np.flatnonzero(code == 0)
    # b a write: every access after it up to `after`; b a read: the writes among those
    w_counts = np.maximum(after[writes] - writes - 1, 0)
    first_w = np.searchsorted(writes, reads, side="right")
    r_counts = np.maximum(np.searchsorted(writes, after[reads], side="left") - first_w, 0)
    total = int(w_counts.sum() + r_counts.sum())
    if total > _PAIRS_PER_ACCESS * n:
        return False
    if not total:
        return True
    b_w, a_any = _ranges(writes, writes + 1, w_counts)
    b_r, nth_w = _ranges(reads, first_w, r_counts)
    b = np.concatenate([b_w, b_r])
    a = np.concatenate([a_any, writes[nth_w]])
    plain = kinds.get(None, -1)      # plain writes: they conflict with writes too
    ca, cb = code[a], code[b]
    conflict = (ca | cb) != 0
    conflict &= (ca != cb) | (ca == plain)
    conflict &= ~((inst[a] == inst[b]) & (lo[a] == lo[b]) & (hi[a] == hi[b]))
    conflict &= (carried[a] & carried[b]) == 0
    a, b = a[conflict], b[conflict]
    if not len(a):
        return True
    ra, rb, ia, ib, ea, eb = ranks[a], ranks[b], index[a], index[b], end[a], end[b]
    same = ra == rb
    # one rank: program order (one event with itself is never ordered)
    if not np.all(~same | (eb < ia) | (ea < ib)):
        return False
    vc = ex.vc
    other = ~same
    for xr, xi, xe, yr, yi, ye in zip(ra[other].tolist(), ia[other].tolist(), ea[other].tolist(),
                                      rb[other].tolist(), ib[other].tolist(), eb[other].tolist()):
        # y's access complete before x's starts, or x's before y's
        if not (vc[xr][xi][yr] > ye or vc[yr][yi][xr] > xe):
            return False
    return True


def _ranges(owners: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each i, counts[i] pairs (owners[i], starts[i] + k), k = 0, 1, ...: as two arrays."""
    total = int(counts.sum())
    which = np.repeat(np.arange(len(counts)), counts)
    k = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return owners[which], starts[which] + k


class _Live:
    """The live accesses of one kind in a sweep over intervals: a heap on the end of each interval
    (the sweep drops those that end before the next access starts), and the same entries (hi, seq,
    access, event, carried) by rank, each rank's sorted by (event index, seq), with the count of
    asynchronous ones among them."""

    def __init__(self):
        self.heap: list = []
        self.by_rank: dict[int, list] = {}
        self.posted: dict[int, int] = {}

    def add(self, entry) -> None:
        heapq.heappush(self.heap, entry)
        ev = entry[3]
        bisect.insort(self.by_rank.setdefault(ev.rank, []), (ev.index, entry[1], entry))
        if ev.done >= 0:
            self.posted[ev.rank] = self.posted.get(ev.rank, 0) + 1

    def drop_before(self, lo: int) -> None:
        heap = self.heap
        while heap and heap[0][0] <= lo:
            entry = heapq.heappop(heap)
            ev = entry[3]
            ranked = self.by_rank[ev.rank]
            if len(ranked) == 1:
                del self.by_rank[ev.rank]
            else:
                del ranked[bisect.bisect_left(ranked, (ev.index, entry[1]))]
            if ev.done >= 0:
                self.posted[ev.rank] -= 1


def _oldest_unordered(ex: Execution, a: Access, ev: Event, carried: bool, live: _Live):
    """The oldest live access (all overlap a) that nothing orders with a, as (access, event), or
    None.

    Ordered means one access is complete (its event, or an asynchronous stage's await) before the
    other starts. The live accesses are taken rank by rank, in the order of their events: a is
    complete before the start of a suffix of them (found by bisection: if a is before event j of
    rank q, it is before every later one); of the others, once an access b is complete before a
    starts, so is every access of its rank that completes before b's event starts (program
    order, then b), which is all of the earlier ones when the rank has no asynchronous stage live.
    A slot written and read step after step (a FIFO's) keeps many accesses live, of which each
    new one is compared with a few."""
    best = None
    hb, r, i, end = ex.hb, ev.rank, ev.index, ev.end
    for q, entries in live.by_rank.items():
        if len(entries) == 1:             # the usual case: one access of q live
            _, seq, (_, _, b, bev, b_carried) = entries[0]
            if (a.instance == b.instance and a.lo == b.lo and a.hi == b.hi) or (carried and b_carried):
                continue
            if bev is not ev and (hb(q, bev.end, r, i) or hb(r, end, q, bev.index)):
                continue
            if best is None or seq < best[0]:
                best = (seq, b, bev)
            continue
        lo, hi = 0, len(entries)          # the first entry a is complete before
        while lo < hi:
            mid = (lo + hi) // 2
            if hb(r, end, q, entries[mid][0]):
                hi = mid
            else:
                lo = mid + 1
        cut = -1     # accesses of rank q complete before event `cut` are before a
        posted = live.posted.get(q, 0)
        for j in range(lo - 1, -1, -1):
            _, seq, (_, _, b, bev, b_carried) = entries[j]
            if bev.end < cut:
                continue
            if a.instance == b.instance and a.lo == b.lo and a.hi == b.hi:
                continue  # one elementwise move reading and writing the same elements
            if carried and b_carried:
                continue  # compared in the epoch where the later of the two was posted
            if bev is not ev and hb(q, bev.end, r, i):
                cut = max(cut, bev.index)
                if not posted:
                    break     # every earlier access of q completes before bev starts
                continue
            if best is None or seq < best[0]:
                best = (seq, b, bev)
    return None if best is None else best[1:]


def _in_flight(inst: Instance, ev: Event) -> list[Note]:
    """For an access of an asynchronous stage: where its copies complete."""
    if ev.done < 0:
        return []
    done = inst.timelines[ev.rank][ev.done]
    return [Note(f"rank {ev.rank}'s asynchronous stage {ev.stage.handle} is in flight until this "
                 "await: a signal or wait before it does not order its copies", done.span)]


def _credit(inst: Instance, x: tuple[Access, Event], y: tuple[Access, Event]) -> list[Note]:
    """For a schedule that reuses flag slots (a flag with rounds), a write that races with another
    rank's read of the same elements: the credit that would order the write after the read."""
    if all(n == 1 for n in inst.flag_rounds.values()):
        return []
    (w, wev), (r, rev) = (x, y) if x[0].write else (y, x)
    if not w.write or r.write or wev.rank == rev.rank:
        return []
    return [Note(f"if rank {wev.rank} reuses elements rank {rev.rank} reads (a FIFO slot), the "
                 f"reuse needs a credit: rank {rev.rank} signals a flag after its read and rank "
                 f"{wev.rank} waits for it before it writes (dsl/README.md, \"Reusable flag slots\")")]


def _verb(a: Access) -> str:
    if a.accumulate:
        return f"accumulates ({a.accumulate}) into"
    return "writes" if a.write else "reads"
