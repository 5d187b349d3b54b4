"""The schedule IR: lowering results, the `ir.dump` text of the examples (goldens), `ir.simplify`
and `ir.split_part`.

The goldens were checked by reading them: `part = split(x, world)` gives part `rank` the offset
rank * (n / world) + min(rank, n % world) and the length n / world + (rank < n % world) (the first
n % world parts get one element more); for `out: T[n * world]` the split simplifies to the block
rank * n of length n. Barriers show seq=0 because the epoch pass has not run.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratac import ir
from stratac.diagnostics import Source
from stratac.ir import Bin, BinKind, Const, Var, instantiate, passes
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]

PART = ("x[((rank * (n / world)) + min(rank, (n % world))) "
        "+: ((n / world) + (rank < (n % world)))]")

ALLREDUCE_GOLDEN = f"""\
schedule allreduce_twoshot(x: sym T[n], op: redop) implements allreduce(x, op)
  sizes n
  stage 1 on aiv:  # line 12
    {PART} = op({PART}@p for p in ranks)  # line 12
  stage 2 on sdma:  # line 13
    for p in peers:  # line 13
      {PART}@p = {PART}  # line 13
  barrier seq=0  # line 14
"""

ALLGATHER_GOLDEN = """\
schedule allgather_push(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out)
  sizes n
  stage 1 on sdma:  # line 10
    for p in ranks:  # line 10
      out[(rank * n) +: n]@p = x[0 +: n]  # line 10
  barrier seq=0  # line 11
"""

FLAGS_SRC = """\
schedule ring(x: sym f32[n], y: f32[2 * n]) implements allreduce(x, min) {
  flag ready[world]
  flag done[world + 1]
  for p in peers: signal ready[rank]@p
  wait ready[(rank + world - 1) % world]
  on aiv: x = min(x@p for p in peers)
  on auto: y[n:2 * n] = x[-0:n]
  barrier
}
"""

FLAGS_GOLDEN = """\
schedule ring(x: sym f32[n], y: f32[2 * n]) implements allreduce(x, min)
  sizes n
  flag ready[world] seq=0
  flag done[(world + 1)] seq=0
  for p in peers:  # line 4
    signal ready[rank]@p  # line 4
  wait ready[(((rank + world) - 1) % world)]  # line 5
  stage 1 on aiv:  # line 6
    x[0 +: n] = min(x[0 +: n]@p for p in peers)  # line 6
  stage 2 on auto:  # line 7
    y[n +: ((2 * n) - n)] = x[(0 - 0) +: (n - (0 - 0))]  # line 7
  barrier seq=0  # line 8
