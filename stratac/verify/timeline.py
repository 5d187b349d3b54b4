"""Happens-before, by executing the per-rank timelines of one instance with vector clocks.

In: an instance. Out: a vector clock for every event (so `hb` orders any two), the simulated
values after the call (`provenance`), and a deadlock or double-signal diagnostic if the execution
cannot finish. Every call begins with the agreement of the live ranks (strata::Agree), a barrier,
so every live rank's entry happens before any statement. Stages run in program order within a
rank, barriers join all ranks, a wait joins the signal that satisfies it. If no rank can move and
some have not finished, that is a deadlock, reported with who waits for what.

Ranks meet at barriers of equal stamps (on the IR after the passes, the stamps the kernel
compares). A kernel barrier waits until every rank has announced its stamp or a later one, so a
join is only what the kernel does when every rank's stamps grow barrier by barrier and stay within
the stamps a call reserves; anything else is refused first (`stamp_errors`). `unmet_barriers`
compares the kernel's stamps with the places at which the proof met the ranks, for re-verifying
the passes without executing.
"""

from __future__ import annotations

import numpy as np

from stratac.diagnostics import Codes, Diagnostic, Note, error
from stratac.ir.instantiate import Event, EventKind, Instance, clock_itemsize
from stratac.verify.provenance import Values
from stratac.verify.samples import context


def stamp_errors(inst: Instance) -> list[Diagnostic]:
    """Barrier and flag stamps the kernel could not synchronise with (a bug of the passes, since
    the epoch pass makes them): a stamp below 1 is met by the zeroed sync area of the first call,
    one beyond the call's stamps (`sync_ops`) by the next call's, and a barrier whose stamp does not
    exceed the one before it on its rank by that barrier's announcements."""
    s = inst.schedule
    if not s.lowered:
        return []
    env = {"world": inst.world, **inst.sizes}
    stamps = s.stamps(env)      # barriers in step loops: an expression of world and sizes
    for f in s.flags:
        seq = f.seq if isinstance(f.seq, int) else f.seq.eval(env)
        last = seq + inst.flag_rounds.get(f.name, 1) - 1
        if not 1 <= seq <= last <= stamps:
            has = f"stamp epoch + {seq}" if last == seq else f"stamps epoch + {seq}..{last} (its rounds)"
            return [error(Codes.SYNC_STAMP, f"flag {f.name} has {has}, outside the stamps "
                          f"1..{stamps} one call uses: a wait could take a flag of another call for "
                          "this one's", f.span)]
    for tl in inst.timelines:
        last = None
        for ev in tl:
            if ev.kind is not EventKind.BARRIER:
                continue
            if last is not None and ev.barrier <= last.barrier:
                why = (f"not above the stamp {last.barrier} of its barrier before (line "
                       f"{last.span.line}), whose announcements already let it through")
            elif ev.barrier < 1:
                why = "below 1: the zeroed sync area of a first call already lets it through"
            elif ev.barrier > stamps:
                why = (f"beyond the {stamps} stamps a call reserves: the next call's barriers "
                       "could be let through by it")
            else:
                last = ev
                continue
            return [error(Codes.SYNC_STAMP, f"on rank {ev.rank} this barrier has stamp epoch + "
                          f"{ev.barrier} ({context(inst)}), {why}", ev.span)]
    return []


