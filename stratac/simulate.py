"""`stratac simulate`: predicted time and bus bandwidth of every schedule of a file on a machine
described by a TOML file (machines/cloudmatrix384.toml). An analytic model, not a measurement.

The model (docs/bench.md, "Model predictions: stratac simulate"):

* Work. Each stage of each rank is split over the vector cores the way the kernels split it
  (strata::Partition: the elements the stage moves, end to end in program order, cut evenly by
  32-byte blocks). A core's piece of a copy goes to SDMA (`on sdma`, or `on auto` from the
  threshold the passes chose, decided per piece like the kernel does) or through the core's UB.
  Per core: bytes read GM -> UB, written UB -> GM and folded by the vector unit; per SDMA queue:
  bytes and posts. Data travels source owner -> running rank -> destination owner; a byte whose
  owner is another rank crosses that rank's UB link (tx) and the running rank's (rx), or the
  reverse. Every byte read or written is HBM traffic of its owner.
* Time of a stage on a rank: the slowest of its resources (busiest core, busiest SDMA queue, its
  own UB link in each direction, its own HBM), plus the end-of-stage SyncAll, plus one fabric
  latency if it touched another rank's memory.
* Synchronisation: a barrier releases every rank when the last one arrives, plus its cost (two
  SyncAlls, each core signalling world/cores peers, one fabric latency); a wait returns when the
  last flag it waits for has landed (signal time + fabric latency); a signal costs a flag issue per
  slot. Between two barriers, the traffic of every rank on every UB link and every HBM also bounds
  the phase (a rank's link is shared by everything the other ranks send it or read from it).
* The call: kernel launch, then the critical path above; its time is the last rank's exit.

Not modelled: contention inside the UB switches (the fabric is taken as non-blocking), the faster
link between the two dies of one package, L2 cache hits, the tail of a double-buffered tile queue,
MoE routing (data-dependent: such schedules are skipped).

Instantiation cost stays bounded at large worlds: the IR is walked once per schedule and world
into a template of moves (owners and length expressions, no element intervals or accesses), and
each size only evaluates the distinct length expressions and runs array arithmetic over the moves.
tests/test_simulate.py checks the template against stratac.instantiate on every example.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import ir, passes

BLOCK_BYTES = 32   # the kernels partition a stage over the cores in whole DataCopy blocks
CATEGORIES = ("fabric", "hbm", "aiv", "sdma", "latency")
_COPY, _ACCUMULATE, _REDUCE = 0, 1, 2


class SimulateError(Exception):
    """A machine file or a request the model cannot use, said in one message (the CLI prints it,
    no traceback)."""


# ---------------------------------------------------------------------------------------------
# the machine file

# section -> key -> kind: "name" (a non-empty string), "count" (an integer >= 1), "rate" (a number
# > 0), "time" (a number >= 0)
SCHEMA: dict[str, dict[str, str]] = {
    "machine": {"name": "name", "npus": "count", "dies_per_npu": "count"},
    "rank": {"vector_cores": "count", "ub_bytes_per_core": "count", "hbm_gbps": "rate",
             "fabric_gbps": "rate", "fabric_latency_us": "time"},
    "core": {"gm_to_ub_gbps": "rate", "ub_to_gm_gbps": "rate", "vector_gbps": "rate"},
    "sdma": {"queues": "count", "queue_gbps": "rate", "post_us": "time"},
    "sync": {"launch_us": "time", "sync_all_us": "time", "flag_issue_us": "time"},
}

_KIND_TEXT = {"name": "a non-empty string", "count": "an integer >= 1",
              "rate": "a number > 0", "time": "a number >= 0"}


@dataclass(frozen=True)
class Machine:
    """The figures of a machine file, per rank (one die) unless said otherwise."""

    path: str
    name: str
    npus: int
    dies_per_npu: int
    vector_cores: int
    ub_bytes_per_core: int
    hbm_gbps: float
    fabric_gbps: float
    fabric_latency_us: float
    gm_to_ub_gbps: float
    ub_to_gm_gbps: float
    vector_gbps: float
    queues: int
    queue_gbps: float
    post_us: float
    launch_us: float
    sync_all_us: float
    flag_issue_us: float

    @property
    def max_world(self) -> int:
        return self.npus * self.dies_per_npu

    def figures(self) -> dict:
        return {sec: {k: getattr(self, k) for k in keys} for sec, keys in SCHEMA.items()}


def _toml():
    try:
        import tomllib
        return tomllib
    except ModuleNotFoundError:     # Python 3.10: the same parser as the tomli package
        try:
            import tomli
            return tomli
        except ModuleNotFoundError:
            raise SimulateError("reading a machine file needs Python >= 3.11 (tomllib) or the tomli "
                                "package on Python 3.10: pip install tomli") from None


def load_machine(path: str | Path) -> Machine:
    """Reads and checks a machine file; every problem is a SimulateError naming the file and key."""
    toml = _toml()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SimulateError(f"no such machine file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SimulateError(f"cannot read machine file {path}: {exc}") from None
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise SimulateError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SCHEMA))
    if unknown:
        raise SimulateError(f"{path}: unknown section [{unknown[0]}]; a machine file has "
                            f"{', '.join(f'[{s}]' for s in SCHEMA)}")
    values: dict[str, object] = {}
    for sec, keys in SCHEMA.items():
        table = data.get(sec)
        if table is None:
            raise SimulateError(f"{path}: missing section [{sec}] (keys: {', '.join(keys)})")
        if not isinstance(table, dict):
            raise SimulateError(f"{path}: [{sec}] must be a table of keys ({', '.join(keys)})")
        extra = sorted(set(table) - set(keys))
        if extra:
            raise SimulateError(f"{path}: unknown key {extra[0]!r} in [{sec}]; known: {', '.join(keys)}")
        for key, kind in keys.items():
            if key not in table:
                raise SimulateError(f"{path}: missing key {key!r} in [{sec}] ({_KIND_TEXT[kind]})")
            values[key] = _checked(table[key], kind, f"{path}: [{sec}] {key}")
    m = Machine(path=str(path), **values)
    if m.ub_bytes_per_core < passes.UB_BYTES:
        raise SimulateError(f"{path}: [rank] ub_bytes_per_core = {m.ub_bytes_per_core}, but the "
                            f"kernels lay out {passes.UB_BYTES} bytes of UB per core")
    return m


def _checked(v, kind: str, where: str):
    ok = {"name": isinstance(v, str) and v.strip() != "",
          "count": isinstance(v, int) and not isinstance(v, bool) and v >= 1,
          "rate": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
          "time": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
          }[kind]
    if not ok:
        raise SimulateError(f"{where} must be {_KIND_TEXT[kind]}, got {v!r}")
    return float(v) if kind in ("rate", "time") else v


# ---------------------------------------------------------------------------------------------
# the template: every move of every rank, with symbolic lengths

@dataclass
class _StageMoves:
    """The moves of one stage over every rank that runs it, in rank order then program order."""

    stage: ir.Stage
    issuer: list[int] = field(default_factory=list)
    key: list[int] = field(default_factory=list)       # index of the length in Template.keys
    kind: list[int] = field(default_factory=list)      # _COPY, _ACCUMULATE, _REDUCE
    dst: list[int] = field(default_factory=list)       # owner of the destination
    nsrc: list[int] = field(default_factory=list)
    src_move: list[int] = field(default_factory=list)  # one entry per source: its move
    src_owner: list[int] = field(default_factory=list)
    phase: dict[int, int] = field(default_factory=dict)   # rank -> barriers before the stage
    arrays: dict = field(default_factory=dict)


@dataclass
class Template:
    world: int
    keys: list[tuple[ir.IExpr, dict]]     # a length expression and its values of non-size names
    stages: dict[int, _StageMoves]
    timelines: list[list[tuple]]          # per rank: ("stage", index) | ("barrier", k) |
                                          # ("signal", [(owner, flag, slot)]) | ("wait", [(flag, slot)])
    size_dependent: bool                  # a condition, rank or flag slot depends on a size symbol

    def moves(self, stage_index: int, lengths: np.ndarray) -> list[tuple]:
        """(issuer, kind, dst owner, src owners, length) of every move, for the consistency test."""
        sm = self.stages[stage_index]
        srcs: dict[int, list[int]] = {}
        for mv, owner in zip(sm.src_move, sm.src_owner):
            srcs.setdefault(mv, []).append(owner)
        return [(sm.issuer[i], sm.kind[i], sm.dst[i], tuple(srcs.get(i, ())), int(lengths[sm.key[i]]))
                for i in range(len(sm.issuer))]


class _Walker:
    """Mirrors stratac.instantiate's walk of the IR (program order, loop domains, merged signals and
    waits), keeping only owners and length expressions."""

    def __init__(self, s: ir.Schedule, world: int, env: dict):
        self.s, self.world, self.base = s, world, {"world": world, **env}
        self.size_syms = frozenset(s.sizes)
        self.keys: list[tuple[ir.IExpr, dict]] = []
        self.key_index: dict[tuple, int] = {}
        self.names: dict[int, tuple[ir.IExpr, tuple[str, ...]]] = {}
        self.stages: dict[int, _StageMoves] = {}
        self.size_dependent = False
        self.steering: dict[int, ir.IExpr] = {}

    def ev(self, e: ir.IExpr, env: dict, what: str) -> int:
        seen = self.steering.get(id(e))
        if seen is None or seen is not e:
            self.steering[id(e)] = e      # kept alive, so its id is not reused
            if e.names() & self.size_syms:
                self.size_dependent = True
        try:
            return e.eval(env)
        except ZeroDivisionError:
            raise SimulateError(f"division by zero evaluating {what} ({e}) at world {self.world}; "
                                "run `stratac check` on the file") from None

    def owner(self, r: ir.Region, env: dict) -> int:
        o = env["rank"] if r.rank is None else self.ev(r.rank, env, "a rank")
        if not 0 <= o < self.world:
            raise SimulateError(f"rank {o} does not exist in a world of {self.world} (line "
                                f"{r.span.line}); run `stratac check` on the file")
        return o

    def length_key(self, e: ir.IExpr, env: dict) -> int:
        hit = self.names.get(id(e))
        if hit is None or hit[0] is not e:
            hit = (e, tuple(sorted(e.names() - self.size_syms)))
            self.names[id(e)] = hit
        fixed = tuple(env[n] for n in hit[1])
        k = (id(e), fixed)
        i = self.key_index.get(k)
        if i is None:
            i = self.key_index[k] = len(self.keys)
            self.keys.append((e, dict(zip(hit[1], fixed))))
        return i

    def domain(self, d: ir.Domain, rank: int) -> list[int]:
        return [p for p in range(self.world) if d is ir.Domain.RANKS or p != rank]

    def timeline(self, rank: int) -> list[tuple]:
        env = dict(self.base, rank=rank)
        events: list[tuple] = []
        barriers = 0

        def sync(op, env):
            if isinstance(op, ir.Loop):
                for v in self.domain(op.domain, env["rank"]):
                    for o in op.body:
                        sync(o, {**env, op.var: v})
                return
            slot = self.ev(op.index, env, f"the index of flag {op.flag}")
            if isinstance(op, ir.Signal):
                owner = self.ev(op.rank, env, "the signalled rank")
                if events and events[-1][0] == "signal":
                    events[-1][1].append((owner, op.flag, slot))
                else:
                    events.append(("signal", [(owner, op.flag, slot)]))
            else:
                if events and events[-1][0] == "wait":
                    events[-1][1].append((op.flag, slot))
                else:
                    events.append(("wait", [(op.flag, slot)]))

        def top(ops, env):
            nonlocal barriers
            for op in ops:
                if isinstance(op, ir.Barrier):
                    events.append(("barrier", barriers))
                    barriers += 1
                elif isinstance(op, ir.Stage):
                    sm = self.stages.setdefault(op.index, _StageMoves(op))
                    sm.phase[rank] = barriers
                    for inner in op.body:
                        self.moves(inner, env, sm)
                    events.append(("stage", op.index))
                elif isinstance(op, ir.If):
                    top(op.then if self.ev(op.cond, env, "a condition") else op.orelse, env)
                else:
                    sync(op, env)

        top(self.s.body, env)
        return events

    def moves(self, op, env: dict, sm: _StageMoves) -> None:
        if isinstance(op, ir.Loop):
            for v in self.domain(op.domain, env["rank"]):
                for o in op.body:
                    self.moves(o, {**env, op.var: v}, sm)
            return
        if isinstance(op, ir.If):
            for o in (op.then if self.ev(op.cond, env, "a condition") else op.orelse):
                self.moves(o, env, sm)
            return
        i = len(sm.issuer)
        sm.issuer.append(env["rank"])
        sm.key.append(self.length_key(op.dst.length, env))
        sm.dst.append(self.owner(op.dst, env))
        if isinstance(op, ir.Reduce):
            sm.kind.append(_REDUCE)
            srcs = [self.owner(op.src, {**env, op.var: v}) for v in self.domain(op.domain, env["rank"])]
        else:
            sm.kind.append(_ACCUMULATE if isinstance(op, ir.Accumulate) else _COPY)
            srcs = [self.owner(op.src, env)]
        sm.nsrc.append(len(srcs))
        sm.src_move.extend([i] * len(srcs))
        sm.src_owner.extend(srcs)


def _routes(ops) -> bool:
    for op in ops:
        if isinstance(op, ir.Route):
            return True
        if isinstance(op, (ir.Stage, ir.Loop)) and _routes(op.body):
            return True
        if isinstance(op, ir.If) and _routes(op.then + op.orelse):
            return True
    return False


def not_modelled(s: ir.Schedule) -> str | None:
    """Why the model cannot predict this schedule, or None."""
    if s.contract.kind.moe or _routes(s.body):
        return ("MoE routing moves data that depends on the routed expert ids; the model only covers "
                "data movement the schedule states")
    return None


def template(s: ir.Schedule, world: int, env: dict) -> Template:
    """env: every size symbol and rank parameter (the values instantiate takes as `sizes`)."""
    w = _Walker(s, world, env)
    timelines = [w.timeline(r) for r in range(world)]
    for sm in w.stages.values():
        sm.arrays = {k: np.asarray(getattr(sm, k), dtype=np.int64)
                     for k in ("issuer", "key", "kind", "dst", "nsrc", "src_move", "src_owner")}
    return Template(world, w.keys, w.stages, timelines, w.size_dependent)


def lengths(t: Template, env: dict) -> np.ndarray:
    """Elements of every length expression of the template at these sizes."""
    out = np.empty(len(t.keys), dtype=np.int64)
    for i, (e, fixed) in enumerate(t.keys):
        try:
            n = e.eval({"world": t.world, **env, **fixed})
        except ZeroDivisionError:
            raise SimulateError(f"division by zero evaluating a length ({e}); run `stratac check` "
                                "on the file") from None
        if n < 0:
            raise SimulateError(f"a move of {n} elements ({e} with {env}); run `stratac check` on "
                                "the file")
        out[i] = n
    return out


# ---------------------------------------------------------------------------------------------
# the cost of one stage on every rank that runs it

@dataclass
class StageCost:
    time_us: np.ndarray                    # per rank (only ranks that run the stage are meaningful)
    category: list[str]                    # per rank: the resource that set the time
    busy_us: np.ndarray                    # per rank: the resource time without the overheads
    loads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]   # phase -> tx, rx, hbm bytes per rank


def stage_cost(t: Template, index: int, lens: np.ndarray, elem: int, m: Machine, cores: int) -> StageCost:
    sm = t.stages[index]
    a = sm.arrays
    world, C, Q = t.world, cores, m.queues
    L = lens[a["key"]] if len(a["key"]) else np.zeros(0, dtype=np.int64)
    issuer, kind = a["issuer"], a["kind"]

    # strata::Partition: the stage's elements of each rank, end to end, cut by blocks over the cores
    T = np.bincount(issuer, weights=L, minlength=world).astype(np.int64) if len(L) else \
        np.zeros(world, dtype=np.int64)
    per = max(1, BLOCK_BYTES // elem)
    blocks = (T + per - 1) // per
    c = np.arange(C, dtype=np.int64)
    lo = np.minimum(T[:, None], (blocks[:, None] * c[None, :] // C) * per)
    base = np.concatenate(([0], np.cumsum(T)[:-1]))
    bin_start = (base[:, None] + lo).ravel()
    total = int(T.sum())
    core_in = np.zeros(world * C)
    core_out = np.zeros(world * C)
    core_vec = np.zeros(world * C)
    q_bytes = np.zeros(world * Q)
    q_posts = np.zeros(world * Q)
    if total:
        mv_start = np.concatenate(([0], np.cumsum(L)[:-1]))
        cuts = np.sort(np.concatenate((mv_start, bin_start, [total])))
        cuts = cuts[(cuts <= total) & np.concatenate(([True], cuts[1:] != cuts[:-1]))]
        seg_start, seg_len = cuts[:-1], np.diff(cuts)
        seg_mv = np.searchsorted(mv_start, seg_start, side="right") - 1
        seg_bin = np.searchsorted(bin_start, seg_start, side="right") - 1
        seg_kind = kind[seg_mv]
        nb = seg_len.astype(np.float64) * elem
        engine = sm.stage.engine
        if engine is ir.Engine.SDMA:
            sdma = seg_kind == _COPY
        elif engine is ir.Engine.AUTO:
            threshold = sm.stage.plan.sdma_threshold if sm.stage.plan else passes.SDMA_THRESHOLD
            sdma = (seg_kind == _COPY) & (nb >= threshold)
        else:
            sdma = np.zeros(len(nb), dtype=bool)
        k = a["nsrc"][seg_mv]
        core_in = np.bincount(seg_bin, weights=np.where(sdma, 0.0, k * nb), minlength=world * C)
        core_out = np.bincount(seg_bin, weights=np.where(sdma, 0.0, nb), minlength=world * C)
        core_vec = np.bincount(seg_bin, weights=np.where(seg_kind == _REDUCE, k * nb, 0.0),
                               minlength=world * C)
        queue = (seg_bin // C) * Q + (seg_bin % C) % Q
        q_bytes = np.bincount(queue, weights=np.where(sdma, nb, 0.0), minlength=world * Q)
        q_posts = np.bincount(queue, weights=sdma.astype(np.float64), minlength=world * Q)
    per_us = lambda gbps: gbps * 1e3   # GB/s -> bytes per microsecond
    aiv_us = np.maximum.reduce([core_in / per_us(m.gm_to_ub_gbps), core_out / per_us(m.ub_to_gm_gbps),
                                core_vec / per_us(m.vector_gbps)]).reshape(world, C).max(axis=1)
    sdma_us = (q_bytes / per_us(m.queue_gbps) + q_posts * m.post_us).reshape(world, Q).max(axis=1)

    # traffic: source owner -> running rank -> destination owner; every access is HBM traffic
    src_move, src_owner, dst = a["src_move"], a["src_owner"], a["dst"]
    src_bytes = L[src_move].astype(np.float64) * elem
    src_issuer = issuer[src_move]
    src_remote = (src_owner != src_issuer) & (src_bytes > 0)
    dst_bytes = L.astype(np.float64) * elem
    dst_remote = (dst != issuer) & (dst_bytes > 0)
    # own link: what this rank's own moves put through its own UB link
    rx_own = np.bincount(src_issuer, weights=np.where(src_remote, src_bytes, 0.0), minlength=world)
    tx_own = np.bincount(issuer, weights=np.where(dst_remote, dst_bytes, 0.0), minlength=world)
    dst_hbm = np.where(kind == _ACCUMULATE, 2.0, 1.0) * dst_bytes     # an atomic add reads and writes
    hbm_own = (np.bincount(src_issuer, weights=np.where(src_remote, 0.0, src_bytes), minlength=world)
               + np.bincount(issuer, weights=np.where(dst_remote, 0.0, dst_hbm), minlength=world))
    touched = (np.bincount(src_issuer, weights=src_remote.astype(np.float64), minlength=world)
               + np.bincount(issuer, weights=dst_remote.astype(np.float64), minlength=world)) > 0
    fabric_us = np.maximum(tx_own, rx_own) / per_us(m.fabric_gbps)
    hbm_us = hbm_own / per_us(m.hbm_gbps)

    parts = np.stack([fabric_us, hbm_us, aiv_us, sdma_us])     # in CATEGORIES order
    busy = parts.max(axis=0)
    which = parts.argmax(axis=0)
    category = [CATEGORIES[i] if b > 0 else "latency" for i, b in zip(which, busy)]
    time_us = busy + m.sync_all_us + np.where(touched, m.fabric_latency_us, 0.0)

    # every link's and every HBM's load, per phase of the ranks running the stage
    loads = {}
    phase_of = np.full(world, -1, dtype=np.int64)
    for r, ph in sm.phase.items():
        phase_of[r] = ph
    for ph in sorted(set(sm.phase.values())):
        sel_src = phase_of[src_issuer] == ph
        sel_dst = phase_of[issuer] == ph
        w_src = np.where(sel_src & src_remote, src_bytes, 0.0)
        w_dst = np.where(sel_dst & dst_remote, dst_bytes, 0.0)
        tx = np.bincount(src_owner, weights=w_src, minlength=world) + \
            np.bincount(issuer, weights=w_dst, minlength=world)
        rx = np.bincount(src_issuer, weights=w_src, minlength=world) + \
            np.bincount(dst, weights=w_dst, minlength=world)
        hbm = np.bincount(src_owner, weights=np.where(sel_src, src_bytes, 0.0), minlength=world) + \
            np.bincount(dst, weights=np.where(sel_dst, dst_hbm, 0.0), minlength=world)
        loads[ph] = (tx, rx, hbm)
    return StageCost(time_us, category, busy, loads)


# ---------------------------------------------------------------------------------------------
# the critical path through stages, flags and barriers

def _add(parts: dict, cat: str, us: float) -> dict:
    out = dict(parts)
    out[cat] = out.get(cat, 0.0) + us
    return out


def call_time(t: Template, costs: dict[int, StageCost], m: Machine, cores: int) -> tuple[float, dict]:
    """(predicted microseconds of one call, its critical path split by category)."""
    world, lat = t.world, m.fabric_latency_us
    barrier_cost = 2 * m.sync_all_us + math.ceil(world / cores) * m.flag_issue_us + \
        (lat if world > 1 else 0.0)
    clock = [m.launch_us] * world
    parts = [{"latency": m.launch_us} for _ in range(world)]
    pos = [0] * world
    landed: dict[tuple, tuple[float, dict]] = {}
    arrived: dict[int, tuple[float, dict]] = {}
    phase, phase_start = 0, (m.launch_us, {"latency": m.launch_us})
    load: dict[int, list] = {}
    for cost in costs.values():
        for ph, (tx, rx, hbm) in cost.loads.items():
            acc = load.setdefault(ph, [np.zeros(world), np.zeros(world), np.zeros(world)])
            acc[0] += tx
            acc[1] += rx
            acc[2] += hbm

    def bound(ph: int) -> tuple[float, str]:
        if ph not in load:
            return 0.0, "fabric"
        tx, rx, hbm = load[ph]
        f = max(tx.max(), rx.max()) / (m.fabric_gbps * 1e3)
        h = hbm.max() / (m.hbm_gbps * 1e3)
        return (f, "fabric") if f >= h else (h, "hbm")

    def settle(ph: int, when: float, path: dict) -> tuple[float, dict]:
        """The later of `when` and the phase's link/HBM bound from its start."""
        us, cat = bound(ph)
        if phase_start[0] + us > when:
            return phase_start[0] + us, _add(phase_start[1], cat, us)
        return when, path

    while True:
        progressed = False
        for r in range(world):
            tl = t.timelines[r]
            while pos[r] < len(tl):
                kind, arg = tl[pos[r]]
                if kind == "stage":
                    cost = costs[arg]
                    busy = float(cost.busy_us[r])
                    clock[r] += float(cost.time_us[r])
                    parts[r] = _add(_add(parts[r], cost.category[r], busy), "latency",
                                    float(cost.time_us[r]) - busy)
                elif kind == "signal":
                    us = len(arg) * m.flag_issue_us + m.sync_all_us
                    clock[r] += us
                    parts[r] = _add(parts[r], "latency", us)
                    here = (clock[r], parts[r])
                    there = (clock[r] + lat, _add(parts[r], "latency", lat))
                    for owner, flag, slot in arg:
                        landed[(owner, flag, slot)] = there if owner != r else here
                elif kind == "wait":
                    hits = [landed.get((r, flag, slot)) for flag, slot in arg]
                    if any(h is None for h in hits):
                        break
                    when, path = max(hits, key=lambda h: h[0])
                    if when > clock[r]:
                        clock[r], parts[r] = when, path
                    clock[r] += m.sync_all_us
                    parts[r] = _add(parts[r], "latency", m.sync_all_us)
                elif kind == "barrier":
                    if r not in arrived:
                        arrived[r] = (clock[r], parts[r])
                        progressed = True
                    break
                pos[r] += 1
                progressed = True
        if len(arrived) == world:
            last = max(arrived, key=lambda r: arrived[r][0])
            when, path = settle(phase, *arrived[last])
            when, path = when + barrier_cost, _add(path, "latency", barrier_cost)
            for r in range(world):
                clock[r], parts[r] = when, path
                pos[r] += 1
            arrived = {}
            phase += 1
            phase_start = (when, path)
            progressed = True
        if all(pos[r] == len(t.timelines[r]) for r in range(world)):
            break
        if not progressed:
            raise SimulateError("the schedule waits for a flag or barrier nobody provides; run "
                                "`stratac check` on the file")
    last = max(range(world), key=lambda r: clock[r])
    return settle(phase, clock[last], parts[last])