"""


def lower_file(name: str) -> ir.Schedule:
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / name))
    return s


def test_dump_allreduce_twoshot():
    assert ir.dump(lower_file("allreduce_twoshot.strata")) == ALLREDUCE_GOLDEN


def test_dump_allgather_push():
    assert ir.dump(lower_file("allgather_push.strata")) == ALLGATHER_GOLDEN


def test_dump_flags_ranges_and_fixed_types():
    s, = frontend.schedules(Source("ring.strata", FLAGS_SRC))
    assert ir.dump(s) == FLAGS_GOLDEN


def test_lowered_structure_of_allreduce():
    s = lower_file("allreduce_twoshot.strata")
    assert s.name == "allreduce_twoshot" and s.sizes == ("n",) and s.flags == ()
    x, = s.params
    assert (x.name, x.dtype, x.typevar, x.symmetric, x.size) == ("x", None, "T", True, Var("n"))
    assert s.typevars == ("T",)
    c = s.contract
    assert (c.kind, c.inputs, c.outputs, c.op) == (ir.ContractKind.ALLREDUCE, ("x",), ("x",),
                                                   ir.OpParam("op"))
    assert [(x.name, x.kind) for x in s.scalars] == [("op", ir.ScalarKind.REDOP)]
    st1, st2, b1 = s.body
    assert isinstance(b1, ir.Barrier)
    assert (st1.engine, st1.index, st2.engine, st2.index) == (ir.Engine.AIV, 1, ir.Engine.SDMA, 2)
    red, = st1.body
    assert isinstance(red, ir.Reduce) and red.var == "p" and red.domain is ir.Domain.RANKS
    assert red.op == ir.OpParam("op")
    assert red.src.rank == Var("p") and red.dst.rank is None and red.src.lo == red.dst.lo
    loop, = st2.body
    assert isinstance(loop, ir.Loop) and loop.domain is ir.Domain.PEERS
    copy, = loop.body
    assert isinstance(copy, ir.Copy) and copy.dst.rank == Var("p") and copy.src.rank is None
    assert (red.span.line, red.span.col, copy.span.line) == (12, 11, 13)


def test_lowering_keeps_every_schedule_of_a_file_in_order():
    ss = frontend.schedules(frontend.load_source(ROOT / "tests/verify/corpus/good_pull_and_max.strata"))
    assert [s.name for s in ss] == ["allgather_pull", "allreduce_max"]
    assert ss[1].params[0].dtype is ir.DType.F16 and ss[1].typevars == ()


# ---- simplify ----

n, w, r = Var("n"), Var("world"), Var("rank")


def B(kind, a, b):
    return Bin(kind, a, b)


ADD, SUB, MUL, DIV, MOD, MIN, LT = (BinKind.ADD, BinKind.SUB, BinKind.MUL, BinKind.DIV,
                                    BinKind.MOD, BinKind.MIN, BinKind.LT)


@pytest.mark.parametrize("before, after", [
    # constant folding
    (B(ADD, Const(2), Const(3)), Const(5)),
    (B(SUB, Const(2), Const(3)), Const(-1)),
    (B(DIV, Const(7), Const(2)), Const(3)),
    (B(MOD, Const(7), Const(2)), Const(1)),
    (B(MIN, Const(7), Const(2)), Const(2)),
    (B(LT, Const(2), Const(7)), Const(1)),
    (B(LT, Const(7), Const(2)), Const(0)),
    (B(MUL, B(ADD, Const(1), Const(1)), n), B(MUL, Const(2), n)),
    # folding uses the documented floor semantics (the device would truncate; see the verifier)
    (B(MOD, Const(-1), Const(4)), Const(3)),
    (B(DIV, Const(-1), Const(4)), Const(-1)),
    # a constant division by zero is left for instantiation to report
    (B(DIV, Const(1), Const(0)), B(DIV, Const(1), Const(0))),
    (B(MOD, n, Const(0)), B(MOD, n, Const(0))),
    # identities of 0 and 1
    (B(ADD, n, Const(0)), n),
    (B(ADD, Const(0), n), n),
    (B(SUB, n, Const(0)), n),
    (B(MUL, n, Const(0)), Const(0)),
    (B(MUL, Const(0), n), Const(0)),
    (B(MUL, n, Const(1)), n),
    (B(MUL, Const(1), n), n),
    (B(DIV, n, Const(1)), n),
    (B(MOD, n, Const(1)), Const(0)),
    # (a * b) / b and (a * b) % b
    (B(DIV, B(MUL, n, w), w), n),
    (B(DIV, B(MUL, n, w), n), w),
    (B(MOD, B(MUL, n, w), w), Const(0)),
    (B(MOD, B(MUL, n, w), n), Const(0)),
    # sizes, offsets and ranks are never negative: min(x, 0) = 0 and x < 0 = 0
    (B(MIN, r, Const(0)), Const(0)),
    (B(LT, r, Const(0)), Const(0)),
    # rewrites apply bottom-up, through the whole tree
    (B(ADD, B(MUL, r, Const(1)), B(SUB, n, Const(0))), B(ADD, r, n)),
    (B(ADD, B(MUL, r, B(DIV, B(MUL, n, w), w)), B(MIN, r, B(MOD, B(MUL, n, w), w))), B(MUL, r, n)),
    # cancellation, exact in integers: a range x[a:a + n] has length n
    (B(SUB, n, n), Const(0)),
    (B(SUB, B(ADD, B(MUL, r, n), n), B(MUL, r, n)), n),
    (B(SUB, B(ADD, r, n), n), r),
    # ... and a range x[a:b] (length b - a) ends at b
    (B(ADD, B(ADD, r, Const(1)), B(SUB, B(ADD, r, Const(2)), B(ADD, r, Const(1)))),
     B(ADD, r, Const(2))),
    (B(ADD, B(ADD, r, B(DIV, n, w)), B(SUB, w, B(ADD, r, B(DIV, n, w)))),
     B(ADD, B(ADD, r, B(DIV, n, w)), B(SUB, w, B(ADD, r, B(DIV, n, w))))),
    # ... but not of a term with / or %: it may divide by zero, which instantiation reports
    (B(SUB, B(DIV, n, w), B(DIV, n, w)), B(SUB, B(DIV, n, w), B(DIV, n, w))),
    (B(SUB, B(ADD, r, B(MOD, n, w)), B(MOD, n, w)), B(SUB, B(ADD, r, B(MOD, n, w)), B(MOD, n, w))),
    (B(SUB, B(ADD, B(MOD, n, w), r), r), B(MOD, n, w)),
    # no rule applies
    (B(SUB, n, r), B(SUB, n, r)),
    (B(SUB, B(ADD, r, n), w), B(SUB, B(ADD, r, n), w)),
    (B(DIV, n, w), B(DIV, n, w)),
    (B(MIN, Const(0), r), B(MIN, Const(0), r)),
    (n, n),
    (Const(4), Const(4)),
])
def test_simplify(before, after):
    assert ir.simplify(before) == after


def _exprs():
    leaves = st.sampled_from([Const(0), Const(1), Const(2), Const(3), Var("a"), Var("b")])
    return st.recursive(leaves, lambda sub: st.builds(Bin, st.sampled_from(list(BinKind)), sub, sub),
                        max_leaves=8)


def _eval_nonnegative(e, env):
    """e's value if every subterm is defined and non-negative (what the IR guarantees), else None."""
    if not isinstance(e, Bin):
        v = e.eval(env)
    else:
        a, b = _eval_nonnegative(e.lhs, env), _eval_nonnegative(e.rhs, env)
        if a is None or b is None:
            return None
        if e.kind in (BinKind.SHL, BinKind.SHR) and b >= 63:
            return None   # out of the kernel's int64 (the verifier refuses it)
        try:
            v = Bin(e.kind, Const(a), Const(b)).eval({})
        except (ZeroDivisionError, ValueError):   # ValueError: log2(0)
            return None
    return v if 0 <= v < 2**62 else None


