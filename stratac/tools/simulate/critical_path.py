"""The time of one call. In: a Template's timelines, the StageCost of each of its stages, a Machine
and the cores per rank. Out: the predicted microseconds from the kernel launch to the last rank's
exit, and that critical path split by category.

Synchronisation: every call begins with the ranks' agreement (strata::Agree), a barrier of every
rank, charged after the launch like any barrier (a schedule whose first statement is a world
barrier has it fused into the agreement, so that barrier is the agreement's and is charged once);
a barrier releases its members (every rank, or a team's) at its place in the
program when the last of them arrives there, plus its cost (two SyncAlls, each core signalling
members/cores of them, one fabric latency); a wait returns when the last flag it waits for
has landed (signal time + fabric latency); signals cost a flag issue per slot on the busiest core
(a loop whose trips the cores share, ir.control, costs its share). A posted stage (`on sdma async
h`) holds the cores for their own part (posting SQEs) only: its copies queue behind the rank's
earlier posts and land its time less the SyncAll after it starts there; the next await, or the
quiet that ends any later stage, waits for them (SHMEM's quiet drains a core's whole queue), and a
later SDMA stage's copies queue behind them. Between two
barrier places, each rank's traffic on its own UB link and HBM also bounds its phase (a rank's link
is shared by everything the other ranks send it or read from it): a barrier releases no earlier
than each member's phase start plus that traffic's time. A rank's phase starts at the last barrier
it passed, so the barriers of different teams (every node's) start their own members' phases.
"""

from __future__ import annotations

import math

import numpy as np

from stratac.tools.simulate.machine import Machine, SimulateError
from stratac.tools.simulate.stage_cost import StageCost
from stratac.tools.simulate.template import Held, Template, count, holds


def _add(parts: dict, cat: str, us: float) -> dict:
    out = dict(parts)
    out[cat] = out.get(cat, 0.0) + us
    return out


