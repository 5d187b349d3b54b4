"""The samples the verifier derives from a schedule (stratac/verify/samples.py), on small programs
and conditions, against sample sets worked out by hand from the rules of dsl/README.md ("What
`check` proves")."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratac import ir, verify
from stratac.diagnostics import Source
from stratac.ir.passes import SOCS
from stratac.lang import frontend
from stratac.verify import samples
from stratac.verify.routing import expert_ids

ROOT = Path(__file__).resolve().parents[2]
B, V, C = ir.BinKind, ir.Var, ir.Const


def one(text: str) -> ir.Schedule:
    s, = frontend.schedules(Source("t.strata", text))
    return s


def example(name: str) -> list[ir.Schedule]:
    return frontend.schedules(frontend.load_source(ROOT / "examples" / name))


# ---- the base sizes ----

def test_size_pool():
    assert samples.size_pool(1) == [1, 4, 5, 7]
    assert samples.size_pool(4) == [1, 7, 8, 13]        # 8: an even size on an even world too
    assert samples.size_pool(16) == [1, 19, 20, 37]
    assert samples.size_pool(17) == [1, 20, 21]          # above world 16: no 2 world + 5
    assert samples.size_pool(2, symbols=6) == [1, 5, 6, 9, 13, 17]   # 3w + 7, 4w + 9 for more symbols


def test_size_symbols_are_independent():
    s = one("schedule s(x: sym T[n], y: sym T[m]) implements allreduce(x, sum) {}")
    assert s.sizes == ("m", "n")
    got = samples.base_sizes(s, 2)
    assert got == [{"m": 1, "n": 5}, {"m": 5, "n": 6}, {"m": 6, "n": 9}, {"m": 9, "n": 1}]
    assert all(x["m"] != x["n"] for x in got)
    assert any(x["m"] < x["n"] for x in got) and any(x["m"] > x["n"] for x in got)
    # no relation n = m + c or n = k m holds across the samples
    assert len({x["n"] - x["m"] for x in got}) > 1 and len({x["n"] / x["m"] for x in got}) > 1


def test_no_size_symbols():
    s = one("schedule s(x: sym f32[world]) implements allreduce(x, sum) {}")
    assert samples.base_sizes(s, 3) == [{}]
    assert verify.default_samples(s, 3) == [{}]


# ---- both sides of a condition ----

@pytest.mark.parametrize("cond, world, fixed, want", [
    (ir.Bin(B.GT, V("n"), C(4)), 4, {}, {3, 4, 5, 6}),            # changes between 4 and 5
    (ir.Bin(B.GE, V("n"), C(4)), 4, {}, {2, 3, 4, 5}),            # between 3 and 4
    (ir.Bin(B.EQ, V("n"), C(4)), 4, {}, {2, 3, 4, 5, 6}),         # between 3 and 4, 4 and 5
    (ir.Bin(B.NE, V("n"), C(4)), 4, {}, {2, 3, 4, 5, 6}),
    (ir.Bin(B.LT, C(4), V("n")), 4, {}, {3, 4, 5, 6}),
    (ir.Bin(B.GT, ir.Bin(B.MUL, C(2), V("n")), C(9)), 4, {}, {3, 4, 5, 6}),   # 2n > 9: from 5 on
    (ir.Bin(B.GT, ir.Bin(B.ADD, V("n"), V("world")), ir.Bin(B.MUL, C(2), V("world"))), 4, {},
     {3, 4, 5, 6}),                                               # n > world
    (ir.Bin(B.LT, V("n"), C(65536)), 4, {}, {65534, 65535, 65536, 65537}),
    # not linear: scanned, the first two changes (0 -> 1 and 1 -> 2)
    (ir.Bin(B.EQ, ir.Bin(B.MOD, V("n"), C(2)), C(0)), 4, {}, {0, 1, 2, 3}),
    # n / 4 > 100 from n = 404 on
    (ir.Bin(B.GT, ir.Bin(B.DIV, V("n"), V("world")), C(100)), 4, {}, {402, 403, 404, 405}),
    # another size symbol is held at its value in the middle base sample
    (ir.Bin(B.GT, V("n"), V("m")), 4, {"m": 6}, {5, 6, 7, 8}),
    # rank (or a loop variable) takes 0, 1, world / 2, world - 1: rank < n changes at rank + 1
    (ir.Bin(B.LT, V("rank"), V("n")), 4, {}, {0, 1, 2, 3, 4, 5}),
    (ir.Bin(B.LT, V("rank"), V("n")), 40, {}, {0, 1, 2, 3, 19, 20, 21, 22, 38, 39, 40, 41}),
    (ir.Bin(B.GT, V("world"), V("n")), 4, {}, {2, 3, 4, 5}),
])
def test_boundaries(cond, world, fixed, want):
    assert samples.boundaries(cond, "n", world, fixed) == want


def test_boundaries_of_a_rank_parameter_stay_ranks():
    root_is_1 = ir.Bin(B.EQ, V("root"), C(1))
    assert samples.boundaries(root_is_1, "root", 40, {}, lo=0, hi=39) == {0, 1, 2, 3}
    last = ir.Bin(B.EQ, V("root"), ir.Bin(B.SUB, V("world"), C(1)))
    assert samples.boundaries(last, "root", 40, {}, lo=0, hi=39) == {37, 38, 39}


def test_boundaries_survive_a_division_by_zero():
    cond = ir.Bin(B.GT, ir.Bin(B.DIV, V("n"), ir.Bin(B.SUB, V("world"), C(1))), C(2))
    assert samples.boundaries(cond, "n", 1, {}) == set()        # world 1: n / 0 everywhere
    assert samples.boundaries(cond, "n", 3, {}) == {4, 5, 6, 7}  # n / 2 > 2 from n = 6 on


# ---- the trip counts of a step loop ----

def _loop(lo: ir.IExpr, hi: ir.IExpr) -> ir.Loop:
    return ir.Loop("c", ir.Domain.RANGE, (), None, lo, hi)


@pytest.mark.parametrize("lo, hi, world, want", [
    # 1 + n / 4096: one chunk up to 4095, two from 4096, three from 8192
    (C(0), ir.Bin(B.ADD, C(1), ir.Bin(B.DIV, V("n"), C(4096))), 4,
     {4095, 4096, 4097, 8191, 8192, 8193}),
    # n / 4096: none below 4096, then one, two (8192) and three (12288)
    (C(0), ir.Bin(B.DIV, V("n"), C(4096)), 4,
     {4095, 4096, 4097, 8191, 8192, 8193, 12287, 12288, 12289}),
    # 1 .. n: n - 1 trips, one from n = 2, two from 3, three from 4
    (C(1), V("n"), 4, {1, 2, 3, 4, 5}),
    # (n + world - 1) / world at world 4: one trip from n = 1, two from 5, three from 9
    (C(0), ir.Bin(B.DIV, ir.Bin(B.ADD, V("n"), ir.Bin(B.SUB, V("world"), C(1))), V("world")), 4,
     {0, 1, 2, 4, 5, 6, 8, 9, 10}),
    # a bound that falls as n grows: 0 .. 3 - n has 3 trips at n = 0, 2 at 1, 1 at 2, none from 3;
    # each change between v - 1 and v adds v - 1, v and v + 1
    (C(0), ir.Bin(B.SUB, C(3), V("n")), 4, {0, 1, 2, 3, 4}),
])
def test_trip_changes(lo, hi, world, want):
    assert samples.trip_changes(_loop(lo, hi), "n", world, {}) == want


def test_samples_of_a_chunk_loop():
    s = one("""schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  barrier
  for c in 0 .. 1 + n / 4096 {
    on sdma: for p in ranks: blk[rank][c:c + 1]@p = x[c:c + 1]
  }
  barrier
}""")
    assert [lp.head for lp in samples.size_loops(s)] == ["c in 0 .. 1 + (n / 4096)"]
    # base 1, 5, 6, 9 at world 2, then one chunk's last size and 2 and 3 chunks' first two
    assert verify.default_samples(s, 2) == [{"n": n} for n in (1, 5, 6, 9, 4095, 4096, 4097, 8191,
                                                                8192, 8193)]


def test_conditions_are_collected_everywhere_once():
    s = one("""schedule s(x: sym T[n], root: rank) implements broadcast(x, root) {
  if n > 4 { on aiv: for p in peers: if p != root: x[0:0] = x[0:0] }
  on aiv { if root == 1: x[0:0] = x[0:0] }
  if n > 4: on aiv: x[0:0] = x[0:0]
}""")
    assert [str(c) for c in samples.conditions(s)] == ["(n > 4)", "(p != root)", "(root == 1)"]


# ---- default samples of whole schedules ----

BRANCH = """schedule s(x: sym T[n], op: redop) implements allreduce(x, op) {{
  part = split(x, world)
  barrier
  on aiv: part[rank] = op(part[rank]@p for p in ranks)
  if {cond}: on sdma: for p in peers: part[rank]@p = part[rank]
  else: on aiv: for p in peers: part[rank]@p = part[rank]
  barrier
}}"""


def test_samples_of_a_size_branch():
    s = one(BRANCH.format(cond="n > 4"))
    # base 1, 5, 6, 9; then 3..6 around the condition (5 and 6 were there already)
    assert verify.default_samples(s, 2) == [{"n": n} for n in (1, 5, 6, 9, 3, 4)]
    s = one(BRANCH.format(cond="n % 2 == 0"))
    assert verify.default_samples(s, 4) == [{"n": n} for n in (1, 7, 8, 13, 0, 2, 3)]
    assert all(verify.verify(s, 4, x).ok for x in verify.default_samples(s, 4))


def test_samples_of_a_comparison_between_two_sizes():
    s = one("""schedule s(x: sym T[n], y: sym T[m]) implements allreduce(x, sum) {
  if n > m: on aiv: y[0:0] = y[0:0]
}""")
    got = [(x["m"], x["n"]) for x in verify.default_samples(s, 2)]
    # base (1, 5) (5, 6) (6, 9) (9, 1); the middle one (5, 6) is the context: m around n = 6 gives
    # m = 4, 6, 7 (5 is there), n around m = 5 gives n = 4, 5, 7; equal sizes among them
    assert got == [(1, 5), (5, 6), (6, 9), (9, 1), (4, 6), (6, 6), (7, 6), (5, 4), (5, 5), (5, 7)]


def test_every_root_up_to_world_16():
    bc, = example("broadcast.strata")
    got = [(x["n"], x["root"]) for x in verify.default_samples(bc, 3)]
    assert got == [(n, r) for n in (1, 6, 7, 11) for r in (0, 1, 2)]
    assert {x["root"] for x in verify.default_samples(bc, 16)} == set(range(16))


def test_roots_above_world_16():
    bc, = example("broadcast.strata")
    # `rank == root` and `p != root` mention rank and a loop variable: both arms are taken within
    # every instance, so they add no roots
    got = [(x["n"], x["root"]) for x in verify.default_samples(bc, 17)]
    assert got == [(n, r) for n in (1, 20, 21) for r in (0, 8, 16)]
    branch = """schedule s(x: sym T[n], root: rank) implements broadcast(x, root) {{
  part = split(x, world)
  barrier
  if rank == root: on sdma: for p in peers: part[p]@p = part[p]
  barrier
  if {cond} {{ on sdma: for p in peers: if p != root: part[rank]@p = part[rank] }}
  else {{ on aiv: for p in peers: if p != root: part[rank]@p = part[rank] }}
  barrier
}}"""
    for cond, world, roots in [("root < world / 2", 100, [0, 48, 49, 50, 51, 99]),
                               ("root == 1", 40, [0, 1, 2, 3, 20, 39]),
                               ("root % 2 == 1", 40, [0, 1, 2, 3, 20, 39])]:
        s = one(branch.format(cond=cond))
        assert samples.rank_samples(s, world) == [{"root": r} for r in roots], cond


def test_roots_above_world_16_without_size_symbols():
    # regression: the context of the root's conditions was the second base sample, which a
    # schedule without size symbols does not have
    s = one("""schedule s(x: sym f32[world], root: rank) implements broadcast(x, root) {
  if root == 3: on aiv: x[0:0] = x[0:0]
}""")
    assert verify.default_samples(s, 20) == [{"root": r} for r in (0, 1, 2, 3, 4, 5, 10, 19)]


def test_two_rank_parameters():
    s = one("""schedule s(x: sym T[n], a: rank, b: rank) implements broadcast(x, a) {
  if b == a: on aiv: x[0:0] = x[0:0]
}""")
    assert samples.rank_samples(s, 3) == [{"a": 0, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 0},
                                          {"a": 0, "b": 0}, {"a": 1, "b": 1}, {"a": 2, "b": 2}]


def test_samples_are_dropped_over_budget_but_never_all(monkeypatch):
    s = one(BRANCH.format(cond="n < 65536"))
    assert [x["n"] for x in verify.default_samples(s, 4)] == [1, 7, 8, 13, 65534, 65535, 65536, 65537]
    # x holds n elements on each of 4 ranks: a budget of 4 * 13 keeps the base samples only
    monkeypatch.setattr(samples, "SIM_ELEMENT_BUDGET", 4 * 13)
    assert [x["n"] for x in verify.default_samples(s, 4)] == [1, 7, 8, 13]


# ---- MoE ----

def _ids_need(routing, world, tokens, topk, experts, capacity=None):
    """The most entries one rank routes to one expert, counted here from the sample routing."""
    worst = 0
    for r in range(world):
        ids = expert_ids(routing, r, tokens, topk, experts, capacity=capacity)
        for e in range(experts):
            worst = max(worst, int((ids == e).sum()))
    return worst


def test_moe_capacity_is_never_the_token_count():
    dispatch, combine = example("moe_decode.strata")
    for world in (1, 2, 3, 8):
        got = verify.default_samples(dispatch, world)
        assert [(x["tokens"], x.routing) for x in got] == list(samples.MOE_SAMPLES) + [(5, "full")]
        full = got.pop()
        assert full["capacity"] == -(-5 * 2 // (2 * world))    # the least that holds 10 entries
        # and the full routing fills it: some (expert, source) pair uses every slot
        assert _ids_need("full", world, 5, 2, 2 * world, full["capacity"]) == full["capacity"]
        for x in got:
            need = _ids_need(x.routing, world, x["tokens"], x["topk"], x["experts"])
            assert x["capacity"] != x["tokens"] and x["capacity"] >= need, (world, dict(x), need)
            assert x["capacity"] == (need if 0 < need < x["tokens"] else x["tokens"] + 2)
        assert verify.default_samples(combine, world) == got + [full]
    # by hand: one token, or every token to expert 0 (single), needs as many slots as tokens
    by = {(x["tokens"], x.routing): x["capacity"] for x in verify.default_samples(dispatch, 4)}
    assert by[(1, "uniform")] == 3 and by[(5, "single")] == 7
    assert by[(48, "uniform")] < 48       # 96 entries over 8 experts: a tight capacity, below tokens


def test_moe_tokens_reach_every_core():
    assert samples.CORE_TOKENS >= max(SOCS.values())
    dispatch, _ = example("moe_prefill.strata")
    assert samples.CORE_TOKENS in [x["tokens"] for x in verify.default_samples(dispatch, 8)]


PREFILL_COMBINE = """schedule c(win: sym T[world * tokens * topk, hidden], ids: i32[tokens, topk],
                             weights: f32[tokens, topk], counts: sym i32[world, experts],
                             y: T[tokens, hidden])
    implements moe_combine(win, ids, weights, counts -> y) {{
  scratch offs: i32[experts]
  on aiv: offs = exscan(counts)
  barrier
  if {cond}: on aiv: y = gather(win, ids, weights, offs)
  else: on aiv: y = gather(win, ids, weights, offs)
  barrier
}}"""


def test_moe_samples_on_both_sides_of_a_token_condition():
    s = one(PREFILL_COMBINE.format(cond="tokens > 128"))
    got = verify.default_samples(s, 2)
    assert [(x["tokens"], x.routing) for x in got] == list(samples.MOE_SAMPLES) + [
        (t, r) for t in (127, 128, 129, 130) for r in ("uniform", "skewed", "single", "empty", "sparse")]
    assert all(x["experts"] == 4 and x["topk"] == 2 and x["hidden"] == 3 for x in got)


def test_moe_expert_counts_stay_multiples_of_the_world():
    s = one(PREFILL_COMBINE.format(cond="experts > 6"))
    got = verify.default_samples(s, 2)
    # 4..8 around the condition, rounded to multiples of 2 on each side: 4 (already sampled), 6, 8
    assert [(x["tokens"], x["experts"]) for x in got[len(samples.MOE_SAMPLES):]] == [(5, 6), (5, 8)]


def test_moe_large_worlds_keep_the_one_token_sample():
    dispatch, _ = example("moe_prefill.strata")
    got = verify.default_samples(dispatch, 384)
    assert [(x["tokens"], x.routing) for x in got] == [(1, "uniform")]
    assert got[0]["experts"] == 384



@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_int8_window_samples_take_whole_32_byte_rows(world):
    """A call refuses an int8 `place` window whose rows are not whole 32-byte blocks (issue 23,
    item 6), so the samples of such a dispatch check hidden = 32 where others check 3; a float
    window and the combine (which gathers, placing nothing) keep the default of 3."""
    def hiddens(path, name):
        for s in frontend.schedules(Source(str(path), path.read_text())):
            if s.name == name:
                return {x["hidden"] for x in samples.default_samples(s, world)}
        raise AssertionError(name)
    int8 = ROOT / "examples" / "moe_prefill_int8.strata"
    assert hiddens(int8, "moe_prefill_int8_dispatch") == {32}
    assert hiddens(int8, "moe_prefill_int8_combine") == {samples.MOE_HIDDEN} == {3}
    assert hiddens(ROOT / "examples" / "moe_prefill.strata", "moe_prefill_dispatch") == {3}