@settings(max_examples=150, deadline=None)
@given(_exprs(), st.integers(0, 5), st.integers(0, 5))
def test_simplify_keeps_the_value_of_nonnegative_expressions(e, a, b):
    env = {"a": a, "b": b}
    want = _eval_nonnegative(e, env)
    if want is not None:
        assert ir.simplify(e).eval(env) == want


# ---- affine ----

@settings(max_examples=300, deadline=None)
@given(_exprs(), st.integers(0, 5))
def test_affine_is_the_expression_wherever_it_is_defined(e, b):
    """ir.affine(e, "a") = (B, A) means e = B + A * a for every a; it finds the form whenever `a`
    is reached through +, - and * alone, and only then."""
    form = ir.affine(e, "a")

    def plain(x):   # `a` reached through +, - and * alone
        if "a" not in x.names():
            return True
        if not isinstance(x, Bin):
            return isinstance(x, Var)
        if x.kind is BinKind.MUL and "a" in x.lhs.names() and "a" in x.rhs.names():
            return False
        return x.kind in (BinKind.ADD, BinKind.SUB, BinKind.MUL) and plain(x.lhs) and plain(x.rhs)

    assert (form is not None) == plain(e)
    if form is None:
        return
    for a in range(-3, 7):
        env = {"a": a, "b": b}
        try:
            want = e.eval(env)
        except (ZeroDivisionError, ValueError):
            continue
        assert form[0].eval(env) + form[1].eval(env) * a == want
        assert "a" not in form[0].names() | form[1].names()