# ---------------------------------------------------------------------------------------------
# predictions

@dataclass
class Prediction:
    schedule: str
    kind: str
    world: int
    size: int          # nccl-tests' S, bytes
    count: int         # the value of the size symbol
    dtype: str
    time_us: float
    algbw: float       # GB/s
    busbw: float       # GB/s
    bound: str         # the category with the largest share of the critical path
    breakdown_us: dict
    ratio: float | None = None      # busbw / busbw of `ratio_to` at the same size
    ratio_to: str | None = None


def predict_count(s: ir.Schedule, m: Machine, world: int, count: int, dtype: str = "f32",
                  root: int = 0, cores: int | None = None, tpl: Template | None = None
                  ) -> tuple[float, dict, Template]:
    """Predicted microseconds of one call at this value of the size symbols, its critical path by
    category, and the template (pass it back for the next count of the same schedule and world).
    s must have been through passes.pipeline (the `on auto` threshold lives in the stage plans)."""
    cores = _cores(m, cores)
    elem = _elem(dtype)
    env = {**{n: count for n in s.sizes}, **{x.name: root for x in s.rank_params}}
    if tpl is None or tpl.size_dependent or tpl.world != world:
        tpl = template(s, world, env)
    lens = lengths(tpl, env)
    costs = {i: stage_cost(tpl, i, lens, elem, m, cores) for i in tpl.stages}
    us, path = call_time(tpl, costs, m, cores)
    return us, path, tpl


