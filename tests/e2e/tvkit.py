"""Translation validation (issue 23): the generated kernel against the verifier's own simulation.

In: .strata files and a world size. Out: a plan for the rank processes of `tv_ranks.py` (every
schedule the verifier accepts at that world, compiled, and every instance it samples there: its
sizes, rank parameters, MoE sample routing and mask, and, per rank, what every buffer holds before
the call and what the verifier's simulated memory says it holds after it), and the comparison of
what the ranks saw with that.

The inputs are the verifier's tags, given numbers. The verifier's simulation
(stratac.verify.timeline.Execution driving stratac.verify.provenance.Values) starts every element
of every rank's every buffer as a distinct tag and moves and adds tags; its expert ids and a
combine's counts are data it chose (its sample routing), kept as they are. Here each tag is
replaced by a number, and the same simulation, over the same instance and in the same order, is
evaluated on those numbers: what it leaves in memory is what the kernel must leave.
The numbers (`encode`):

* an element of a float or int32 buffer: a distinct positive integer, different from every other
  element of that type in every buffer of every rank of the instance. So a copy from a wrong index,
  rank or buffer gives a different number; a sum missing a contribution is smaller, one that
  counts one twice is larger, and one taking a contribution from a wrong index differs by the
  difference of two distinct numbers. Every sum of up to SUMMANDS of them, and every product with a
  weight (a MoE combine's only), stays below what the type holds exactly (EXACT: 2^24 for float32), whatever order the
  kernel adds in; under a fixed max or min, or where the contract only moves numbers (no
  reduction, no weights), below EXACT itself.
* a MoE combine's weights: integers in [1, WEIGHT_MAX], the topk weights of one token distinct
  (a token's rows taken with each other's weights differ).
* an int8 buffer (a quantised payload, only ever moved): integers in [-127, 127].

A reduction's op is evaluated as the op (max, min) where the schedule fixes it; a schedule taking a
redop runs with op=sum, where the verifier's sums of tags are the kernel's sums. A type variable
runs as float32 (f16 and bf16 hold too few integers exactly for distinct numbers with sums), but in
an instance whose sizeof(T) is 2, which runs as float16, a redop as max. Where an instance only
picks numbers (no reduction, or a max or min), its float16 numbers are bit patterns, not values
(F16_PATTERNS: 31,743 positive finite values, in the order of their patterns), so that a world-9
gather has enough of them. There a kernel that adds where the proof copies is caught unless every
such sum rounds back to its larger operand (a tiny value added to a large one); the float32
instances of the same kernel catch it exactly.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pickle
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stratac import ir, verify
from stratac.codegen.pipeline import compile_schedules
from stratac.diagnostics import StrataError
from stratac.ir import passes
from stratac.ir.instantiate import instantiate
from stratac.lang import frontend
from stratac.targets import cpu as build
from stratac.verify import provenance
from stratac.verify.samples import context, route_sample
from stratac.verify.timeline import Execution

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.strata"))
CORPUS = sorted((ROOT / "tests" / "verify" / "corpus").glob("*.strata"))
HERE = Path(__file__).resolve().parent

WEIGHT_MAX = 16
SUMMANDS = 16          # contributions one element may receive (world <= 9 ranks, topk weights)
# the integers each element type holds exactly (int32 up to 2^24 too: results compare as floats)
EXACT = {ir.DType.F32: 1 << 24, ir.DType.I32: 1 << 24, ir.DType.F16: 1 << 11, ir.DType.BF16: 1 << 8}
# the positive finite float16 values, as bit patterns 1 .. 0x7bff: in the order of their values, so
# max and min of two of them pick the same one as max and min of their patterns; a copy keeps them
F16_PATTERNS = 0x7C00



@dataclass
class Instance:
    """One sampled instance of one schedule at one world, as the ranks run it."""
    key: str                     # how the failure message names it (stratac.verify.samples.context)
    file: int                    # index into Plan.files
    schedule: str
    sizes: dict[str, int]
    scalars: dict[str, object]   # rank parameters, the op
    active: tuple[bool, ...] | None
    overflow: bool               # a packed window's bound exceeded: the call must report it
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]       # torch dtype names, by buffer (tensors and scratch)
    init: list[dict[str, np.ndarray]]      # per rank, int64
    expect: list[dict[str, np.ndarray]]    # per rank, int64: the simulated memory after the call
    bits: bool = False           # the float16 buffers' numbers are bit patterns (`encode`)


@dataclass
class Plan:
    world: int
    files: list[tuple[str, list]] = field(default_factory=list)   # (name, [Compiled])
    instances: list[Instance] = field(default_factory=list)
    # instances with a tensor of no elements (a size 0 the verifier samples at a condition's
    # boundary): a call cannot be made with one, since torch gives an empty tensor no address
    # (data_ptr() is 0), so comm.empty's tensor is refused as off the heap. Counted, not run.
    empty: list[str] = field(default_factory=list)
    # instances whose int8 window rows (place's destination) are not whole 32-byte blocks: a call
    # refuses them before launch (several ranks would write one block of a peer window; docs/npu.md,
    # "Peer window rows"; tests/e2e/test_moe_int8.py provokes the refusal). Counted, not run.
    seconds: float = 0.0   # how long making the plan took


def accepted(path: Path, world: int, options: passes.Options, masks: bool = True) -> list:
    """The schedules of a file the verifier accepts at `world` (every sample, and every mask
    unless `masks` is false), each compiled (proven before and after the passes, generated; plan
    builds them); [] if the file does not parse. A schedule whose `requires` excludes the world is left
    out."""
    try:
        scheds = frontend.schedules(frontend.path_or_text(str(path), str(path)))
    except StrataError:
        return []
    out = []
    for s in scheds:
        if ir.unmet_requirement(s, world) is not None:
            continue
        try:
            (c,) = compile_schedules([s], options, [world])
        except StrataError:
            continue
        if masks and not all(r.ok for r in verify.verify_masks(s, [world])):
            continue
        out.append((s, c))
    return out


def samples(s: ir.Schedule, world: int,
            masked: bool | None = None) -> list[tuple[dict, tuple[bool, ...] | None]]:
    """The instances the verifier checks at `world` (verify_worlds, then verify_masks): every
    default sample, then every mask under every sample; masked False: the first part only, True:
    the second only."""
    out = [(sz, None) for sz in verify.default_samples(s, world)] if masked is not True else []
    if ir.takes_mask(s) and world in verify.MASK_WORLDS and masked is not False:
        out += [(sz, m) for m in verify.masks(world) for sz in verify.default_samples(s, world)]
    return out


class _OpValues(provenance.Values):
    """The verifier's simulated memory, with a reduction's op evaluated as that op: the verifier
    adds tags for max and min too (it holds them to exactly-once); on numbers, max is max."""

    def __init__(self, inst, op: str):
        super().__init__(inst)
        self.op = op

    def execute(self, ev) -> None:
        for ri in ev.routes:
            self._route(ri, ev)
        f = {"sum": np.add, "max": np.maximum, "min": np.minimum}
        for mv in ev.moves:
            owner, buf, lo, hi = mv.dst
            if hi <= lo:
                continue
            vals = [self.cur[(o, b)][l:h].astype(np.int64) for o, b, l, h in mv.srcs]
            op = self.op if isinstance(mv.op, ir.OpParam) else (mv.op.value if mv.op else None)
            if mv.accumulate:
                out = f[op](self.cur[(owner, buf)][lo:hi].astype(np.int64), vals[0])
            elif op is None:
                out = vals[0].copy()
            else:
                out = vals[0].copy()
                for v in vals[1:]:
                    out = f[op](out, v)
            self.cur[(owner, buf)][lo:hi] = out.astype(np.uint64)


def float16_bits(s: ir.Schedule, op: str) -> bool:
    """Whether an instance's float16 numbers are bit patterns (F16_PATTERNS) rather than integer
    values: when its reductions only pick (a copy, max, min, as `encode` says), so that neither the
    kernel nor the simulation ever adds them."""
    c = s.contract
    return (c.op is None and c.kind is not ir.ContractKind.MOE_COMBINE) or (
        isinstance(c.op, ir.ReduceOp) and c.op is not ir.ReduceOp.SUM) or (
        isinstance(c.op, ir.OpParam) and op != "sum")


def typevar_dtype(sizes: dict) -> ir.DType:
    """The type a type variable runs as: float32, or float16 in an instance whose sizeof(T) is 2."""
    return ir.DType.F16 if sizes.get(ir.ELEM) == 2 else ir.DType.F32


def encode(inst, rng: np.random.Generator, op: str = "sum") -> dict[tuple[int, str], np.ndarray]:
    """The number of every tag of the instance (see the module's docstring), as int64; op: what a
    redop parameter runs as."""
    s, c = inst.schedule, inst.schedule.contract
    weights = c.inputs[2] if c.kind is ir.ContractKind.MOE_COMBINE else None
    keys = [(r, p.name) for r in range(inst.world) for p in s.params if (r, p.name) not in inst.data]
    out: dict[tuple[int, str], np.ndarray] = {}
    groups: dict[ir.DType, list] = {}   # distinct numbers within each element type
    for r, b in keys:
        n, d = inst.buffer_sizes[b], s.param(b).dtype or typevar_dtype(inst.sizes)
        if b == weights:
            T, K = inst.buffer_shapes[b][0], (inst.buffer_shapes[b] + (1,))[1]
            w = np.stack([rng.permutation(np.arange(1, WEIGHT_MAX + 1))[:K] for _ in range(T)])
            out[(r, b)] = w.reshape(-1)[:n].astype(np.int64)
        elif d is ir.DType.I8:
            out[(r, b)] = rng.integers(-127, 128, n).astype(np.int64)
        else:
            groups.setdefault(d, []).append((r, b))
    # a fixed max or min only picks numbers, and a contract without a reduction (a copy: AllGather,
    # AllToAll, Broadcast, a MoE dispatch) only moves them: each number needs only to be exact. A
    # kernel that adds where the proof copies still differs: a sum of two distinct positive numbers
    # below EXACT is either exact (and larger than both) or at least EXACT (above every number)
    picks = (c.op is None and weights is None) or (
        isinstance(c.op, ir.ReduceOp) and c.op is not ir.ReduceOp.SUM) or (
        isinstance(c.op, ir.OpParam) and op != "sum")
    for d, ks in groups.items():
        limit = EXACT[d] // (1 if picks else SUMMANDS * (WEIGHT_MAX if weights else 1))
        if d is ir.DType.F16 and picks:   # numbers as bit patterns (float16_bits): far more of them
            limit = F16_PATTERNS
        total = sum(inst.buffer_sizes[b] for _, b in ks)
        if total >= limit:
            raise AssertionError(f"{s.name} ({context(inst)}): {total} {d.short} elements need distinct "
                                 f"numbers, more than the {limit - 1} that {d.short} holds exactly "
                                 "with every sum")
        # `total` distinct numbers of [1, limit): drawn without shuffling the whole range (a
        # permutation of 2^24 numbers per instance was most of the plan's time)
        numbers = rng.choice(limit - 1, size=total, replace=False).astype(np.int64) + 1
        at = 0
        for r, b in ks:
            n = inst.buffer_sizes[b]
            out[(r, b)] = numbers[at:at + n]
            at += n
    return out


def simulate(s: ir.Schedule, world: int, sizes: dict, active, op: str, seed: int):
    """The verifier's execution of one instance on numbered tags: (instance, initial numbers,
    memory after), every (rank, buffer) as int64."""
    inst = instantiate(s, world, dict(sizes), active=active)
    if s.contract.kind.moe:
        route_sample(inst, getattr(sizes, "routing", None) or "uniform")
    ex = Execution(inst)
    vals = ex.values = _OpValues(inst, op)
    nums = encode(inst, np.random.default_rng(seed), op)
    for key, arr in nums.items():
        vals.init[key] = arr.astype(np.uint64)
        vals.cur[key] = arr.astype(np.uint64)
    diags = ex.run()
    if diags:
        raise AssertionError(f"{s.name}: the verifier's execution failed on numbers: {diags[0].message}")
    if vals.faults:
        raise AssertionError(f"{s.name}: routing outside its window: {vals.faults[0].message}")
    init = {k: vals.init[k].astype(np.int64) for k in vals.cur}
    after = {k: v.astype(np.int64) for k, v in vals.cur.items()}
    return inst, init, after, bool(vals.overflow)


def plan(world: int, paths: list[Path], options: passes.Options | None = None,
         masked: bool | None = None) -> Plan:
    """Every accepted schedule of `paths` at `world`, compiled and built, and all its instances
    (`masked`: as `samples` takes it)."""
    options = options or passes.Options()
    out = Plan(world)
    uses: dict[tuple[int, str], set] = {}   # (file, schedule) -> the (dtype, op) its instances launch
    for path in paths:
        found = accepted(path, world, options, masks=masked is not False)
        if not found:
            continue
        fi = len(out.files)
        out.files.append((path.name, [c for _, c in found]))
        for s, _ in found:
            for j, (sizes, active) in enumerate(samples(s, world, masked)):
                # float16 holds the integers below 2^11 exactly: its sums would soon leave them,
                # so a redop runs as max there (each number then needs only to be exact)
                op = "max" if typevar_dtype(sizes) is ir.DType.F16 else "sum"
                inst, init, after, over = simulate(s, world, sizes, active, op,
                                                   seed=zlib.crc32(f"{path.name}/{s.name}/{world}/"
                                                                   f"{active}/{j}".encode()))
                if any(inst.buffer_sizes[p.name] == 0 for p in s.tensors):
                    out.empty.append(f"{path.name}: {s.name} ({context(inst)})")
                    continue
                if passes.window_row_faults(s, ir.DType.F32, {"world": world, **sizes}):
                    # every call refuses such an instance, so the verifier must not sample it
                    # (samples.py pads an int8 window's hidden): a proof of nothing that runs
                    raise AssertionError(f"{path.name}: {s.name} ({context(inst)}): a sample whose "
                                         "int8 window rows are not whole 32-byte blocks")
                dtypes = {p.name: (p.dtype or typevar_dtype(sizes)).torch_name for p in s.params}
                kernel = typevar_dtype(sizes) if s.typevars else next(p.dtype for p in s.params)
                uses.setdefault((fi, s.name), set()).add((kernel.short, op if s.op_param else None))
                scalars = {x.name: sizes[x.name] for x in s.int_params}
                if s.op_param:
                    scalars[s.op_param.name] = op
                out.instances.append(Instance(
                    key=context(inst), file=fi, schedule=s.name,
                    sizes={k: sizes[k] for k in s.sizes}, scalars=scalars, active=active,
                    overflow=over,
                    shapes={p.name: tuple(inst.buffer_shapes.get(p.name) or (inst.buffer_sizes[p.name],))
                            for p in s.params},
                    dtypes=dtypes,
                    init=[{b: init[(r, b)] for b in dtypes} for r in range(world)],
                    expect=[{b: after[(r, b)] for b in dtypes} for r in range(world)],
                    bits=float16_bits(s, op)))
    # the ranks then load without building: the entry points (element type, op) the instances use
    jobs = [(c.output, sorted(uses[(fi, c.schedule.name)], key=str))
            for fi, (_, compiled) in enumerate(out.files) for c in compiled if (fi, c.schedule.name) in uses]
    build.build_all([o for o, _ in jobs], [u for _, u in jobs])
    return out


def plan_to(world: int, paths: list[Path], masked: bool | None, out: Path) -> None:
    """plan(world, paths, masked=masked), timed, written to `out` (a worker of plan_all)."""
    t0 = time.perf_counter()
    p = plan(world, paths, masked=masked)
    p.seconds = time.perf_counter() - t0
    write(p, out)


def plan_all(parts: list[tuple[int, bool | None, Path]], paths: list[Path]) -> None:
    """plan_to of every (world, masked, out) part, in worker processes, one per CPU: the plans
    are independent, and making them (proofs, simulation, builds) is the test's serial part."""
    jobs = min(len(parts), os.cpu_count() or 1)
    if jobs < 2:
        for world, masked, out in parts:
            plan_to(world, paths, masked, out)
        return
    # spawned, not forked: the test process may hold torch's threads, and a plan needs no torch
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        # the largest worlds first, so that the last plan to start is a small one
        futures = [pool.submit(plan_to, world, paths, masked, out)
                   for world, masked, out in sorted(parts, key=lambda p: -p[0])]
        for f in futures:
            f.result()


def write(p: Plan, path: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump(p, f, protocol=pickle.HIGHEST_PROTOCOL)


def read(path: Path) -> Plan:
    sys.path.insert(0, str(HERE))
    with open(path, "rb") as f:
        return pickle.load(f)