def unmet_barriers(proof: Instance, inst: Instance) -> list[Diagnostic]:
    """Barriers the kernel (inst, the IR after the passes) would meet otherwise than the verifier
    met them (proof, the same instance of the verified IR, whose walk numbers the barrier places on
    its own: the members of a barrier meet at one place). The kernel meets at equal stamps, so the
    two agree when one place has one stamp on every rank and one stamp one place: then a stamp
    names a place, gaps or not."""
    stamp_of: dict[int, tuple] = {}
    place_of: dict[int, tuple] = {}
    for r in range(inst.world):
        if not inst.live(r):
            continue
        mine = [ev for ev in inst.timelines[r] if ev.kind is EventKind.BARRIER]
        proven = [ev for ev in proof.timelines[r] if ev.kind is EventKind.BARRIER]
        if len(proven) != len(mine):
            return [error(Codes.SYNC_STAMP, f"rank {r} passes {len(mine)} barriers in the kernel but "
                          f"{len(proven)} in the verified schedule ({context(inst)})", inst.schedule.span)]
        for a, b in zip(proven, mine):
            seen = stamp_of.setdefault(a.barrier, (b.barrier, b))
            other = place_of.setdefault(b.barrier, (a.barrier, b))
            if seen[0] != b.barrier:
                return [error(Codes.SYNC_STAMP, f"this barrier has stamp epoch + {b.barrier} on rank {r} but "
                              f"epoch + {seen[0]} on rank {seen[1].rank}, where the verifier met the two "
                              f"({context(inst)}): the kernel's barriers would not meet where the verified "
                              "ones do", b.span, Note(f"rank {seen[1].rank}'s barrier", seen[1].span))]
            if other[0] != a.barrier:
                return [error(Codes.SYNC_STAMP, f"this barrier has stamp epoch + {b.barrier} on rank {r}, as "
                              f"a barrier of rank {other[1].rank} the verifier did not meet it with "
                              f"({context(inst)}): the kernel's barriers would meet where the verified "
                              "ones do not", b.span, Note(f"rank {other[1].rank}'s barrier", other[1].span))]
    return []