def _cores(m: Machine, cores: int | None) -> int:
    if cores is None:
        return m.vector_cores
    if not 1 <= cores <= m.vector_cores:
        raise SimulateError(f"--cores must be between 1 and {m.vector_cores} (the vector cores of a "
                            f"rank in {m.path}), got {cores}")
    return cores


def _elem(dtype: str) -> int:
    d = ir.DType.parse(dtype)
    if d is None:
        raise SimulateError(f"unknown dtype {dtype!r}; known: {', '.join(x.short for x in ir.DType)}")
    return d.nbytes


def check_world(m: Machine, world: int) -> None:
    if world < 1:
        raise SimulateError(f"--world must be at least 1, got {world}")
    if world > m.max_world:
        raise SimulateError(f"world {world} is larger than the machine in {m.path}: {m.npus} NPUs x "
                            f"{m.dies_per_npu} dies = {m.max_world} ranks")


def predict(s: ir.Schedule, m: Machine, world: int, sizes: list[int], dtype: str = "f32",
            root: int = 0, cores: int | None = None) -> list[Prediction]:
    """One prediction per size S (bytes); a size below the smallest the schedule can take (one
    element per block) gives the same count as the previous one and is predicted once."""
    from .workload import Workload
    check_world(m, world)
    if s.rank_params and not 0 <= root < world:
        raise SimulateError(f"--root {root} is not a rank of a world of {world}")
    elem = _elem(dtype)
    lowered = passes.pipeline(s, passes.Options())
    out: list[Prediction] = []
    tpl, seen = None, None
    for size in sizes:
        count = Workload.count_for_bytes(s, world, size, elem)
        if count == seen:
            continue
        seen = count
        wl = Workload(s, world, count, root=root)
        us, path, tpl = predict_count(lowered, m, world, count, dtype, root, cores, tpl)
        nbytes = wl.size_bytes(elem)
        algbw = nbytes / (us * 1e-6) / 1e9
        out.append(Prediction(s.name, s.contract.kind.value, world, nbytes, count, dtype, us, algbw,
                              algbw * wl.busbw_factor(), max(path, key=path.get),
                              {k: path.get(k, 0.0) for k in CATEGORIES}))
    return out