@pytest.mark.parametrize("e, base, step", [
    (Var("p"), 0, 1),
    (Bin(BinKind.ADD, Bin(BinKind.MUL, Bin(BinKind.DIV, Var("rank"), Const(4)), Const(4)), Var("p")), 4, 1),
    (Bin(BinKind.ADD, Bin(BinKind.MOD, Var("rank"), Const(4)), Bin(BinKind.MUL, Var("p"), Const(4))), 1, 4),
    (Bin(BinKind.SUB, Var("rank"), Bin(BinKind.MUL, Const(2), Var("p"))), 5, -2),
])
def test_affine_reads_team_members(e, base, step):
    """A team's member i (`rank / T * T + i`, `rank % T + i * T`) and `rank - 2 p` at rank 5."""
    b, a = ir.affine(e, "p")
    assert (b.eval({"rank": 5}), a.eval({"rank": 5})) == (base, step)


@pytest.mark.parametrize("e", [Bin(BinKind.MOD, Bin(BinKind.ADD, Var("rank"), Var("p")), Var("world")),
                               Bin(BinKind.MUL, Var("p"), Var("p")),
                               Bin(BinKind.MIN, Var("p"), Const(3))])
def test_affine_refuses_what_is_not(e):
    assert ir.affine(e, "p") is None


# ---- split_part ----

