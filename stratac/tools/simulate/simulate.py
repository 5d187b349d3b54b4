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

* MoE dispatch/combine and AllToAllV (routing constructs): their data movement depends on the
  expert ids, so it is built from a sample routing (stratac.routing.expert_ids, per rank; expert e
  lives on rank e // (experts / world)), the way strata::Router moves it: place = one row copy per
  routed (token, k) entry, from the running rank to the expert's owner, the routed rows split
  evenly over the cores in (t, k) order (SDMA or the core's UB per the stage's engine, one SDMA
  post per row); gather = per routed entry one row read (remote if the owner is another rank) and
  the weighted f32 accumulate, the tokens split evenly over the cores, plus one row write per token;
  histogram, exscan and slots = scalar metadata on core 0. Scalar work (those three, and the id
  scans of place and gather) costs SCALAR_CALL_US per call and SCALAR_ELEMENT_US per id, count or
  offset: both are assumptions (no public figure), see below. Count rows are ordinary copies.

Not modelled: contention inside the UB switches (the fabric is taken as non-blocking), the faster
link between the two dies of one package, L2 cache hits, the tail of a double-buffered tile queue.

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

from stratac import ir
from stratac.ir import passes

BLOCK_BYTES = 32   # the kernels partition a stage over the cores in whole DataCopy blocks
CATEGORIES = ("fabric", "hbm", "aiv", "sdma", "latency", "scalar")
_COPY, _ACCUMULATE, _REDUCE = 0, 1, 2

# Routing metadata runs on a vector core's scalar unit (strata::Router in
# runtime/device/strata_device.h: histogram, exscan and slots on core 0, one GM value at a time;
# place and gather scan the ids on every core). No machine file has a figure for it and we found no
# public one, so both of these are ASSUMPTIONS (plausible orders of magnitude, not sources):
SCALAR_CALL_US = 1.0        # assumption: entering a routing call (per-expert UB counters cleared,
                            # the data cache flushed after the metadata is written)
SCALAR_ELEMENT_US = 0.01    # assumption: 10 ns per id, count or offset the scalar unit reads or
                            # writes (GM GetValue/SetValue through the scalar data cache)
# gather's vector work, in passes over a row of f32 (Router::Gather): per routed entry cast to f32
# (not for f32 tokens), scale by the weight, add; per token zero the accumulator and cast (copy) out
GATHER_ENTRY_PASSES = {2: 3, 4: 2}   # element bytes of the tokens -> passes per entry
GATHER_TOKEN_PASSES = 2

# MoE defaults, DeepSeek-V3-like (arXiv 2412.19437: hidden 7168, 8 routed experts per token out of
# 256); 8 experts per rank is DeepSeek-V3's 256 at world 32. Tokens per rank: 16 (decode batches)
# to 4096 (a prefill chunk, DeepEP's normal-kernel benchmark).
MOE_TOKENS = "16:4096"
DEFAULT_SIZES = "8:256M"    # S of collectives, bytes
MOE_HIDDEN = 7168
MOE_TOPK = 8
MOE_EXPERTS_PER_RANK = 8
MOE_DTYPE = "bf16"


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
    scale: list[int] = field(default_factory=list)     # bytes of the destination's element type
                                                       # (0: the schedule's T)
    phase: dict[int, int] = field(default_factory=dict)   # rank -> barriers before the stage
    arrays: dict = field(default_factory=dict)
    routes: list[tuple[int, ir.RouteKind, dict]] = field(default_factory=list)   # issuer, kind, shape


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

    def routes(self, stage_index: int) -> list[tuple]:
        """(issuer, kind, shape) of every routing construct of a stage, for the consistency test."""
        return [(r, k, dict(shape)) for r, k, shape in self.stages[stage_index].routes]


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
        if isinstance(op, ir.Route):
            self.size_dependent = True      # its shape is read at these sizes (route_shape)
            sm.routes.append((env["rank"], op.kind, route_shape(self.s, op, env)))
            return
        i = len(sm.issuer)
        sm.issuer.append(env["rank"])
        sm.key.append(self.length_key(op.dst.length, env))
        sm.dst.append(self.owner(op.dst, env))
        dtype = self.s.param(op.dst.buffer).dtype
        sm.scale.append(dtype.nbytes if dtype is not None else 0)
        if isinstance(op, ir.Reduce):
            sm.kind.append(_REDUCE)
            srcs = [self.owner(op.src, {**env, op.var: v}) for v in self.domain(op.domain, env["rank"])]
        else:
            sm.kind.append(_ACCUMULATE if isinstance(op, ir.Accumulate) else _COPY)
            srcs = [self.owner(op.src, env)]
        sm.nsrc.append(len(srcs))
        sm.src_move.extend([i] * len(srcs))
        sm.src_owner.extend(srcs)


def route_shape(s: ir.Schedule, op: ir.Route, env: dict) -> dict:
    """What the cost of a routing construct depends on besides the ids, at these sizes (as
    stratac.instantiate reads it): tokens, topk and hidden of place/gather, the experts (the
    offsets' length), the number of ids a histogram counts, and which buffer holds the ids."""
    K = ir.RouteKind
    role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
    full = {"world": env["world"], **env}

    def ev(e: ir.IExpr) -> int:
        try:
            return e.eval(full)
        except ZeroDivisionError:
            raise SimulateError(f"division by zero evaluating {e} (line {op.span.line}); run "
                                "`stratac check` on the file") from None

    dims = lambda name: [ev(d) for d in s.param(name).dims]
    if op.kind is K.HISTOGRAM:
        return {"ids": role["ids"], "n": ev(s.param(role["ids"]).size), "experts": ev(op.dst.length)}
    sampled = s.contract.kind.moe and role.get("ids") == s.contract.inputs[1]
    if op.kind in (K.EXSCAN, K.SLOTS):
        return {"experts": ev(op.dst.length)}
    tokens, topk = (dims(role["ids"]) + [1])[:2]      # ids [tokens, topk], or [tokens] (AllToAllV)
    win = op.dst.buffer if op.kind is K.PLACE else role["win"]
    return {"ids": role["ids"], "tokens": tokens, "topk": topk, "hidden": dims(win)[1],
            "experts": ev(s.param(role["offs"]).size), "sampled": sampled}


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
    """Why the model cannot predict this schedule, or None. MoE and AllToAllV schedules are
    modelled on a sample routing; routing constructs outside such a contract have no ids to sample."""
    if _routes(s.body) and not s.contract.kind.moe:
        return ("its routing constructs move data that depends on ids, and only a MoE or AllToAllV "
                "contract says which buffer holds ids the model can sample")
    return None


def template(s: ir.Schedule, world: int, env: dict) -> Template:
    """env: every size symbol and rank parameter (the values instantiate takes as `sizes`)."""
    w = _Walker(s, world, env)
    timelines = [w.timeline(r) for r in range(world)]
    for sm in w.stages.values():
        sm.arrays = {k: np.asarray(getattr(sm, k), dtype=np.int64)
                     for k in ("issuer", "key", "kind", "dst", "nsrc", "src_move", "src_owner", "scale")}
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
# a sample routing: every rank's expert ids, and what the model needs of them

class Routed:
    """The expert ids of every rank at one size, from stratac.routing.expert_ids, reduced to what
    the costs need: per rank the routed entries and where they go (a world x world table of
    entries per source and owner), and their positions, for the kernel's split over the cores.
    Arrays are per (token, k) entry, never per element of a row."""

    def __init__(self, ids: list[np.ndarray], experts: int, routing: str = "custom"):
        self.world = len(ids)
        shape = ids[0].shape if ids else (0, 1)
        self.tokens, self.topk = (tuple(shape) + (1,))[:2]
        self.experts, self.routing = experts, routing
        W, L = self.world, max(1, experts // max(1, self.world))
        self.valid = np.zeros((W, self.tokens * self.topk), dtype=bool)
        self.owners = np.zeros((W, W), dtype=np.int64)      # [source, owner]: routed entries
        for r, x in enumerate(ids):
            x = np.asarray(x).reshape(-1)
            v = (x >= 0) & (x < experts)
            self.valid[r] = v
            self.owners[r] = np.bincount(x[v] // L, minlength=W)[:W]
        self.routed = self.owners.sum(axis=1)               # entries each rank routes
        self._split: dict = {}

    @classmethod
    def sample(cls, routing: str, world: int, tokens: int, topk: int, experts: int,
               seed: int = 0) -> "Routed":
        from stratac.verify.routing import expert_ids
        return cls([expert_ids(routing, r, tokens, topk, experts, seed) for r in range(world)],
                   experts, routing)

    @property
    def received(self) -> np.ndarray:
        """Rows each rank receives in dispatch (and reads back in combine: the same rows)."""
        return self.owners.sum(axis=0)

    def place_split(self, cores: int) -> tuple[np.ndarray, np.ndarray]:
        """Router::Place on `cores` cores: (rows [world, cores], ids scanned [world, cores]). Core c
        moves the routed entries [routed * c / cores, routed * (c + 1) / cores) in (t, k) order,
        after counting the routed entries (every id once) and scanning up to its last entry."""
        key = ("place", cores)
        if key not in self._split:
            W, n = self.world, self.valid.shape[1]
            bounds = self.routed[:, None] * np.arange(cores + 1)[None, :] // cores
            rows = np.diff(bounds, axis=1)
            scanned = np.zeros((W, cores), dtype=np.int64)
            for r in range(W):
                pos = np.flatnonzero(self.valid[r])
                hi = bounds[r, 1:]
                if len(pos):
                    scanned[r] = np.where(hi > 0, pos[np.maximum(hi, 1) - 1] + 1, 0)
            self._split[key] = (rows, scanned + n)
        return self._split[key]

    def gather_split(self, cores: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Router::Gather on `cores` cores: (entries [world, cores], tokens [cores], last token
        [cores]). Core c combines tokens [tokens * c / cores, tokens * (c + 1) / cores), after
        counting the earlier tokens' entries per expert (their ids scanned)."""
        key = ("gather", cores)
        if key not in self._split:
            W, T = self.world, self.tokens
            per_token = self.valid.reshape(W, T, self.topk).sum(axis=2)
            cum = np.concatenate((np.zeros((W, 1), dtype=np.int64), np.cumsum(per_token, axis=1)), axis=1)
            b = T * np.arange(cores + 1) // cores
            self._split[key] = (cum[:, b[1:]] - cum[:, b[:-1]], np.diff(b), b[1:])
        return self._split[key]


# ---------------------------------------------------------------------------------------------
# the cost of one stage on every rank that runs it

@dataclass
class StageCost:
    time_us: np.ndarray                    # per rank (only ranks that run the stage are meaningful)
    category: list[str]                    # per rank: the resource that set the time
    busy_us: np.ndarray                    # per rank: the resource time without the overheads
    loads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]   # phase -> tx, rx, hbm bytes per rank
    scalar_us: np.ndarray | None = None    # per rank: the part of busy_us that is scalar work


class _Work:
    """What one stage asks of every rank's cores, queues, links and memory (bytes, posts, scalar
    microseconds); ordinary moves and routing constructs add to it."""

    def __init__(self, world: int, cores: int, queues: int):
        self.world, self.C, self.Q = world, cores, queues
        n = world * cores
        self.core_in, self.core_out, self.core_vec, self.core_scalar = (np.zeros(n) for _ in range(4))
        self.q_bytes, self.q_posts = np.zeros(world * queues), np.zeros(world * queues)
        self.tx_own, self.rx_own, self.hbm_own = (np.zeros(world) for _ in range(3))
        self.touched = np.zeros(world, dtype=bool)
        self.loads: dict[int, list[np.ndarray]] = {}

    def load(self, ph: int) -> list[np.ndarray]:
        return self.loads.setdefault(ph, [np.zeros(self.world) for _ in range(3)])


def stage_cost(t: Template, index: int, lens: np.ndarray, elem: int, m: Machine, cores: int,
               routed: Routed | None = None) -> StageCost:
    sm = t.stages[index]
    a = sm.arrays
    world, C, Q = t.world, cores, m.queues
    L = lens[a["key"]] if len(a["key"]) else np.zeros(0, dtype=np.int64)
    issuer, kind = a["issuer"], a["kind"]
    # a region of a typed buffer (i32 counts) moves as whole elements of T (strata::Ratio)
    L = L * np.where(a["scale"] > 0, np.maximum(1, a["scale"] // elem), 1) if len(L) else L
    w = _Work(world, C, Q)

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
            sdma = (seg_kind == _COPY) & (nb >= _threshold(sm))
        else:
            sdma = np.zeros(len(nb), dtype=bool)
        k = a["nsrc"][seg_mv]
        w.core_in += np.bincount(seg_bin, weights=np.where(sdma, 0.0, k * nb), minlength=world * C)
        w.core_out += np.bincount(seg_bin, weights=np.where(sdma, 0.0, nb), minlength=world * C)
        w.core_vec += np.bincount(seg_bin, weights=np.where(seg_kind == _REDUCE, k * nb, 0.0),
                                  minlength=world * C)
        queue = (seg_bin // C) * Q + (seg_bin % C) % Q
        w.q_bytes += np.bincount(queue, weights=np.where(sdma, nb, 0.0), minlength=world * Q)
        w.q_posts += np.bincount(queue, weights=sdma.astype(np.float64), minlength=world * Q)

    # traffic: source owner -> running rank -> destination owner; every access is HBM traffic
    src_move, src_owner, dst = a["src_move"], a["src_owner"], a["dst"]
    src_bytes = L[src_move].astype(np.float64) * elem
    src_issuer = issuer[src_move]
    src_remote = (src_owner != src_issuer) & (src_bytes > 0)
    dst_bytes = L.astype(np.float64) * elem
    dst_remote = (dst != issuer) & (dst_bytes > 0)
    # own link: what this rank's own moves put through its own UB link
    w.rx_own += np.bincount(src_issuer, weights=np.where(src_remote, src_bytes, 0.0), minlength=world)
    w.tx_own += np.bincount(issuer, weights=np.where(dst_remote, dst_bytes, 0.0), minlength=world)
    dst_hbm = np.where(kind == _ACCUMULATE, 2.0, 1.0) * dst_bytes     # an atomic add reads and writes
    w.hbm_own += (np.bincount(src_issuer, weights=np.where(src_remote, 0.0, src_bytes), minlength=world)
                  + np.bincount(issuer, weights=np.where(dst_remote, 0.0, dst_hbm), minlength=world))
    w.touched |= (np.bincount(src_issuer, weights=src_remote.astype(np.float64), minlength=world)
                  + np.bincount(issuer, weights=dst_remote.astype(np.float64), minlength=world)) > 0

    # every link's and every HBM's load, per phase of the ranks running the stage
    phase_of = np.full(world, -1, dtype=np.int64)
    for r, ph in sm.phase.items():
        phase_of[r] = ph
    for ph in sorted(set(sm.phase.values())):
        sel_src = phase_of[src_issuer] == ph
        sel_dst = phase_of[issuer] == ph
        w_src = np.where(sel_src & src_remote, src_bytes, 0.0)
        w_dst = np.where(sel_dst & dst_remote, dst_bytes, 0.0)
        tx, rx, hbm = w.load(ph)
        tx += np.bincount(src_owner, weights=w_src, minlength=world) + \
            np.bincount(issuer, weights=w_dst, minlength=world)
        rx += np.bincount(src_issuer, weights=w_src, minlength=world) + \
            np.bincount(dst, weights=w_dst, minlength=world)
        hbm += np.bincount(src_owner, weights=np.where(sel_src, src_bytes, 0.0), minlength=world) + \
            np.bincount(dst, weights=np.where(sel_dst, dst_hbm, 0.0), minlength=world)

    if sm.routes:
        _route_work(sm, w, routed, elem, m, phase_of)

    per_us = lambda gbps: gbps * 1e3   # GB/s -> bytes per microsecond
    data_us = np.maximum.reduce([w.core_in / per_us(m.gm_to_ub_gbps), w.core_out / per_us(m.ub_to_gm_gbps),
                                 w.core_vec / per_us(m.vector_gbps)])
    # a core's scalar work (routing metadata, id scans) comes before the data it moves or posts
    core_us = (w.core_scalar + data_us).reshape(world, C)
    core_at = core_us.argmax(axis=1)
    aiv_us = core_us.max(axis=1)
    aiv_scalar = w.core_scalar.reshape(world, C)[np.arange(world), core_at]
    q_scalar = np.zeros(world * Q)
    np.maximum.at(q_scalar, (np.arange(world * C) // C) * Q + (np.arange(world * C) % C) % Q, w.core_scalar)
    q_scalar = np.where(w.q_posts > 0, q_scalar, 0.0)
    q_us = (q_scalar + w.q_bytes / per_us(m.queue_gbps) + w.q_posts * m.post_us).reshape(world, Q)
    q_at = q_us.argmax(axis=1)
    sdma_us = q_us.max(axis=1)
    sdma_scalar = q_scalar.reshape(world, Q)[np.arange(world), q_at]
    fabric_us = np.maximum(w.tx_own, w.rx_own) / per_us(m.fabric_gbps)
    hbm_us = w.hbm_own / per_us(m.hbm_gbps)

    parts = np.stack([fabric_us, hbm_us, aiv_us, sdma_us])     # in CATEGORIES order
    busy = parts.max(axis=0)
    which = parts.argmax(axis=0)
    scalar = np.select([which == 2, which == 3], [aiv_scalar, sdma_scalar], 0.0)
    category = [CATEGORIES[i] if b > s else ("scalar" if b > 0 else "latency")
                for i, b, s in zip(which, busy, scalar)]
    time_us = busy + m.sync_all_us + np.where(w.touched, m.fabric_latency_us, 0.0)
    loads = {ph: tuple(v) for ph, v in w.loads.items()}
    return StageCost(time_us, category, busy, loads, scalar)


def _threshold(sm: _StageMoves) -> float:
    return sm.stage.plan.sdma_threshold if sm.stage.plan else passes.SDMA_THRESHOLD


def _route_work(sm: _StageMoves, w: _Work, routed: Routed | None, elem: int, m: Machine,
                phase_of: np.ndarray) -> None:
    """Adds the routing constructs of a stage to its work, from the sample routing (Router in
    runtime/device/strata_device.h)."""
    K = ir.RouteKind
    world, C, Q = w.world, w.C, w.Q
    cidx = np.arange(C)
    for r, kind, shape in sm.routes:
        if routed is None:
            raise SimulateError(f"stage {sm.stage.index} routes rows by ids: a sample routing is needed "
                                "(predict_moe)")
        E = shape["experts"]
        core0 = r * C
        if kind is K.HISTOGRAM:         # core 0 reads every id and writes every count
            w.core_scalar[core0] += SCALAR_CALL_US + (shape["n"] + E) * SCALAR_ELEMENT_US
            continue
        if kind is K.EXSCAN:            # core 0 reads the world x experts table, writes the offsets
            w.core_scalar[core0] += SCALAR_CALL_US + (world * E + E) * SCALAR_ELEMENT_US
            continue
        if kind is K.SLOTS:
            w.core_scalar[core0] += SCALAR_CALL_US + E * SCALAR_ELEMENT_US
            continue
        if not shape["sampled"] or routed.world != world or \
                (shape["tokens"], shape["topk"], E) != (routed.tokens, routed.topk, routed.experts):
            raise SimulateError(
                f"{kind.value} routes {shape['tokens']} x {shape['topk']} ids of {shape['ids']} over "
                f"{E} experts, but the sample routing has {routed.tokens} x {routed.topk} ids over "
                f"{routed.experts} experts at world {routed.world}: the model only knows the contract's ids")
        rb = float(shape["hidden"] * elem)               # bytes of one row
        row = routed.owners[r].astype(np.float64) * rb   # bytes to (place) or from (gather) each owner
        mine, remote = row[r], row.sum() - row[r]
        cores = core0 + cidx
        load_tx, load_rx, load_hbm = w.load(int(phase_of[r]))
        w.touched[r] |= remote > 0
        if kind is K.PLACE:
            rows, scanned = routed.place_split(C)
            rows, scanned = rows[r].astype(np.float64), scanned[r]
            w.core_scalar[cores] += SCALAR_CALL_US + (scanned + rows) * SCALAR_ELEMENT_US
            engine = sm.stage.engine
            if engine is ir.Engine.SDMA or (engine is ir.Engine.AUTO and rb >= _threshold(sm)):
                q = r * Q + cidx % Q                     # one post per row, on the core's queue
                np.add.at(w.q_bytes, q, rows * rb)
                np.add.at(w.q_posts, q, rows)
            else:
                w.core_in[cores] += rows * rb
                w.core_out[cores] += rows * rb
            w.tx_own[r] += remote
            w.hbm_own[r] += routed.routed[r] * rb + mine     # the token rows read, the local rows written
            load_tx[r] += remote
            load_rx += row
            load_rx[r] -= mine
            load_hbm[r] += routed.routed[r] * rb
            load_hbm += row
        else:                           # gather
            entries, ntok, last = routed.gather_split(C)
            entries = entries[r].astype(np.float64)
            w.core_scalar[cores] += SCALAR_CALL_US + (last * routed.topk + 2 * entries) * SCALAR_ELEMENT_US
            w.core_in[cores] += entries * rb
            w.core_out[cores] += ntok * rb
            f32row = shape["hidden"] * 4.0
            w.core_vec[cores] += (entries * GATHER_ENTRY_PASSES.get(elem, 3) + ntok * GATHER_TOKEN_PASSES) * f32row
            y = routed.tokens * rb                      # every token's row is written, routed or not
            w.rx_own[r] += remote
            w.hbm_own[r] += mine + y
            load_rx[r] += remote
            load_tx += row
            load_tx[r] -= mine
            load_hbm += row
            load_hbm[r] += y


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
                    scalar = float(cost.scalar_us[r]) if cost.scalar_us is not None else 0.0
                    clock[r] += float(cost.time_us[r])
                    path = parts[r]
                    if scalar > 0:
                        path = _add(path, "scalar", scalar)
                    if busy > scalar:
                        path = _add(path, cost.category[r], busy - scalar)
                    parts[r] = _add(path, "latency", float(cost.time_us[r]) - busy)
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
    moe: dict | None = None         # MoE/AllToAllV: the routed workload (size = received bytes)


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
    from stratac.tools.run.workload import Workload
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


@dataclass(frozen=True)
class MoeSpec:
    """The routed workload of MoE and AllToAllV schedules (tokens are swept separately)."""

    hidden: int = MOE_HIDDEN
    topk: int = MOE_TOPK
    experts: int | None = None      # over the whole world; None: MOE_EXPERTS_PER_RANK per rank
    routing: str = "uniform"
    seed: int = 0

    def resolved(self, s: ir.Schedule, world: int) -> tuple[int, int]:
        """(topk, experts) for this schedule: AllToAllV routes each row to one rank (topk 1, one
        "expert" per rank)."""
        if s.contract.kind is ir.ContractKind.ALLTOALLV:
            return 1, world
        return self.topk, self.experts if self.experts is not None else MOE_EXPERTS_PER_RANK * world

    def check(self, s: ir.Schedule, world: int) -> None:
        from stratac.host.comm import ROUTE_MAX_EXPERTS, ROUTE_MAX_TOPK
        from stratac.verify.routing import ROUTINGS
        if self.routing not in ROUTINGS:
            raise SimulateError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTINGS)}")
        if self.hidden < 1 or self.topk < 1:
            raise SimulateError(f"--hidden and --topk must be at least 1, got {self.hidden} and {self.topk}")
        if s.contract.kind is ir.ContractKind.ALLTOALLV:
            return                  # one destination rank per row: --topk and --experts do not apply
        experts = self.experts if self.experts is not None else MOE_EXPERTS_PER_RANK * world
        if experts < 1 or experts % world:
            raise SimulateError(f"--experts {experts} is not a positive multiple of the world size "
                                f"({world}): every rank owns experts / world experts")
        if experts > ROUTE_MAX_EXPERTS:
            raise SimulateError(f"--experts {experts}: the kernels count at most {ROUTE_MAX_EXPERTS} "
                                "experts (per-core counters in UB)")
        if self.topk > experts or self.topk > ROUTE_MAX_TOPK:
            raise SimulateError(f"--topk {self.topk} must be at most the number of experts ({experts}) "
                                f"and at most {ROUTE_MAX_TOPK}")


def heap_bytes(s: ir.Schedule, world: int, env: dict, elem: int) -> int:
    """Bytes of every buffer of the schedule (scratch too) on one rank."""
    full = {"world": world, **env}
    return sum(p.size.eval(full) * (p.dtype.nbytes if p.dtype is not None else elem) for p in s.params)


def predict_moe(s: ir.Schedule, m: Machine, world: int, tokens: list[int], moe: MoeSpec = MoeSpec(),
                dtype: str = MOE_DTYPE, cores: int | None = None, cache: dict | None = None
                ) -> list[Prediction]:
    """One prediction per token count of a MoE dispatch/combine or AllToAllV schedule, on the
    sample routing moe.routing (the same ids for every schedule at a token count: pass one `cache`
    dict to share them). size = the bytes a rank receives in dispatch (combine: reads back), the
    mean over ranks (DeepEP's count); busbw = algbw = size / time (no bus factor)."""
    from stratac.tools.run.workload import MoeWorkload
    check_world(m, world)
    moe.check(s, world)
    if dtype == "i32":
        raise SimulateError(f"{s.name} moves float tokens: --dtype f32, f16 or bf16")
    elem, C = _elem(dtype), _cores(m, cores)
    lowered = passes.pipeline(s, passes.Options())
    topk, experts = moe.resolved(s, world)
    cache = {} if cache is None else cache
    out = []
    for T in tokens:
        key = (moe.routing, moe.seed, world, T, topk, experts)
        routed = cache.get(key)
        if routed is None:
            routed = cache[key] = Routed.sample(moe.routing, world, T, topk, experts, moe.seed)
        wl = MoeWorkload(s, None, world, T, moe.hidden, topk, experts, moe.routing)
        env = wl.sizes(s)
        tpl = template(lowered, world, env)
        lens = lengths(tpl, env)
        costs = {i: stage_cost(tpl, i, lens, elem, m, C, routed) for i in tpl.stages}
        us, path = call_time(tpl, costs, m, C)
        us = float(us)
        rows = float(routed.received.mean())
        size = int(round(rows * moe.hidden * elem))
        algbw = size / (us * 1e-6) / 1e9
        info = {"tokens": T, "hidden": moe.hidden, "topk": topk, "experts": experts,
                "routing": moe.routing, "seed": moe.seed, "received_rows": rows,
                "received_rows_max": int(routed.received.max()),
                "heap_bytes": heap_bytes(s, world, env, elem)}
        out.append(Prediction(s.name, s.contract.kind.value, world, size, T, dtype, us, algbw, algbw,
                              max(path, key=path.get), {k: float(path.get(k, 0.0)) for k in CATEGORIES},
                              moe=info))
    return out


@dataclass
class SimResult:
    meta: dict
    predictions: list[Prediction]
    skipped: list[dict]


def simulate_file(file: str, machine: Machine, world: int, sizes: list[int] | None = None,
                  dtype: str | None = None, root: int = 0, cores: int | None = None,
                  tokens: list[int] | None = None, moe: MoeSpec | None = None) -> SimResult:
    """Every schedule of the file: collectives over `sizes` (bytes, default 8:256M), MoE and
    AllToAllV schedules over `tokens` per rank (default MOE_TOKENS) with `moe`. dtype None: f32 for
    collectives, bf16 for MoE."""
    from stratac.lang.frontend import load_source, schedules
    scheds = schedules(load_source(file))
    if not scheds:
        raise SimulateError(f"{file} holds no schedule")
    check_world(machine, world)
    routed = [s for s in scheds if s.contract.kind.moe]
    plain = [s for s in scheds if not s.contract.kind.moe]
    if tokens is not None or moe is not None:
        if not routed:
            raise SimulateError(f"--tokens, --hidden, --topk, --experts, --routing and --seed apply to MoE and "
                                f"AllToAllV schedules; {file} has none (use --sizes)")
    if sizes is not None and not plain:
        raise SimulateError(f"--sizes applies to collectives; every schedule of {file} is routed (MoE "
                            "or AllToAllV): sweep --tokens instead")
    if sizes is None:
        from stratac.tools.options import parse_sizes
        sizes = parse_sizes(DEFAULT_SIZES)
    tokens = tokens if tokens is not None else parse_tokens(MOE_TOKENS)
    moe = moe if moe is not None else MoeSpec()
    preds, skipped, cache = [], [], {}
    for s in scheds:
        why = not_modelled(s)
        if why:
            skipped.append({"schedule": s.name, "why": why})
            continue
        if s.contract.kind.moe:
            preds.extend(predict_moe(s, machine, world, tokens, moe, dtype or MOE_DTYPE, cores, cache))
        else:
            preds.extend(predict(s, machine, world, sizes, dtype or "f32", root, cores))
    first: dict[str, str] = {}
    for p in preds:
        first.setdefault(p.kind, p.schedule)
    at = lambda p: (p.schedule, p.count if p.moe else p.size)   # MoE: the same tokens
    ref = {at(p): p for p in preds}
    several = {k for k in first if len({p.schedule for p in preds if p.kind == k}) > 1}
    for p in preds:
        if p.kind in several:
            q = ref.get((first[p.kind], at(p)[1]))
            if q is not None:
                p.ratio, p.ratio_to = p.busbw / q.busbw, q.schedule
    dtypes = sorted({p.dtype for p in preds}, key=[d.short for d in ir.DType].index)
    meta = {"what": "model predictions, not measurements", "file": file, "machine_file": machine.path,
            "machine": machine.name, "world": world, "dtype": "/".join(dtypes) or (dtype or "f32"),
            "root": root, "cores": _cores(machine, cores), "figures": machine.figures()}
    if routed:
        meta["moe"] = {"tokens": tokens, "hidden": moe.hidden, "topk": moe.topk,
                       "experts": moe.experts if moe.experts is not None else MOE_EXPERTS_PER_RANK * world,
                       "routing": moe.routing, "seed": moe.seed,
                       "assumptions": {"scalar_call_us": SCALAR_CALL_US,
                                       "scalar_element_us": SCALAR_ELEMENT_US}}
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
    lines = [
        f"# stratac simulate {m['file']}  world {m['world']}  dtype {m['dtype']}  cores {m['cores']}  "
        f"machine {m['machine_file']}",
        f"# MODEL PREDICTIONS, NOT MEASUREMENTS: an analytic model (docs/bench.md) of {m['machine']} "
        f"as {m['machine_file']} describes it; one rank = one die: {r['vector_cores']} vector cores, "
        f"UB {r['fabric_gbps']:g} GB/s per direction, HBM {r['hbm_gbps']:g} GB/s; the figures the "
        "file marks `assumption` are guesses",
    ]
    if any(p.moe is None for p in res.predictions) or not res.predictions:
        lines.append(
            "# time: predicted per call, launch to the last rank's exit; algbw = size/time, busbw = algbw x "
            "factor (GB/s, nccl-tests); bound: the largest share of the critical path (fabric, hbm, aiv, "
            "sdma, latency); ratio: busbw / busbw of the first schedule of the same contract at that size")
    if "moe" in m:
        from stratac.verify.routing import DESCRIPTIONS
        x = m["moe"]
        kinds = {p.kind for p in res.predictions if p.moe is not None}
        what = []
        if kinds - {"alltoallv"}:
            what.append(f"MoE: hidden {x['hidden']}, topk {x['topk']}, experts {x['experts']} "
                        f"({x['experts'] // m['world']} per rank)")
        if "alltoallv" in kinds:
            what.append(f"AllToAllV: rows of {x['hidden']} elements, one destination rank each")
        lines += [
            f"# {'; '.join(what)}; routing {x['routing']} ({DESCRIPTIONS[x['routing']]}, seed "
            f"{x['seed']}); tokens (rows) per rank swept. Defaults DeepSeek-V3-like (simulate.py)",
            "# MoE time: predicted per call on that sample routing, launch to the last rank's exit; received: "
            "bytes a rank receives in dispatch (combine: reads back), mean over ranks (DeepEP's count); "
            "GB/s = received / time; bound: the largest share of the critical path (fabric, hbm, aiv, "
            "sdma, latency, scalar); ratio: GB/s / GB/s of the first schedule of the same contract at "
            "that token count (below 1: predicted slower); heap: every buffer of one rank",
            f"# MoE routing metadata (histogram, exscan, slots, id scans) runs on the scalar unit at an "
            f"ASSUMED {x['assumptions']['scalar_call_us']:g} us per call + "
            f"{x['assumptions']['scalar_element_us'] * 1e3:g} ns per id, count or offset",
        ]
    return lines


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


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
        if p0.moe is not None:
            head = (f"# {'tokens':>8} {'received':>12} {'rows/rank':>10} {'type':>5} {'time(us)':>11} "
                    f"{'GB/s':>8} {'bound':>8} {'heap/rank':>10}")
        else:
            head = (f"# {'size':>10} {'count':>11} {'type':>5} {'time(us)':>11} {'algbw':>8} {'busbw':>8} "
                    f"{'bound':>8}")
        lines.append(head + (f" {'ratio':>8}" if ratio else ""))
        for p in preds:
            if p.moe is not None:
                row = (f"  {p.count:>8} {p.size:>12} {p.moe['received_rows']:>10.1f} {p.dtype:>5} "
                       f"{p.time_us:>11.2f} {p.algbw:>8.3f} {p.bound:>8} "
                       f"{_fmt_bytes(p.moe['heap_bytes']):>10}")
            else:
                row = (f"  {p.size:>10} {p.count:>11} {p.dtype:>5} {p.time_us:>11.2f} {p.algbw:>8.3f} "
                       f"{p.busbw:>8.3f} {p.bound:>8}")
            lines.append(row + (f" {_ratio(p.ratio):>8}" if ratio else ""))
    for s in res.skipped:
        lines.append(f"# {s['schedule']}: not modelled: {s['why']}")
    return lines


def to_json(res: SimResult) -> dict:
    return {"meta": res.meta,
            "results": [{k: v for k, v in p.__dict__.items() if k != "moe" or v is not None}
                        for p in res.predictions],
            "skipped": res.skipped}


def write_json(res: SimResult, path: str) -> None:
    Path(path).write_text(json.dumps(to_json(res), indent=1) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# the command

def _sizes(text: str) -> list[int]:
    from stratac.tools.options import parse_sizes
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_tokens(text: str) -> list[int]:
    """Token counts per rank: MIN:MAX doubling, MIN:MAX:FACTOR, or a comma list of those (the
    union, sorted); plain integers."""
    out: set[int] = set()
    for part in text.split(","):
        bits = part.strip().split(":")
        try:
            vals = [int(b) for b in bits]
        except ValueError:
            raise ValueError(f"{part!r}: token counts are integers (MIN:MAX, MIN:MAX:FACTOR or a "
                             "comma list)") from None
        if len(vals) == 1:
            lo, hi, f = vals[0], vals[0], 2
        elif len(vals) in (2, 3):
            lo, hi, f = vals[0], vals[1], vals[2] if len(vals) == 3 else 2
        else:
            raise ValueError(f"{part!r}: a range is MIN:MAX or MIN:MAX:FACTOR")
        if lo < 1 or hi < lo or f < 2:
            raise ValueError(f"{part!r}: need 1 <= MIN <= MAX and FACTOR >= 2")
        v = lo
        while v <= hi:
            out.add(v)
            v *= f
    return sorted(out)


def _tokens(text: str) -> list[int]:
    try:
        return parse_tokens(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _routings() -> tuple[str, ...]:
    from stratac.verify.routing import ROUTINGS
    return ROUTINGS


def cmd_simulate(args) -> int:
    try:
        machine = load_machine(args.machine)
        given = [v for v in (args.hidden, args.topk, args.experts, args.routing) if v is not None]
        moe = None
        if given:
            moe = MoeSpec(hidden=args.hidden or MOE_HIDDEN, topk=args.topk or MOE_TOPK,
                          experts=args.experts, routing=args.routing or "uniform", seed=args.seed)
        elif args.seed:
            moe = MoeSpec(seed=args.seed)
        res = simulate_file(args.file, machine, args.world, args.sizes, args.dtype, args.root,
                            args.cores, args.tokens, moe)
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
    from stratac.tools.options import positive_int as _positive
    p = sub.add_parser("simulate", help="predict time and bus bandwidth of every schedule of a file "
                       "on a machine description (an analytic model, not a measurement)")
    p.add_argument("file")
    p.add_argument("--machine", required=True, metavar="TOML",
                   help="the machine description, e.g. machines/cloudmatrix384.toml")
    p.add_argument("--world", type=_positive, required=True, help="ranks (one die each)")
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="collectives: MIN:MAX doubling (MIN:MAX:FACTOR, or a comma list) of S in bytes "
                   f"(default {DEFAULT_SIZES})")
    p.add_argument("--dtype", choices=[d.short for d in ir.DType], default=None,
                   help=f"element type (default f32; MoE and AllToAllV: {MOE_DTYPE})")
    p.add_argument("--tokens", type=_tokens, default=None, metavar="SPEC",
                   help=f"MoE/AllToAllV: tokens (rows) per rank, MIN:MAX doubling, MIN:MAX:FACTOR or a "
                   f"comma list (default {MOE_TOKENS})")
    p.add_argument("--hidden", type=_positive, default=None,
                   help=f"MoE/AllToAllV: elements per token row (default {MOE_HIDDEN}, DeepSeek-V3)")
    p.add_argument("--topk", type=_positive, default=None,
                   help=f"MoE: experts per token (default {MOE_TOPK}, DeepSeek-V3)")
    p.add_argument("--experts", type=_positive, default=None,
                   help=f"MoE: experts over the whole world, a multiple of it (default "
                   f"{MOE_EXPERTS_PER_RANK} per rank: DeepSeek-V3's 256 at world 32)")
    p.add_argument("--routing", choices=_routings(), default=None,
                   help="MoE/AllToAllV: the sample routing (default uniform)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample routing (default 0)")
    p.add_argument("--root", type=int, default=0, help="the root, for broadcast and reduce")
    p.add_argument("--cores", type=_positive, default=None,
                   help="vector cores per rank (default: all of the machine's)")
    p.add_argument("--json", metavar="OUT", help="write every prediction as JSON")
    p.set_defaults(fn=cmd_simulate)
    return p