@dataclass
class SimResult:
    meta: dict
    predictions: list[Prediction]
    skipped: list[dict]


def simulate_file(file: str, machine: Machine, world: int, sizes: list[int], dtype: str = "f32",
                  root: int = 0, cores: int | None = None) -> SimResult:
    from .frontend import load_source, schedules
    scheds = schedules(load_source(file))
    if not scheds:
        raise SimulateError(f"{file} holds no schedule")
    preds, skipped = [], []
    for s in scheds:
        why = not_modelled(s)
        if why:
            skipped.append({"schedule": s.name, "why": why})
            continue
        preds.extend(predict(s, machine, world, sizes, dtype, root, cores))
    first: dict[str, str] = {}
    for p in preds:
        first.setdefault(p.kind, p.schedule)
    ref = {(p.schedule, p.size): p for p in preds}
    several = {k for k in first if len({p.schedule for p in preds if p.kind == k}) > 1}
    for p in preds:
        if p.kind in several:
            q = ref.get((first[p.kind], p.size))
            if q is not None:
                p.ratio, p.ratio_to = p.busbw / q.busbw, q.schedule
    meta = {"what": "model predictions, not measurements", "file": file, "machine_file": machine.path,
            "machine": machine.name, "world": world, "dtype": dtype, "root": root,
            "cores": _cores(machine, cores), "figures": machine.figures()}
    return SimResult(meta, preds, skipped)


