"""Happens-before, by executing the per-rank timelines of one instance with vector clocks.

In: an instance. Out: a vector clock for every event (so `hb` orders any two), the simulated
values after the call (`provenance`), and a deadlock or double-signal diagnostic if the execution
cannot finish. Stages run in program order within a rank, barriers join all ranks, a wait joins the
signal that satisfies it. If no rank can move and some have not finished, that is a deadlock,
reported with who waits for what.
"""

from __future__ import annotations

import numpy as np

from stratac.diagnostics import Codes, Diagnostic, Note, error
from stratac.ir.instantiate import Event, EventKind, Instance
from stratac.verify.provenance import Values
from stratac.verify.samples import context


class Execution:
    def __init__(self, inst: Instance):
        self.inst = inst
        self.vc: dict[tuple[int, int], np.ndarray] = {}
        self.order: list[Event] = []
        self.access_count = 0
        self.values = Values(inst)

    def run(self) -> list[Diagnostic]:
        inst, W = self.inst, self.inst.world
        pos = [0] * W
        cur = [np.zeros(W, dtype=np.int64) for _ in range(W)]
        signaled: dict[tuple[int, str, int], tuple[np.ndarray, Event]] = {}
        diags: list[Diagnostic] = []
        done = 0
        while done < W:
            progress = False
            for r in range(W):
                tl = inst.timelines[r]
                while pos[r] < len(tl):
                    ev = tl[pos[r]]
                    if ev.kind is EventKind.BARRIER:
                        break
                    if ev.kind is EventKind.WAIT:
                        keys = [(r, f, slot) for f, slot, _ in ev.waits]
                        if any(k not in signaled for k in keys):
                            break
                        for k in keys:
                            np.maximum(cur[r], signaled[k][0], out=cur[r])
                    cur[r][r] = ev.index + 1
                    self.vc[(r, ev.index)] = cur[r].copy()
                    if ev.kind is EventKind.SIGNAL:
                        for owner, f, slot, span in ev.signals:
                            key = (owner, f, slot)
                            if key in signaled:
                                first = signaled[key][1]
                                diags.append(error(
                                    Codes.DOUBLE_SIGNAL, f"{f}[{slot}] of rank {owner} is signalled twice "
                                    f"in one call ({context(inst)}): a wait cannot tell the two apart",
                                    span, Note(f"rank {first.rank} signalled it here", first.span)))
                                return diags
                            # every slot of one signal event shares the event's clock
                            signaled[key] = (self.vc[(r, ev.index)], ev)
                    elif ev.kind is EventKind.STAGE:
                        self.values.execute(ev)   # expands routing constructs into accesses first
                        self.access_count += len(ev.accesses)
                    self.order.append(ev)
                    pos[r] += 1
                    progress = True
                    if pos[r] == len(tl):
                        done += 1
            at_barrier = [inst.timelines[r][pos[r]] if pos[r] < len(inst.timelines[r]) else None
                          for r in range(W)]
            if all(ev is not None and ev.kind is EventKind.BARRIER for ev in at_barrier):
                ks = {ev.barrier for ev in at_barrier}
                if len(ks) == 1:
                    joined = np.max(np.stack(cur), axis=0)
                    for r, ev in enumerate(at_barrier):
                        cur[r] = joined.copy()
                        cur[r][r] = ev.index + 1
                        self.vc[(r, ev.index)] = cur[r].copy()
                        self.order.append(ev)
                        pos[r] += 1
                    progress = True
            if not progress:
                diags.append(self._deadlock(pos, signaled))
                return diags
        return diags

    def _deadlock(self, pos, signaled) -> Diagnostic:
        inst = self.inst
        notes: list[Note] = []
        first_span = None
        all_signals = {}
        for tl in inst.timelines:
            for ev in tl:
                for owner, f, slot, span in ev.signals:
                    all_signals.setdefault((owner, f, slot), (ev, span))
        stuck_at_barrier = []
        for r in range(inst.world):
            if pos[r] >= len(inst.timelines[r]):
                continue
            ev = inst.timelines[r][pos[r]]
            if ev.kind is EventKind.BARRIER:
                stuck_at_barrier.append(r)
                first_span = first_span or ev.span
                continue
            for f, slot, span in ev.waits:
                if (r, f, slot) in signaled:
                    continue
                first_span = first_span or span
                if (r, f, slot) in all_signals:
                    sev, sspan = all_signals[(r, f, slot)]
                    notes.append(Note(f"rank {r} waits for {f}[{slot}]; rank {sev.rank} signals it only "
                                      f"after it is itself blocked", sspan))
                else:
                    notes.append(Note(f"rank {r} waits for {f}[{slot}], which no rank ever signals",
                                      span))
                break
        if stuck_at_barrier:
            notes.append(Note(f"ranks {_ranges(stuck_at_barrier)} wait at a barrier for the others"))
        return error(Codes.DEADLOCK, f"deadlock ({context(inst)}): no rank can make progress", first_span,
                     *notes[:6])

    def hb(self, a_rank: int, a_index: int, b_rank: int, b_index: int) -> bool:
        if a_rank == b_rank:
            return a_index < b_index
        return int(self.vc[(b_rank, b_index)][a_rank]) >= a_index + 1


def _ranges(rs: list[int]) -> str:
    if len(rs) <= 6:
        return ", ".join(map(str, rs))
    return f"{rs[0]}..{rs[-1]} ({len(rs)} ranks)"