def call_time(t: Template, costs: dict[int, StageCost], m: Machine, cores: int) -> tuple[float, dict]:
    """(predicted microseconds of one call, its critical path split by category)."""
    world, lat = t.world, m.fabric_latency_us

    def barrier_cost(members: int) -> float:
        """Two SyncAlls, each core signalling members / cores of them, one fabric latency."""
        return 2 * m.sync_all_us + math.ceil(members / cores) * m.flag_issue_us + \
            (lat if members > 1 else 0.0)

    start = m.launch_us + (0.0 if t.fused else barrier_cost(world))   # launch, then the agreement
    clock = [start] * world
    parts = [{"latency": start} for _ in range(world)]
    pos = [0] * world
    # per rank: when the SDMA copies it posted asynchronously and has not yet drained land (-inf:
    # none), and the critical path to then
    queued = [-math.inf] * world
    queued_path: list[dict] = [{}] * world
    landed: dict[tuple, tuple[float, dict]] = {}
    held = _HeldSignals()
    arrived: dict[int, tuple[float, dict]] = {}
    # each rank's phase: the barrier place it last passed, and when (a team's barrier starts the
    # phase of its members alone: nodes are not released one after the other)
    phase = np.zeros(world, dtype=np.int64)
    phase_at = np.full(world, start)
    phase_path: list[dict] = [{"latency": start}] * world
    load: dict[int, list] = {}
    for cost in costs.values():
        for ph, (tx, rx, hbm) in cost.loads.items():
            acc = load.setdefault(ph, [np.zeros(world), np.zeros(world), np.zeros(world)])
            acc[0] += tx
            acc[1] += rx
            acc[2] += hbm
    link, mem = np.zeros(world), np.zeros(world)   # per rank: its phase's link and HBM bound

    def phase_bound(ranks: np.ndarray) -> None:
        """link, mem of these ranks: their own link's and HBM's traffic in the phase they are in."""
        link[ranks], mem[ranks] = 0.0, 0.0
        for ph in np.unique(phase[ranks]):
            if int(ph) in load:
                tx, rx, hbm = load[int(ph)]
                on = ranks[phase[ranks] == ph]
                link[on] = np.maximum(tx[on], rx[on]) / (m.fabric_gbps * 1e3)
                mem[on] = hbm[on] / (m.hbm_gbps * 1e3)

    def settle(ranks: np.ndarray, when: float, path: dict) -> tuple[float, dict]:
        """The later of `when` and, for each of ranks, its phase's start plus the traffic of its
        phase on its own link and HBM (the link where a link and HBM tie)."""
        phase_bound(ranks)
        end = phase_at[ranks] + np.maximum(link[ranks], mem[ranks])
        top = end.max()
        if not top > when:
            return when, path
        at = ranks[end == top]
        fabric = at[link[at] >= mem[at]]
        r = int(fabric[0] if len(fabric) else at[0])
        cat, us = ("fabric", link[r]) if len(fabric) else ("hbm", mem[r])
        return top, _add(phase_path[r], cat, float(us))

    while True:
        progressed = False
        for r in range(world):
            tl = t.timelines[r]
            while pos[r] < len(tl):
                kind, arg = tl[pos[r]]
                if kind == "stage":
                    cost = costs[arg]
                    time = float(cost.time_us[r])
                    if t.stages[arg].stage.handle is not None:
                        # posted (`on sdma async h`): the cores go on once they have posted; the
                        # queue takes it behind what it holds, its data lands `time` less the
                        # SyncAll later, and an await (or a stage's quiet) waits for that
                        at, path = (queued[r], queued_path[r]) if queued[r] > clock[r] else \
                            (clock[r], parts[r])
                        queued[r] = at + time - m.sync_all_us
                        queued_path[r] = _add(_stage_path(path, cost, r), "latency",
                                              time - m.sync_all_us - float(cost.busy_us[r]))
                        core = float(cost.core_us[r])
                        clock[r] += core
                        parts[r] = _add(parts[r], "sdma", core)
                    else:
                        at, path = clock[r], parts[r]
                        if queued[r] > clock[r] and cost.queue_us[r] > 0:
                            at, path = queued[r], queued_path[r]   # its copies queue behind the posts
                        clock[r] = at + time
                        parts[r] = _add(_stage_path(path, cost, r), "latency",
                                        time - float(cost.busy_us[r]))
                        if queued[r] + m.sync_all_us > clock[r]:   # its quiet drains the queue
                            clock[r] = queued[r] + m.sync_all_us
                            parts[r] = _add(queued_path[r], "latency", m.sync_all_us)
                        queued[r] = -math.inf
                elif kind == "signal":
                    us = _flags_per_core(arg, cores) * m.flag_issue_us + m.sync_all_us
                    clock[r] += us
                    parts[r] = _add(parts[r], "latency", us)
                    here = (clock[r], parts[r])
                    there = (clock[r] + lat, _add(parts[r], "latency", lat))
                    for owner, flag, slot, _ in arg:
                        if isinstance(owner, Held):
                            held.signal(flag, slot, owner, r, here, there)
                        else:
                            landed[(owner, flag, slot)] = there if owner != r else here
                elif kind == "wait":
                    hits = [held.wait(r, flag, slot, landed) for flag, slot in arg]
                    if any(h is None for h in hits):
                        break
                    when, path = max(hits, key=lambda h: h[0])
                    if when > clock[r]:
                        clock[r], parts[r] = when, path
                    clock[r] += m.sync_all_us
                    parts[r] = _add(parts[r], "latency", m.sync_all_us)
                elif kind == "await":   # each core's quiet drains its whole queue, then SyncAll
                    if queued[r] > clock[r]:
                        clock[r], parts[r] = queued[r], queued_path[r]
                    queued[r] = -math.inf
                    clock[r] += m.sync_all_us
                    parts[r] = _add(parts[r], "latency", m.sync_all_us)
                elif kind == "barrier":
                    if r not in arrived:
                        arrived[r] = (clock[r], parts[r])
                        progressed = True
                    break
                pos[r] += 1
                progressed = True
        for r0 in sorted(arrived):
            if r0 not in arrived:    # joined with an earlier member in this pass
                continue
            at = t.timelines[r0][pos[r0]][1]
            place, members = at
            group = range(world) if members is None else members
            if all(r in arrived and t.timelines[r][pos[r]][1] == at for r in group):
                last = max(group, key=lambda r: arrived[r][0])
                when, path = settle(np.asarray(group, dtype=np.int64), *arrived[last])
                cost = barrier_cost(len(group))
                when, path = when + cost, _add(path, "latency", cost)
                for r in group:
                    clock[r], parts[r] = when, path
                    pos[r] += 1
                    del arrived[r]
                    phase[r], phase_at[r], phase_path[r] = place, when, path
                progressed = True
        if all(pos[r] == len(t.timelines[r]) for r in range(world)):
            break
        if not progressed:
            raise SimulateError("the schedule waits for a flag or barrier nobody provides; run "
                                "`stratac check` on the file")
    last = max(range(world), key=lambda r: clock[r])
    return settle(np.arange(world), clock[last], parts[last])


def _stage_path(path: dict, cost: StageCost, r: int) -> dict:
    """path plus rank r's busy time in the stage, by category: the scalar work and the SQE issue of
    the busiest core where a core sets the time, the rest under the resource that set it."""
    busy = float(cost.busy_us[r])
    scalar = float(cost.scalar_us[r]) if cost.scalar_us is not None else 0.0
    issue = float(cost.issue_us[r]) if cost.issue_us is not None else 0.0
    if scalar > 0:
        path = _add(path, "scalar", scalar)
    if issue > 0:       # the busiest core posting SDMA SQEs
        path = _add(path, "sdma", issue)
    if busy > scalar + issue:
        path = _add(path, cost.category[r], busy - scalar - issue)
    return path