# ---------------------------------------------------------------------------------------------
# output

def _ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def header(res: SimResult) -> list[str]:
    m, f = res.meta, res.meta["figures"]
    r = f["rank"]
    return [
        f"# stratac simulate {m['file']}  world {m['world']}  dtype {m['dtype']}  cores {m['cores']}  "
        f"machine {m['machine_file']}",
        f"# MODEL PREDICTIONS, NOT MEASUREMENTS: an analytic model (docs/bench.md) of {m['machine']} "
        f"as {m['machine_file']} describes it; one rank = one die: {r['vector_cores']} vector cores, "
        f"UB {r['fabric_gbps']:g} GB/s per direction, HBM {r['hbm_gbps']:g} GB/s; the figures the "
        "file marks `assumption` are guesses",
        "# time: predicted per call, launch to the last rank's exit; algbw = size/time, busbw = algbw x "
        "factor (GB/s, nccl-tests); bound: the largest share of the critical path (fabric, hbm, aiv, "
        "sdma, latency); ratio: busbw / busbw of the first schedule of the same contract at that size",
    ]


def table(res: SimResult) -> list[str]:
    lines = header(res)
    by_sched: dict[str, list[Prediction]] = {}
    for p in res.predictions:
        by_sched.setdefault(p.schedule, []).append(p)
    for name, preds in by_sched.items():
        p0 = preds[0]
        ratio = any(p.ratio_to for p in preds)
        lines.append("#")
        lines.append(f"# {name}: {p0.kind}, world {p0.world}"
                     + (f"  (ratio against {p0.ratio_to})" if ratio else ""))
        head = (f"# {'size':>10} {'count':>11} {'type':>5} {'time(us)':>11} {'algbw':>8} {'busbw':>8} "
                f"{'bound':>8}")
        lines.append(head + (f" {'ratio':>8}" if ratio else ""))
        for p in preds:
            row = (f"  {p.size:>10} {p.count:>11} {p.dtype:>5} {p.time_us:>11.2f} {p.algbw:>8.3f} "
                   f"{p.busbw:>8.3f} {p.bound:>8}")
            lines.append(row + (f" {_ratio(p.ratio):>8}" if ratio else ""))
    for s in res.skipped:
        lines.append(f"# {s['schedule']}: not modelled: {s['why']}")
    return lines