def test_split_part_is_a_balanced_partition():
    total, parts, index = Var("total"), Var("parts"), Var("i")
    lo, length = ir.split_part(total, parts, index)
    for t, k in itertools.product(range(0, 23), range(1, 8)):
        regions = [(lo.eval({"total": t, "parts": k, "i": i}),
                    length.eval({"total": t, "parts": k, "i": i})) for i in range(k)]
        assert regions[0][0] == 0
        for (lo_a, len_a), (lo_b, _) in zip(regions, regions[1:]):
            assert lo_a + len_a == lo_b                       # contiguous
        assert regions[-1][0] + regions[-1][1] == t           # covers everything
        sizes = [ln for _, ln in regions]
        assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
        assert sizes.count(t // k + 1) == t % k               # the first t % k get one more


def test_split_part_of_an_exact_multiple_simplifies():
    lo, length = ir.split_part(B(MUL, n, w), w, r)
    assert (lo, length) == (B(MUL, r, n), n)
    lo, length = ir.split_part(n, Const(1), Const(0))
    assert (lo, length) == (Const(0), n)


MOE_DECODE_GOLDEN = """\
schedule moe_decode_dispatch(x: sym T[tokens, hidden], ids: i32[tokens, topk], counts: sym i32[world, experts], win: sym T[experts * capacity, hidden]) implements moe_dispatch(x, ids -> win, counts, capacity)
  sizes capacity, experts, hidden, tokens, topk
  scratch offs: i32[experts]
  flag ready[world] seq=1
  stage 1 on aiv [routing]:  # line 20
    counts[(rank * experts) +: experts] = histogram(ids)  # line 21
    offs[0 +: experts] = slots(capacity)  # line 22
  stage 2 on aiv [aiv-copy routing]:  # line 24
    for p in peers:  # line 25
      counts[(rank * experts) +: experts]@p = counts[(rank * experts) +: experts]  # line 25
    win[0 +: ((experts * capacity) * hidden)] = place(x, ids, offs)  # line 26
  for p in peers:  # line 28
    signal ready[rank]@p  # line 28
  for p in peers:  # line 29
    wait ready[p]  # line 29
  # 1 flag stamps per call
  # UB per core: 2 copy + 0 reduce tiles x 76672 B + 256 B scratch + 40960 B routing + 2048 B mask = 196608 B; 40 cores (Ascend910B3)
"""


def test_dump_moe_decode_dispatch_after_the_passes():
    """Routing constructs, 2-D shapes, the size symbols read off them, and the routing UB."""
    s = frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_decode.strata"))[0]
    assert ir.dump(passes.pipeline(s, passes.Options())) == MOE_DECODE_GOLDEN


def test_size_rules_read_symbols_off_shapes_in_order():
    s = frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_decode.strata"))[0]
    rules, unread = ir.size_rules(s.params, s.sizes)
    assert unread == []
    order = [(r.sym, r.param, r.dim) for r in rules]
    # capacity comes last: win's rows are experts * capacity, readable once experts is known
    assert order[-1] == ("capacity", "win", 0) and ("experts", "counts", 1) in order
    assert str(rules[-1].scale) == "experts"


# ---- the epoch pass: barrier stamps under ifs ----

STAMPS_SRC = """\
schedule stamps(x: sym T[n], root: rank) implements broadcast(x, root) {
  flag ready[world]
  barrier
  if world > 0 { barrier }
  if world > 2: barrier
  if rank == root { barrier } else { barrier }
  if rank == root {
    barrier
    barrier
  } else {
    barrier
  }
  if rank < 2 { barrier } else {
    barrier
    barrier
    barrier
  }
  if world > 1 {
    if rank == 0 { barrier } else { barrier }
    for p in peers: signal ready[rank]@p
  }
  barrier
}
"""

# Read by hand: a barrier's stamp is its place in the program, 1 + the places before it. The k-th
# barrier of either arm of an if takes one place, and the if the places of its longer arm, so the
# stamps are constants here whichever arms a rank takes. The flag comes after every place:
# 1 + 1 + 1 + 1 + 2 + 3 + 1 + 1 = 11.
STAMPS_GOLDEN = """\
schedule stamps(x: sym T[n], root: rank) implements broadcast(x, root)
  sizes n
  flag ready[world] seq=12
  barrier seq=1  # line 3
  if (world > 0):  # line 4
    barrier seq=2  # line 4
  if (world > 2):  # line 5
    barrier seq=3  # line 5
  if (rank == root):  # line 6
    barrier seq=4  # line 6
  else:
    barrier seq=4  # line 6
  if (rank == root):  # line 7
    barrier seq=5  # line 8
    barrier seq=6  # line 9
  else:
    barrier seq=5  # line 11
  if (rank < 2):  # line 13
    barrier seq=7  # line 13
  else:
    barrier seq=7  # line 14
    barrier seq=8  # line 15
    barrier seq=9  # line 16
  if (world > 1):  # line 18
    if (rank == 0):  # line 19
      barrier seq=10  # line 19
    else:
      barrier seq=10  # line 19
    for p in peers:  # line 20
      signal ready[rank]@p  # line 20
  barrier seq=11  # line 22
  # 12 flag stamps per call
"""


def test_epoch_pass_stamps_barriers_under_ifs():
    s, = frontend.schedules(Source("stamps.strata", STAMPS_SRC))
    assert ir.dump(passes.flag_epochs(s)) == STAMPS_GOLDEN


def _barrier_stamps(s: ir.Schedule, world: int, root: int) -> list[list[int]]:
    inst = instantiate.instantiate(s, world, {"n": 5, "root": root})
    return [[ev.barrier for ev in tl if ev.kind is instantiate.EventKind.BARRIER] for tl in inst.timelines]


@pytest.mark.parametrize("world", range(1, 7))
def test_every_barrier_stamp_is_the_place_the_walk_numbers(world):
    """Against instantiate's own walk of the IR before the passes, which numbers the barrier places
    as it takes the arms (an if skips to the end of its longer arm): after the passes every rank's
    stamps are those places, rising, within the barrier stamps a call reserves; the rank that takes
    the longer arms has 1, 2, 3, ... and the others skip the places of the arms they did not take."""
    s, = frontend.schedules(Source("stamps.strata", STAMPS_SRC))
    lowered = passes.pipeline(s, passes.Options())
    places = lowered.sync_ops - len(lowered.flags)
    for root in range(world):
        before, after = _barrier_stamps(s, world, root), _barrier_stamps(lowered, world, root)
        assert after == before
        assert all(stamps == sorted(set(stamps)) and stamps[-1] == places for stamps in after)
    if world >= 3:   # rank 2 (not root 0, not below 2) takes the else arms of lines 6, 7 and 13
        assert _barrier_stamps(lowered, world, 0)[2] == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11]


