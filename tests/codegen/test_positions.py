"""Differential test of the expressions a kernel prints, in every place a kernel prints one: random
IR expressions (every operator of the IR, literals inside and beyond int's range, negative
intermediate values where the IR allows them) become the step-loop bounds, `if` conditions, region
offsets, lengths and ranks, flag slots and sizes, stamps, reduce counts and skips, the values of
locals (`var`, `set`, which later expressions then name), lets (substituted in the IR, named by
the kernel where in scope, their values drawn again in and out of it), team-barrier
members and a named team's size (`strata::BlockTeam`/`StrideTeam`/`GroupTeam` in Init, whose members the
expressions then name) of random schedule bodies; codegen.generate writes the kernel through the real emitter and
templates, g++ compiles its Process() (every case of a test in one translation unit, under UBSan)
against a header that logs each device call with its arguments, and the log must equal the one
computed here by walking the IR with the IR's own semantics (`ir.Bin.eval`), at several ranks,
worlds, sizes and epochs. The printer, the emitter and the templates are what is tested; the
logging header stands in for the device library only where the log is read.

The values follow what a valid program has (the IR's preconditions, stratac/ir/expr.py): a
division's operands are not negative, a modulo's right operand is positive, a shift's left operand
is not negative and its right one is below 63; everything else may be negative."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from stratac import codegen, ir
from stratac.ir import Bin, BinKind, Const, Var, passes
from stratac.ir.printer import dump
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
K = BinKind
ENVS = [  # rank, world, n, epoch
    {"rank": 0, "world": 1, "n": 0, "epoch": 0},
    {"rank": 2, "world": 3, "n": 5, "epoch": 7},
    {"rank": 5, "world": 8, "n": 1000, "epoch": 40},
    {"rank": 7, "world": 8, "n": 3, "epoch": 1},
]
BIG = 2**40            # |value| bound of every subterm (no int64 overflow anywhere)
OFFSETS = 2**20        # offsets and lengths of regions lie in [0, OFFSETS)
EVENTS = 600           # events of one case over all its envs, at most


# ---- random expressions of two sorts: any value, or a non-negative one ----

SMALL = [0, 1, 2, 3, 4, 5, 7, 8]
BIG_LITERALS = [2**31 - 1, 2**31, 3_000_000_000]


@st.composite
def expr(draw, names: tuple[str, ...], depth: int = 3, nonneg: bool = False):
    """An expression over names; nonneg: never negative at any value of them."""
    leaf = depth == 0 or draw(st.integers(0, 3)) == 0
    if leaf:
        pool = [Var(x) for x in names] + [Const(v) for v in SMALL]
        if "rank" in names:        # the case's team: its size, the running rank's place, its base
            pool += [TEAM[0].size, TEAM[0].index, TEAM[0].base]
        if not nonneg:
            pool += [Const(-1), Const(-3)]
        if draw(st.integers(0, 9)) == 0:
            return Const(draw(st.sampled_from(BIG_LITERALS)))
        return draw(st.sampled_from(pool))
    sub = lambda nn=nonneg: expr(names, depth - 1, nn)              # noqa: E731
    kind = draw(st.sampled_from(list(K)))
    if kind is K.SUB and nonneg:
        kind = K.ADD
    if kind in (K.DIV,):
        return Bin(kind, draw(sub(True)), draw(positive(names, depth - 1)))
    if kind is K.MOD:
        return Bin(kind, draw(sub()), draw(positive(names, depth - 1)))
    if kind in (K.SHL, K.SHR):
        shift = draw(st.one_of(st.integers(0, 20).map(Const),
                               sub(True).map(lambda e: Bin(K.AND, e, Const(15)))))
        return Bin(kind, draw(sub(True)), shift)
    if kind is K.LOG2:
        return ir.log2(draw(positive(names, depth - 1)))
    if kind in (K.AND, K.OR, K.XOR) and nonneg:
        return Bin(kind, draw(sub(True)), draw(sub(True)))
    if kind in (K.LT, K.MIN) and draw(st.booleans()):     # what simplify folds where x >= 0
        return Bin(kind, draw(sub()), Const(0))
    return Bin(kind, draw(sub()), draw(sub()))


def positive(names, depth):
    """An expression that is at least 1."""
    return st.one_of(st.integers(1, 9).map(Const), st.just(Var("world")),
                     expr(names, max(depth, 0), True).map(lambda e: Bin(K.ADD, e, Const(1))))


def value(e: ir.IExpr, env: dict) -> int | None:
    """e's value by the IR's semantics, or None if some subterm leaves [-BIG, BIG]."""
    if isinstance(e, Bin):
        a, b = value(e.lhs, env), value(e.rhs, env)
        if a is None or b is None:
            return None
        v = Bin(e.kind, Const(a), Const(b)).eval({})
    else:
        v = e.eval(env)
    return v if -BIG <= v <= BIG else None


# ---- random schedule bodies, built top-down with the environments that reach each statement ----

class Rejected(Exception):
    pass


def fits(e, envs, lo=-BIG, hi=BIG):
    vals = [value(e, env) for env in envs]
    return all(v is not None and lo <= v < hi for v in vals)


@st.composite
def placed(draw, names, envs, lo=-BIG, hi=BIG, nonneg=False, depth=3):
    """An expression whose values at envs lie in [lo, hi): drawn a few times, else a literal."""
    for _ in range(6):
        e = draw(expr(names, depth, nonneg))
        if fits(e, envs, lo, hi):
            return e
    return Const(max(lo, 0) if hi > max(lo, 0) else lo)


def loop_envs(envs, var, lo, hi):
    out = [{**env, var: v} for env in envs for v in range(value(lo, env), value(hi, env))]
    if len(out) > EVENTS:
        raise Rejected
    return out


@st.composite
def step_loop(draw, names, envs, body):
    """A step loop: lo and hi any expressions whose difference is small at every env."""
    var = f"s{len([x for x in names if x.startswith('s')])}"
    for _ in range(8):
        lo = draw(placed(names, envs, 0, 6))      # a loop variable is never negative
        hi = draw(placed(names, envs, -4, 12))
        if all(value(hi, env) - value(lo, env) <= 6 for env in envs):
            break
    else:
        lo, hi = Const(0), draw(st.sampled_from([Bin(K.AND, Var("world"), Const(3)),
                                                 Bin(K.XOR, Var("rank"), Const(1))]))
    inner = loop_envs(envs, var, lo, hi)
    return ir.Loop(var, ir.Domain.RANGE, tuple(draw(body(names + (var,), inner))), SPAN, lo, hi)


@st.composite
def branch(draw, names, envs, body):
    cond = draw(placed(names, envs))
    then = [e for e in envs if value(cond, e)]
    orelse = [e for e in envs if not value(cond, e)]
    return ir.If(cond, tuple(draw(body(names, then))),
                 tuple(draw(body(names, orelse))) if draw(st.booleans()) else (), SPAN)


def region(draw, names, envs, remote):
    lo = draw(placed(names, envs, 0, OFFSETS, nonneg=True))
    length = draw(placed(names, envs, 0, OFFSETS, nonneg=True))
    rank = draw(placed(names, envs)) if remote else None
    return ir.Region("x", lo, length, rank, SPAN)


def same_length(dst, src):
    return dataclasses.replace(src, length=dst.length)


@st.composite
def move(draw, names, envs, op):
    kind = draw(st.sampled_from(["copy", "accumulate", "reduce"]))
    dst = region(draw, names, envs, remote=kind != "reduce" and draw(st.booleans()))
    if kind == "reduce":
        peers = draw(st.booleans())
        count = None if draw(st.booleans()) else draw(placed(names, envs, 0, 9))
        skip = draw(placed(names, envs)) if peers and count is not None else None
        src = same_length(dst, region(draw, names, envs, remote=False))
        src = dataclasses.replace(src, rank=draw(placed(names + ("p",), [
            {**e, "p": v} for e in envs for v in range(value(count, e) if count else e["world"])])))
        return ir.Reduce(dst, op, src, "p", ir.Domain.PEERS if peers else ir.Domain.RANKS, SPAN,
                         count, skip)
    src = same_length(dst, region(draw, names, envs, remote=dst.rank is None))
    return (ir.Copy if kind == "copy" else lambda d, s, sp: ir.Accumulate(d, op, s, sp))(dst, src, SPAN)


def moves(op, depth=2):
    @st.composite
    def body(draw, names, envs):
        out = []
        for _ in range(draw(st.integers(1, 2))):
            pick = draw(st.integers(0, 5 if depth else 0))
            if pick == 4:
                var = draw(st.sampled_from([ir.Domain.PEERS, ir.Domain.RANKS]))
                inner = [{**e, "q": v} for e in envs for v in range(e["world"])]
                out.append(ir.Loop("q", var, tuple(draw(moves(op, 0)(names + ("q",), inner))), SPAN))
            elif pick == 5:
                out.append(draw(step_loop(names, envs, moves(op, depth - 1))))
            elif pick == 3:
                out.append(draw(branch(names, envs, moves(op, depth - 1))))
            else:
                out.append(draw(move(names, envs, op)))
        return out
    return body


def controls(depth=2):
    @st.composite
    def body(draw, names, envs):
        out = []
        for _ in range(draw(st.integers(1, 2))):
            pick = draw(st.integers(0, 4 if depth else 1))
            flag = draw(st.sampled_from(["f0", "f1"]))
            index = draw(placed(names, envs, -2**31, 2**31))
            rnd = draw(placed(names, envs, 0, 2**20, nonneg=True))   # a round: part of the stamp
            # a let's value again, where its name may be out of scope (a loop or an arm ended)
            reuse = [v for v in LETS if v.names() <= set(names) and fits(v, envs, -2**31, 2**31)]
            if reuse and draw(st.booleans()):
                index = draw(st.sampled_from(reuse))
            if pick == 0:
                out.append(ir.Signal(flag, index, draw(placed(names, envs)), SPAN, rnd))
            elif pick == 1:
                out.append(ir.Wait(flag, index, SPAN, rnd))
            elif pick == 2:
                var = draw(st.sampled_from([ir.Domain.PEERS, ir.Domain.RANKS]))
                inner = [{**e, "q": v} for e in envs for v in range(e["world"])]
                out.append(ir.Loop("q", var, tuple(draw(controls(0)(names + ("q",), inner))), SPAN))
            elif pick == 3:
                out.append(draw(step_loop(names, envs, controls(depth - 1))))
            else:
                out.append(draw(branch(names, envs, controls(depth - 1))))
        return out
    return body


def top(op, depth=2):
    @st.composite
    def body(draw, names, envs):
        out = []
        mine: list[str] = []    # the vars this block declares: what its `set`s change
        for _ in range(draw(st.integers(1, 3))):
            pick = draw(st.integers(0, 7 if depth else 2))
            if pick == 7:   # a let: substituted in the IR, named again by the kernel
                val = draw(placed(names, envs, -2**31, 2**31))
                if isinstance(val, (Bin, ir.Sel)):
                    out.append(ir.Local(f"l{len(LETS)}", val, SPAN, mutable=False, inline=True))
                    LETS.append(val)
                    more = Bin(K.ADD, val, Const(1))      # the value inside a larger expression
                    out.append(ir.Wait("f1", more if draw(st.booleans()) and
                                       fits(more, envs, -2**31, 2**31) else val, SPAN))
                continue
            if pick in (5, 6):    # a set of this block's var, or a local (`var`, or a let of one)
                name = draw(st.sampled_from(mine)) if mine else \
                    f"v{len([x for x in names if x.startswith('v')])}"
                val = draw(placed(names, envs))
                if name in mine:
                    out.append(ir.Set(name, val, SPAN))
                else:
                    mutable = pick == 6
                    out.append(ir.Local(name, val, SPAN, mutable))
                    names = names + (name,)
                    if mutable:     # and set at once, from its own value or not
                        mine.append(name)
                        envs = [{**e, name: value(val, e)} for e in envs]
                        val = draw(placed(names, envs))
                        out.append(ir.Set(name, val, SPAN))
                envs = [{**e, name: value(val, e)} for e in envs]
                if fits(Var(name), envs, -2**31, 2**31):   # its value, observed in the log
                    out.append(ir.Wait("f0", Var(name), SPAN))
            elif pick == 0:
                team = draw(st.sampled_from([None, TEAM[0], "anonymous"]))
                if team == "anonymous":       # a team the kernel does not name: its members' values
                    team = draw(a_team("t", names))
                out.append(ir.Barrier(SPAN, team, draw(placed(names, envs, -2**30, 2**30))))
            elif pick == 1:
                engine = draw(st.sampled_from([ir.Engine.AIV, ir.Engine.SDMA]))
                out.append(ir.Stage(engine, tuple(draw(moves(op)(names, envs))), SPAN, len(out),
                                    PLAN))
            elif pick == 2:
                out += draw(controls()(names, envs))
            elif pick == 3:
                out.append(draw(step_loop(names, envs, top(op, depth - 1))))
            else:
                out.append(draw(branch(names, envs, top(op, depth - 1))))
        return out
    return body


PLAN = ir.Plan(copies_on_aiv=True, copies_on_sdma=True, reduces=True, sdma_threshold=262144)


def _base() -> ir.Schedule:
    """A lowered schedule over one symmetric buffer x of n elements, with a redop: the frame
    (parameters, contract, kernel plan) the random bodies are put in."""
    path = ROOT / "examples" / "allreduce_twoshot_flags.strata"
    return passes.pipeline(frontend.schedules(frontend.load_source(path))[0], passes.Options())


BASE = _base()
SPAN = BASE.span


@st.composite
def case(draw, i: int):
    names = ("rank", "world", "n")
    envs = [dict(e) for e in ENVS]
    # a named team (`team g = block(T)`), which the kernel computes in Init and its expressions name
    TEAM[0] = draw(a_team("g", ("world",)))
    LETS.clear()
    try:
        body = draw(top(OP)(names, envs))
    except Rejected:
        body = []
    flags = []
    for f in ("f0", "f1"):
        size = draw(placed(("world", "n"), envs, 0, 64, nonneg=True))
        seq = draw(st.one_of(st.integers(0, 9), placed(("world", "n"), envs, -2**30, 2**30)))
        flags.append(ir.Flag(f, size, SPAN, seq))
    return dataclasses.replace(BASE, name=f"case{i}", body=tuple(body), flags=tuple(flags),
                               teams=(TEAM[0],))


TEAM: list[ir.Team] = [None]    # the team of the case being drawn
LETS: list[ir.IExpr] = []       # the values of the case's lets so far (ir.Local.inline)


@st.composite
def a_team(draw, name: str, names: tuple[str, ...]):
    """block(T), stride(T) or groups(S0, S1[, S2]) (whose first ranks and sizes are conditionals
    of rank), the sizes positive expressions of names."""
    kind = draw(st.sampled_from(["block", "stride", "groups"]))
    if kind != "groups":
        return ir.Team(name, kind, draw(positive(names, 1)), SPAN)
    sizes = tuple(draw(positive(names, 1)) for _ in range(draw(st.integers(2, 3))))
    return ir.Team(name, "groups", Const(len(sizes)), SPAN, sizes=sizes)


OP = ir.OpParam("op")


# ---- what the kernel does, by the IR ----

def expected(s: ir.Schedule, env0: dict) -> list[str]:
    log: list[str] = []
    ev = lambda e, env: value(e, env)                              # noqa: E731
    bases, base = {}, Var("world")
    for f in s.flags:
        bases[f.name] = base
        base = Bin(K.ADD, base, f.size)
    seqs = {f.name: Const(f.seq) if isinstance(f.seq, int) else f.seq for f in s.flags}
    epoch = env0["epoch"]

    def loop_values(op, env):
        if op.domain is ir.Domain.RANGE:
            return [v for v in range(ev(op.lo, env), ev(op.hi, env))]
        return [v for v in range(env["world"]) if op.domain is ir.Domain.RANKS or v != env["rank"]]

    def walk(ops, env, on_leaf):
        env = dict(env)     # the block's own: its locals end with it
        for op in ops:
            if isinstance(op, ir.Loop):
                for v in loop_values(op, env):
                    walk(op.body, {**env, op.var: v}, on_leaf)
            elif isinstance(op, ir.If):
                walk(op.then if ev(op.cond, env) else op.orelse, env, on_leaf)
            elif isinstance(op, (ir.Local, ir.Set)):
                env[op.name] = ev(op.value, env)
            else:
                on_leaf(op, env)

    def pe(r, env):
        return env["rank"] if r.rank is None else ev(r.rank, env)

    def length(op, env):
        return ev(op.dst.length, env)

    def do_move(op, env, engine):
        n = length(op, env)
        d, sr = op.dst, op.src
        if isinstance(op, ir.Copy):
            log.append(f"C {engine} {ev(d.lo, env)} {pe(d, env)} {ev(sr.lo, env)} {pe(sr, env)} {n}")
        elif isinstance(op, ir.Accumulate):
            log.append(f"A {ev(d.lo, env)} {pe(d, env)} {ev(sr.lo, env)} {pe(sr, env)} {n}")
        else:
            count = env["world"] if op.count is None else ev(op.count, env)
            skip = env["rank"] if op.count is None else (ev(op.skip, env) if op.skip is not None else None)
            folded = False
            if n > 0:
                for v in range(count):
                    if op.domain is ir.Domain.PEERS and v == skip:
                        continue
                    log.append(f"F {ev(sr.lo, env)} {ev(sr.rank, {**env, op.var: v})} {n}")
                    folded = True
                if folded:
                    log.append(f"T {ev(d.lo, env)} {env['rank']} {n}")

    def do_top(op, env):
        if isinstance(op, ir.Barrier):
            stamp = epoch + ev(op.seq, env)
            if op.team is None:
                log.append(f"B {stamp}")
            else:
                log.append(f"TB {stamp} {ev(op.team.base, env)} {ev(op.team.step, env)} "
                           f"{ev(op.team.size, env)}")
        elif isinstance(op, ir.Stage):
            total = []
            walk(op.body, env, lambda m, e: total.append(length(m, e)))
            log.append(f"P {sum(total)}")
            walk(op.body, env, lambda m, e: do_move(m, e, 0 if op.engine is ir.Engine.AIV else 1))
            log.append("E")
        elif isinstance(op, ir.Signal):
            log.append(f"S {ev(bases[op.flag], env) + ev(op.index, env)} "
                       f"{epoch + ev(seqs[op.flag], env) + ev(op.round, env)} {ev(op.rank, env)}")
        else:
            log.append(f"W {ev(bases[op.flag], env) + ev(op.index, env)} "
                       f"{epoch + ev(seqs[op.flag], env) + ev(op.round, env)}")

    # the ranks' agreement (strata::Agree) comes first, at the first stamp; it takes the place of
    # a world barrier that begins the kernel (codegen.emit._agreement)
    log.append(f"G {epoch}")
    body = s.body
    if body and isinstance(body[0], ir.Barrier) and body[0].team is None:
        body = body[1:]
    walk(body, env0, do_top)
    return log


# ---- what the kernel does, by g++ ----

HEADER = r"""
#include <cstdint>
#include <cstdio>
#define __aicore__
#define __gm__
#define GM_ADDR uint8_t*
#define STRATA_LINE(n) ((void)0)
static int64_t g_rank = 0, g_world = 1;
static float* g_x = nullptr;
inline int64_t aclshmem_my_pe() { return g_rank; }
inline int64_t aclshmem_n_pes() { return g_world; }
namespace AscendC {
struct TPipe {};
inline int64_t GetBlockIdx() { return 0; }
inline int64_t GetBlockNum() { return 1; }   // one core: it takes every trip of a shared loop
template <bool B> inline void SyncAll() {}
}
namespace strata {
enum class Red { kSum, kMax, kMin };
enum class Via { kAiv, kSdma, kAuto };
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
struct Team { int64_t size = 1, rank = 0, base = 0, step = 1; };
inline long long L(int64_t v) { return static_cast<long long>(v); }
struct Ref { float* p; int64_t pe; };
inline Ref At(float* base, int64_t off, int64_t pe) { return Ref{base + off, pe}; }
class Partition {
 public:
  Partition(int64_t total, int64_t) { std::printf("P %lld\n", L(total)); }
  bool Take(int64_t count, int64_t& off, int64_t& len) { off = 0; len = count; return true; }
};
template <typename T>
struct Mover {
  void Init(AscendC::TPipe*, uint32_t, uint32_t, uint32_t, uint32_t) {}
  int64_t Tile() const { return int64_t{1} << 40; }
  void Copy(Via via, T* dst, int64_t dpe, T* src, int64_t spe, int64_t len, int64_t, int64_t) {
    std::printf("C %d %lld %lld %lld %lld %lld\n", via == Via::kSdma, L(dst - g_x), L(dpe), L(src - g_x),
                L(spe), L(len));
  }
  template <Red OP>
  void AccumulateInto(T* dst, int64_t dpe, T* src, int64_t spe, int64_t len) {
    std::printf("A %lld %lld %lld %lld %lld\n", L(dst - g_x), L(dpe), L(src - g_x), L(spe), L(len));
  }
  template <Red OP>
  void Fold(Ref src, uint32_t m, bool) { std::printf("F %lld %lld %lld\n", L(src.p - g_x), L(src.pe), L(m)); }
  void Store(Ref dst, uint32_t m) { std::printf("T %lld %lld %lld\n", L(dst.p - g_x), L(dst.pe), L(m)); }
};
struct Ranks {};
template <typename T>
inline bool Agree(Mover<T>&, int32_t*, int32_t epoch, const Ranks&) { std::printf("G %d\n", epoch); return true; }
template <typename T> inline void EndStage(Mover<T>&) { std::printf("E\n"); }
template <typename T> inline void PostStage(Mover<T>&) { std::printf("E\n"); }
template <typename T> inline void Await(Mover<T>&) {}
inline int64_t SyncSlot(int32_t*, int64_t i) { return i; }
inline void Signal(int64_t slot, int32_t stamp, int64_t pe) { std::printf("S %lld %d %lld\n", L(slot), stamp, L(pe)); }
inline void WaitFlag(int64_t slot, int32_t stamp) { std::printf("W %lld %d\n", L(slot), stamp); }
inline void Barrier(int32_t*, int32_t stamp) { std::printf("B %d\n", stamp); }
inline void TeamBarrier(int32_t*, int32_t stamp, int64_t base, int64_t step, int64_t size) {
  std::printf("TB %d %lld %lld %lld\n", stamp, L(base), L(step), L(size));
}
inline void TeamBarrier(int32_t*, int32_t stamp, const Team& t) {
  std::printf("TB %d %lld %lld %lld\n", stamp, L(t.base), L(t.step), L(t.size));
}
"""


def _device_helpers() -> str:
    """strata::Mod, strata::Log2, strata::BlockTeam, strata::StrideTeam and strata::GroupTeam as
    the device library defines them."""
    text = (ROOT / "runtime" / "device" / "strata_device.h").read_text()
    found = re.findall(r"__aicore__ inline int64_t (?:Mod|Log2)\(.*?\n\}\n", text, re.S)
    found += re.findall(r"__aicore__ inline Team (?:Block|Stride|Group)Team\(.*?\}\n", text, re.S)
    assert len(found) == 5
    return "".join(found).replace("__aicore__ ", "") + "}\n"


def _process(s: ir.Schedule) -> str:
    """The kernel's class (and helpers) as generated: its anonymous namespace."""
    text = codegen.generate(s).files["kernel.cpp"]
    start, end = text.index("namespace {\n"), text.index("}  // namespace\n")
    return text[start:end + len("}  // namespace\n")]


def run_cases(tmp_path: Path, schedules: list[ir.Schedule]) -> list[list[list[str]]]:
    """Each schedule's log at each env, from g++."""
    parts = [HEADER, _device_helpers()]
    calls = []
    for i, s in enumerate(schedules):
        parts.append(f"namespace c{i} {{\n{_process(s)}}}\n")
        cls = codegen.abi.kernel_class(s)
        for j, env in enumerate(ENVS):
            calls.append(f'  std::printf("# {i} {j}\\n"); g_rank = {env["rank"]}; g_world = {env["world"]};\n'
                         f'  {{ c{i}::{cls}<float, strata::Red::kSum> k; k.Init(sync, {env["epoch"]}, x, '
                         f'{env["n"]}); k.Process(); }}\n')
    parts.append("static float g_buf[1 << 22];\nint main() {\n  g_x = g_buf;\n"
                 "  static int32_t s[1];\n  uint8_t* sync = reinterpret_cast<uint8_t*>(s);\n"
                 "  uint8_t* x = reinterpret_cast<uint8_t*>(g_x);\n" + "".join(calls) + "  return 0;\n}\n")
    src = tmp_path / "positions.cpp"
    src.write_text("".join(parts))
    exe = tmp_path / "positions"
    build = subprocess.run(["g++", "-std=c++17", "-O0", "-w", "-fsanitize=undefined",
                            "-fno-sanitize-recover=undefined",
                            str(src), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[:4000]
    try:
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the cases' kernels did not finish in 30 s: some loop runs past its bound")
    assert run.returncode == 0, run.stderr[:4000]
    out: list[list[list[str]]] = [[[] for _ in ENVS] for _ in schedules]
    cur = None
    for line in run.stdout.splitlines():
        if line.startswith("# "):
            i, j = map(int, line[2:].split())
            cur = out[i][j]
        else:
            cur.append(line)
    return out


def _check(tmp_path, schedules):
    got = run_cases(tmp_path, schedules)
    for i, s in enumerate(schedules):
        for j, env in enumerate(ENVS):
            want = expected(s, env)
            assert got[i][j] == want, (
                f"case {i} at {env}:\n{dump(s)}\n{_process(s)}\n"
                f"first difference at event {next((k for k, (a, b) in enumerate(zip(got[i][j], want)) if a != b), min(len(want), len(got[i][j])))}")


def draw_cases(count: int, batch: int = 0) -> list[ir.Schedule]:
    """count random schedules, one hypothesis example each (deterministic: seeded by batch)."""
    found: list[ir.Schedule] = []

    @seed(batch)
    @settings(max_examples=count, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case(0))
    def collect(s):
        found.append(dataclasses.replace(s, name=f"case{len(found)}"))

    collect()
    return found


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@needs_gxx
def test_every_position_prints_the_ir_value(tmp_path):
    """40 random bodies, one translation unit. (Hypothesis draws the bodies; the g++ build is one
    for all of them, so a failure names its case, with its IR and kernel, instead of shrinking.)"""
    cases = draw_cases(40)
    assert len(cases) >= 35
    _check(tmp_path, cases)


@needs_gxx
@pytest.mark.slow
def test_every_position_prints_the_ir_value_long(tmp_path):
    """300 more bodies, in three units."""
    for batch in range(1, 4):
        _check(tmp_path, draw_cases(100, batch))