def to_json(res: SimResult) -> dict:
    return {"meta": res.meta,
            "results": [{**p.__dict__} for p in res.predictions],
            "skipped": res.skipped}


def write_json(res: SimResult, path: str) -> None:
    Path(path).write_text(json.dumps(to_json(res), indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# the command

def _sizes(text: str) -> list[int]:
    from .bench import parse_sizes
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def cmd_simulate(args) -> int:
    try:
        machine = load_machine(args.machine)
        res = simulate_file(args.file, machine, args.world, args.sizes, args.dtype, args.root,
                            args.cores)
    except SimulateError as exc:
        print(f"stratac simulate: error: {exc}", file=sys.stderr)
        return 1
    for line in table(res):
        print(line)
    if args.json:
        write_json(res, args.json)
        print(f"# wrote {args.json}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """Registers `stratac simulate` on an argparse subparsers object; the command is args.fn."""
    p = sub.add_parser("simulate", help="predict time and bus bandwidth of every schedule of a file "
                       "on a machine description (an analytic model, not a measurement)")
    p.add_argument("file")
    p.add_argument("--machine", required=True, metavar="TOML",
                   help="the machine description, e.g. machines/cloudmatrix384.toml")
    p.add_argument("--world", type=_positive, required=True, help="ranks (one die each)")
    p.add_argument("--sizes", type=_sizes, default="8:256M",
                   help="MIN:MAX doubling (MIN:MAX:FACTOR, or a comma list) of S in bytes "
                   "(default 8:256M)")
    p.add_argument("--dtype", choices=[d.short for d in ir.DType], default="f32")
    p.add_argument("--root", type=int, default=0, help="the root, for broadcast and reduce")
    p.add_argument("--cores", type=_positive, default=None,
                   help="vector cores per rank (default: all of the machine's)")
    p.add_argument("--json", metavar="OUT", help="write every prediction as JSON")
    p.set_defaults(fn=cmd_simulate)
    return p