class Execution:
    def __init__(self, inst: Instance):
        self.inst = inst
        # vc[r][i]: what event i of rank r knows of every other rank (component q: how many of
        # rank q's events happen before it). Its own component is not kept (hb compares indices
        # on one rank), so the events between two joins of a rank share one array, copied only
        # when a wait or barrier joins another clock in: a step loop's timelines hold about
        # world x steps events per rank, and an array per event would not fit at world 384.
        self.vc: list[list[np.ndarray]] = [[None] * len(tl) for tl in inst.timelines]
        self.order: list[Event] = []
        self.access_count = 0
        self.values = Values(inst)

    def run(self) -> list[Diagnostic]:
        # tags wrap around (mod 2^64) as the provenance simulation adds them
        with np.errstate(over="ignore"):
            return self._run()

    def _run(self) -> list[Diagnostic]:
        inst, W = self.inst, self.inst.world
        diags = stamp_errors(inst)
        if diags:
            return diags
        pos = [0] * W
        live = [r for r in range(W) if inst.live(r)]
        longest = max(len(tl) for tl in inst.timelines)
        dtype = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[clock_itemsize(longest)]
        # every call begins with the ranks' agreement (strata::Agree, runtime/device/strata_device.h),
        # a barrier of the live ranks before the first statement: each live rank knows that every
        # live rank has entered (its ENTRY, event 0, happens before anything the schedule does)
        # (one array for all of them: a clock is replaced at a join, never changed while shared)
        entered = np.zeros(W, dtype=dtype)
        entered[live] = 1
        none = np.zeros(W, dtype=dtype)
        cur = [entered if inst.live(r) else none for r in range(W)]
        # the clock of the signal event that set (owner, flag, slot, round), its own index + 1, the event
        signaled: dict[tuple[int, str, int, int], tuple[np.ndarray, int, Event]] = {}
        done = 0
        BARRIER, WAIT, SIGNAL, STAGE = (EventKind.BARRIER, EventKind.WAIT, EventKind.SIGNAL,
                                        EventKind.STAGE)   # the hot loop: no enum lookups
        vc, order, execute = self.vc, self.order, self.values.execute
        timelines = inst.timelines
        while done < W:
            progress = False
            for r in range(W):
                tl = timelines[r]
                n, p = len(tl), pos[r]
                if p == n:
                    continue
                vcr, c, start = vc[r], cur[r], p
                while p < n:
                    ev = tl[p]
                    kind = ev.kind
                    if kind is BARRIER:
                        break
                    if kind is WAIT:
                        waits = ev.waits
                        if len(waits) == 1:        # the usual case
                            f, slot, rnd, _ = waits[0]
                            got = signaled.get((r, f, slot, rnd))
                            if got is None:
                                break
                            got = (got,)
                        else:
                            got = [signaled.get((r, f, slot, rnd)) for f, slot, rnd, _ in waits]
                            if None in got:
                                break
                        for clock, own, sev in got:
                            c = np.maximum(c, clock)     # a new array: the clock in c is shared
                            if c[sev.rank] < own:
                                c[sev.rank] = own
                        cur[r] = c
                    vcr[ev.index] = c
                    if kind is SIGNAL:
                        for owner, f, slot, rnd, span in ev.signals:
                            key = (owner, f, slot, rnd)
                            if key in signaled:
                                first = signaled[key][2]
                                again = (" (declare rounds and give each signal its own: flag "
                                         f"{f}[...] rounds R, signal {f}[i]@p round r)"
                                         if inst.flag_rounds.get(f, 1) == 1 else "")
                                diags.append(error(
                                    Codes.DOUBLE_SIGNAL, f"{_slot(f, slot, rnd, inst)} of rank {owner} is "
                                    f"signalled twice in one call ({context(inst)}): a wait cannot tell "
                                    f"the two apart{again}",
                                    span, Note(f"rank {first.rank} signalled it here", first.span)))
                                return diags
                            if rnd and not self._follows(signaled.get((owner, f, slot, rnd - 1)), ev, c):
                                diags.append(self._out_of_order(signaled, (owner, f, slot, rnd), ev, span))
                                return diags
                            # every slot of one signal event shares the event's clock
                            signaled[key] = (c, ev.index + 1, ev)
                    elif kind is STAGE:
                        execute(ev)   # expands routing constructs into accesses first
                        self.access_count += len(ev.accesses)
                    order.append(ev)
                    p += 1
                pos[r] = p
                if p > start:
                    progress = True
                    if p == n:
                        done += 1
            at_barrier = [inst.timelines[r][pos[r]] if pos[r] < len(inst.timelines[r]) else None
                          for r in range(W)]
            at_barrier = [ev if ev is not None and ev.kind is EventKind.BARRIER else None
                          for ev in at_barrier]
            for ev0 in list(at_barrier):
                # a barrier joins its members (every live rank, or a team's) once all of them are
                # at a barrier of the same members and stamp; a masked rank's timeline (a masked
                # call's strata::MaskedBarrier) is ENTRY, EXIT and takes part in nothing
                if ev0 is None or at_barrier[ev0.rank] is not ev0:
                    continue
                group = live if ev0.members is None else ev0.members
                evs = [at_barrier[q] for q in group]
                if not all(ev is not None and ev.members == ev0.members and ev.barrier == ev0.barrier
                           for ev in evs):
                    continue
                joined = np.max(np.stack([cur[q] for q in group]), axis=0)
                for ev in evs:
                    if joined[ev.rank] < ev.index + 1:
                        joined[ev.rank] = ev.index + 1
                for ev in evs:
                    cur[ev.rank] = joined      # shared by the members until their next join
                    self.vc[ev.rank][ev.index] = joined
                    self.order.append(ev)
                    pos[ev.rank] += 1
                    at_barrier[ev.rank] = None
                progress = True
            if not progress:
                diags.append(self._deadlock(pos, signaled))
                return diags
        return diags

    @staticmethod
    def _follows(before, ev: Event, clock: np.ndarray) -> bool:
        """Whether the signal `before` (signaled's entry, or None) comes before signal event ev,
        whose clock is `clock`: it happens before ev, or it is an earlier signal of ev itself
        (consecutive signals are one event, and core 0 issues them in program order)."""
        if before is None:
            return False
        _, own, sev = before
        if sev.rank == ev.rank:
            return sev.index <= ev.index
        return int(clock[sev.rank]) >= own

    def _out_of_order(self, signaled, key, ev: Event, span) -> Diagnostic:
        """Round r of a slot signalled when round r - 1's signal is not known to have happened: a
        wait for round r - 1 takes any later round's stamp (the kernel waits for >=), so round r
        must follow round r - 1 on every execution, else it can let a wait of round r - 1 through
        before its data, or round r - 1's signal, arriving later, set the slot back."""
        inst = self.inst
        owner, f, slot, rnd = key
        text = f"{_slot(f, slot, rnd, inst)} of rank {owner}"
        prior = signaled.get((owner, f, slot, rnd - 1))
        notes = []
        if prior is None:
            first = next(((e, sp) for tl in inst.timelines for e in tl
                          for o, g, k, n, sp in e.signals if (o, g, k, n) == (owner, f, slot, rnd - 1)), None)
            if first is None:
                return error(Codes.DOUBLE_SIGNAL, f"{text} is signalled by rank {ev.rank}, but round "
                             f"{rnd - 1} of that slot never is ({context(inst)}): the rounds of a slot "
                             "are signalled in order, 0, 1, 2, ...", span)
            notes.append(Note(f"round {rnd - 1}: rank {first[0].rank} signals it here", first[1]))
        else:
            sev = prior[2]   # the signal itself, not its event's first (consecutive signals merge)
            where = next((sp for o, g, k, n, sp in sev.signals if (o, g, k, n) == (owner, f, slot, rnd - 1)),
                         sev.span)
            notes.append(Note(f"round {rnd - 1}: rank {sev.rank} signals it here", where))
        return error(Codes.DOUBLE_SIGNAL, f"{text} is signalled by rank {ev.rank} before round "
                     f"{rnd - 1} of that slot is known to have been ({context(inst)}): a slot is "
                     "reused only after its round before, since a wait for that round is met by "
                     "any later one; order the two, e.g. the signaller waits for a credit the "
                     "slot's consumer signals after it has waited for round "
                     f"{rnd - 1}", span, *notes)

    def _deadlock(self, pos, signaled) -> Diagnostic:
        inst = self.inst
        notes: list[Note] = []
        first_span = None
        all_signals = {}
        for tl in inst.timelines:
            for ev in tl:
                for owner, f, slot, rnd, span in ev.signals:
                    all_signals.setdefault((owner, f, slot, rnd), (ev, span))
        stuck_at_barrier = []
        for r in range(inst.world):
            if pos[r] >= len(inst.timelines[r]):
                continue
            ev = inst.timelines[r][pos[r]]
            if ev.kind is EventKind.BARRIER:
                stuck_at_barrier.append(r)
                first_span = first_span or ev.span
                continue
            for f, slot, rnd, span in ev.waits:
                if (r, f, slot, rnd) in signaled:
                    continue
                first_span = first_span or span
                if (r, f, slot, rnd) in all_signals:
                    sev, sspan = all_signals[(r, f, slot, rnd)]
                    notes.append(Note(f"rank {r} waits for {_slot(f, slot, rnd, inst)}; rank {sev.rank} "
                                      f"signals it only after it is itself blocked", sspan))
                else:
                    notes.append(Note(f"rank {r} waits for {_slot(f, slot, rnd, inst)}, which no rank "
                                      "ever signals", span))
                break
        meets: dict[tuple, list[int]] = {}
        for r in stuck_at_barrier:
            ev = inst.timelines[r][pos[r]]
            meets.setdefault((ev.barrier, ev.members), []).append(r)
        if len(meets) == 1:
            notes.append(Note(f"{_who(stuck_at_barrier)} at a barrier for the others"))
        else:   # at barriers that do not meet: tell which rank is at which
            for (stamp, members), rs in meets.items():
                tl = inst.timelines[rs[0]]
                stamped = f" (stamp epoch + {stamp})" if inst.schedule.lowered else ""
                notes.append(Note(f"{_who(rs)} at this barrier, the {_nth(tl, pos[rs[0]])} of the call"
                                  f"{stamped}", tl[pos[rs[0]]].span))
        return error(Codes.DEADLOCK, f"deadlock ({context(inst)}): no rank can make progress", first_span,
                     *notes[:6])

    def hb(self, a_rank: int, a_index: int, b_rank: int, b_index: int) -> bool:
        if a_rank == b_rank:
            return a_index < b_index
        return self.vc[b_rank][b_index][a_rank] > a_index


def _slot(f: str, slot: int, rnd: int, inst: Instance) -> str:
    """A flag slot as the source names it: f[slot], and its round when the flag has rounds."""
    return f"{f}[{slot}]" if inst.flag_rounds.get(f, 1) == 1 else f"{f}[{slot}] round {rnd}"


def _nth(timeline: list[Event], at: int) -> str:
    """Which barrier of its rank's call the event at `at` is, counting from one."""
    k = sum(1 for e in timeline[:at + 1] if e.kind is EventKind.BARRIER)
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')} barrier"


def _who(rs: list[int]) -> str:
    return f"rank {rs[0]} waits" if len(rs) == 1 else f"ranks {_ranges(rs)} wait"


def _ranges(rs: list[int]) -> str:
    if len(rs) <= 6:
        return ", ".join(map(str, rs))
    return f"{rs[0]}..{rs[-1]} ({len(rs)} ranks)"