TEAMS_SRC = """\
schedule t(x: sym T[n]) implements allreduce(x, sum) {
  team node = block(2)
  team lane = across(node)
  barrier(node)
  on aiv: x = sum(x@p for p in node.ranks)
  on sdma: for p in lane.peers: x@p = x
  barrier(lane)
}
"""

TEAMS_GOLDEN = """\
schedule t(x: sym T[n]) implements allreduce(x, sum)
  sizes n
  team node = block(2)  # member i = ((rank / 2) * 2) + i, rank rank % 2 of 2
  team lane = stride(2)  # member i = (rank % 2) + (i * 2), rank rank / 2 of world / 2
  barrier(node) seq=0  # line 4
  stage 1 on aiv:  # line 5
    x[0 +: n] = sum(x[0 +: n]@(((rank / 2) * 2) + p) for p in 0 .. 2)  # line 5
  stage 2 on sdma:  # line 6
    for p in 0 .. world / 2:  # line 6
      if (p != (rank / 2)):  # line 6
        x[0 +: n]@((rank % 2) + (p * 2)) = x[0 +: n]  # line 6
  barrier(lane) seq=0  # line 7
"""


def test_dump_teams():
    """A team's forms are expressions of rank and world: node[i] = rank / 2 * 2 + i, a loop over
    lane.peers is a loop over the places with the running rank's place left out."""
    s, = frontend.schedules(Source("teams.strata", TEAMS_SRC))
    assert ir.dump(s) == TEAMS_GOLDEN


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_team_barriers_join_exactly_the_team(world):
    """Against the teams written out by hand: the node of rank r is {r - r % 2, r - r % 2 + 1},
    its lane every rank of the same parity; and the stamps after the passes are 1, 2 on every rank."""
    s, = frontend.schedules(Source("teams.strata", TEAMS_SRC))
    inst = instantiate.instantiate(s, world, {"n": 5})
    for r, tl in enumerate(inst.timelines):
        node, lane = [ev.members for ev in tl if ev.kind is instantiate.EventKind.BARRIER]
        assert node == (r - r % 2, r - r % 2 + 1)
        assert lane == tuple(q for q in range(world) if q % 2 == r % 2)
    lowered = passes.pipeline(s, passes.Options())
    stamps = _barrier_stamps(lowered, world, 0)
    assert all(st == [1, 2] for st in stamps)


ASYNC_SRC = """\
schedule fwd(x: sym f32[n], y: sym f32[n]) implements allreduce(x, sum) {
  on sdma async h: y@((rank + 1) % world) = x
  await h
}
"""


def test_dump_async_stage_and_await():
    s, = frontend.schedules(Source("fwd.strata", ASYNC_SRC))
    stage, done = s.body
    assert stage.handle == "h" and isinstance(done, ir.Await) and done.handle == "h"
    assert ir.dump(s).splitlines()[2:] == [
        "  stage 1 on sdma async h:  # line 2",
        "    y[0 +: n]@((rank + 1) % world) = x[0 +: n]  # line 2",
        "  await h  # line 3",
    ]