def _flags_per_core(signals: list, cores: int) -> int:
    """The flags the busiest core issues for a run of signals: core 0 issues every signal outside a
    shared loop and its share of each shared loop's (a loop's trips go round the cores,
    ir.control), taken as ceil(flags / cores)."""
    alone, shared = 0, {}
    for owner, _, _, share in signals:
        n = count(owner) if isinstance(owner, Held) else 1
        if share is None:
            alone += n
        else:
            shared[share] = shared.get(share, 0) + n
    return alone + sum(-(-n // cores) for n in shared.values())


class _HeldSignals:
    """Signals whose signalled ranks are a Held set (`for p in peers: signal done[rank]@p`), kept
    per flag and round as arrays by slot, so that a wait for a Held set of slots (`for p in peers:
    wait done[p]`) is one array operation over them, not a lookup per slot. A slot set by more than
    one such signal, or by listed ones, is looked up one by one."""

    def __init__(self):
        self.tables: dict[tuple, dict] = {}   # (flag, round) -> arrays by slot, see signal()
        self.more: dict[tuple, list] = {}     # (flag, slot, round) -> the records after the first

    def signal(self, flag: str, slot: tuple[int, int], owners: Held, issuer: int, here, there) -> None:
        index, rnd = slot
        t = self.tables.get((flag, rnd))
        if t is None or index >= len(t["issuer"]):
            n = max(index + 1, 2 * len(t["issuer"]) if t else 16)
            grown = {"issuer": np.full(n, -1, dtype=np.int64), "owners": np.zeros((n, 4), dtype=np.int64),
                     "here": np.zeros(n), "there": np.zeros(n), "paths": t["paths"] if t else {}}
            if t is not None:
                k = len(t["issuer"])
                for name in ("issuer", "owners", "here", "there"):
                    grown[name][:k] = t[name]
            t = self.tables[(flag, rnd)] = grown
        if t["issuer"][index] >= 0:
            self.more.setdefault((flag, index, rnd), []).append((owners, issuer, here, there))
            return
        t["issuer"][index], t["owners"][index] = issuer, owners
        t["here"][index], t["there"][index] = here[0], there[0]
        t["paths"][index] = (here[1], there[1])

    def _one(self, r: int, flag: str, index: int, rnd: int, landed: dict):
        """(time, path) slot (index, rnd) of flag landed on rank r, or None: one slot, looked up."""
        hit = landed.get((r, flag, (index, rnd)))
        if hit is not None:
            return hit
        t = self.tables.get((flag, rnd))
        records = []
        if t is not None and index < len(t["issuer"]) and t["issuer"][index] >= 0:
            records.append((Held(*t["owners"][index].tolist()), int(t["issuer"][index]),
                            (t["here"][index], t["paths"][index][0]), (t["there"][index], t["paths"][index][1])))
        records += self.more.get((flag, index, rnd), [])
        for owners, issuer, here, there in records:
            if holds(owners, r):
                return here if issuer == r else there
        return None

    def wait(self, r: int, flag: str, slot: tuple, landed: dict):
        """(time, path) the last of the slots waited for landed on rank r (the first such slot in
        their order), or None while one has not."""
        index, rnd = slot
        if not isinstance(index, Held):
            return self._one(r, flag, index, rnd, landed)
        slots = np.arange(index.size, dtype=np.int64) * index.step + index.start
        slots = slots[slots != index.skip]       # never empty (template.Walker.held_sync)
        t = self.tables.get((flag, rnd))
        when = np.full(len(slots), np.nan)
        fast = np.zeros(len(slots), dtype=bool)
        if t is not None:
            inside = slots < len(t["issuer"])
            s_in = np.where(inside, slots, 0)
            issuer = np.where(inside, t["issuer"][s_in], -1)
            fast = (issuer >= 0) & holds(t["owners"][s_in].T, r)
            when = np.where(fast, np.where(issuer == r, t["here"][s_in], t["there"][s_in]), np.nan)
        paths = {}
        for k in np.flatnonzero(~fast):      # a slot signalled otherwise: looked up on its own
            hit = self._one(r, flag, int(slots[k]), rnd, landed)
            if hit is None:
                return None
            when[k], paths[int(k)] = hit
        k = int(np.argmax(when))
        if k not in paths:
            s = int(slots[k])
            paths[k] = t["paths"][s][0 if t["issuer"][s] == r else 1]
        return float(when[k]), paths[k]