CALL_SRC = """\
schedule hop(x: sym T[n], op: redop) implements allreduce(x, op) {
  flag got[1]
  part = split(x, world)
  barrier
  on aiv: for p in peers: part[p]@p op= part[p]
  signal got[0]@((rank + 1) % world)
  wait got[0]
  barrier
}

schedule outer(x: sym f32[n], op: redop) implements allreduce(x, op) {
  team node = block(2)
  half = split(x, 2)
  call hop(half[1], op) on node
}
"""

# Read by hand: hop's rank is node.rank (rank % 2), its world node.size (2), its p a place of the
# node whose rank is node[p] = rank / 2 * 2 + p, its x the second half of x (offset n / 2 +
# min(1, n % 2), length n / 2 + (1 < n % 2)), split into 2 parts; its flag is c1_got, its barriers
# the node's; the lines of the inlined ops are hop's.
CALL_GOLDEN = """\
schedule outer(x: sym f32[n], op: redop) implements allreduce(x, op)
  sizes n
  team node = block(2)  # member i = ((rank / 2) * 2) + i, rank rank % 2 of 2
  flag c1_got[1] seq=0
  call hop(half[1], op) on node:  # line 14 inlined on the members of node, names c1_*
    barrier(node) seq=0  # line 4
    stage 1 on aiv:  # line 5
      for c1_p in 0 .. 2:  # line 5
        if (c1_p != (rank % 2)):  # line 5
          x[(((n / 2) + min(1, (n % 2))) + ((c1_p * (((n / 2) + (1 < (n % 2))) / 2)) + min(c1_p, (((n / 2) + (1 < (n % 2))) % 2)))) +: ((((n / 2) + (1 < (n % 2))) / 2) + (c1_p < (((n / 2) + (1 < (n % 2))) % 2)))]@(((rank / 2) * 2) + c1_p) op= x[(((n / 2) + min(1, (n % 2))) + ((c1_p * (((n / 2) + (1 < (n % 2))) / 2)) + min(c1_p, (((n / 2) + (1 < (n % 2))) % 2)))) +: ((((n / 2) + (1 < (n % 2))) / 2) + (c1_p < (((n / 2) + (1 < (n % 2))) % 2)))]  # line 5
    signal c1_got[0]@(((rank / 2) * 2) + (((rank % 2) + 1) % 2))  # line 6
    wait c1_got[0]  # line 7
    barrier(node) seq=0  # line 8
"""


def test_dump_call_inlined_on_a_team():
    _, outer = frontend.schedules(Source("calls.strata", CALL_SRC))
    assert ir.dump(outer) == CALL_GOLDEN
    assert [str(c) for c in outer.calls] == ["call hop(half[1], op) on node"]


@pytest.mark.parametrize("world", [2, 4, 6])
def test_call_on_a_team_reaches_its_members_in_the_region(world):
    """Against the node written out by hand ({r - r % 2, r - r % 2 + 1}) and the second half of
    x by hand (elements [3, 6) of n = 6; its part 0 is [3, 5), part 1 [5, 6)): the inlined barriers join the
    node, the signal goes to the other member, the accumulate writes the other member's part of
    the half only."""
    _, outer = frontend.schedules(Source("calls.strata", CALL_SRC))
    inst = instantiate.instantiate(outer, world, {"n": 6})
    for r, tl in enumerate(inst.timelines):
        node = (r - r % 2, r - r % 2 + 1)
        other = node[1 - r % 2]
        assert [ev.members for ev in tl if ev.kind is instantiate.EventKind.BARRIER] == [node, node]
        assert [s[:3] for ev in tl for s in ev.signals] == [(other, "c1_got", 0)]
        part = (3, 5) if other % 2 == 0 else (5, 6)   # 3 elements in 2 parts: 2, then 1
        assert [m.dst for ev in tl for m in ev.moves] == [(other, "x", *part)]
