"""The MoE pieces of the verifier: sample routings, the contract's reference layout, and the
routing constructs' simulation against hand-computed windows."""

import numpy as np
import pytest

from stratac import verify
from stratac.diagnostics import Source
from stratac.lang.frontend import load_source, schedules
from stratac.verify.routing import FULL, ROUTINGS, expert_ids


@pytest.mark.parametrize("routing", ROUTINGS)
def test_sample_routings_are_valid_and_reproducible(routing):
    ids = expert_ids(routing, 3, tokens=40, topk=4, experts=16, seed=7)
    assert ids.shape == (40, 4) and ids.dtype == np.int32
    assert ((ids >= -1) & (ids < 16)).all()
    for row in ids:                      # a token never picks an expert twice
        picked = row[row >= 0]
        assert len(set(picked.tolist())) == len(picked)
    assert (expert_ids(routing, 3, 40, 4, 16, 7) == ids).all()
    assert not (expert_ids(routing, 4, 40, 4, 16, 7) == ids).all() or routing == "single"


def test_what_each_routing_means():
    single = expert_ids("single", 0, 30, 3, 8)
    assert (single[:, 0] == 0).all() and (single[:, 1:] == -1).all()
    empty = expert_ids("empty", 0, 30, 3, 8)
    assert empty.max() < 4                               # the upper half of the experts gets nothing
    skewed = expert_ids("skewed", 0, 200, 2, 8)
    assert (skewed == 0).any(axis=1).mean() > 0.8        # most tokens go to expert 0
    sparse = expert_ids("sparse", 0, 50, 4, 8)
    assert (sparse[0] == -1).all() and 0 < (sparse == -1).mean() < 0.6


def test_the_full_routing_by_hand():
    """routing.FULL fills `capacity` slots of one expert after another, from expert `rank` on:
    entry (t, k) is the (k * tokens + t)-th and goes to block (k * tokens + t) // capacity."""
    ids = expert_ids(FULL, 0, 5, 2, 4, capacity=3)
    assert ids.tolist() == [[0, 1], [0, 2], [0, 2], [1, 2], [1, 3]]   # experts 0, 1, 2 hold 3 each
    assert expert_ids(FULL, 1, 5, 2, 4, capacity=3).tolist() == [[1, 2], [1, 3], [1, 3], [2, 3], [2, 0]]
    # more entries than the experts' slots hold: the rest are -1
    assert expert_ids(FULL, 0, 5, 2, 2, capacity=1).tolist() == [[0, -1], [1, -1]] + [[-1, -1]] * 3
    # a capacity above the token count fills `tokens` slots; none given: tokens too
    assert (expert_ids(FULL, 0, 4, 2, 8, capacity=9) == expert_ids(FULL, 0, 4, 2, 8)).all()
    assert expert_ids(FULL, 0, 4, 2, 8).tolist() == [[0, 1]] * 4
    for cap in range(1, 9):      # every token's experts distinct, at most `cap` entries per expert
        ids = expert_ids(FULL, 2, 8, 3, 8, capacity=cap)
        assert all(len(set(r[r >= 0].tolist())) == len(r[r >= 0]) for r in ids)
        assert np.bincount(ids[ids >= 0], minlength=8).max() == cap


def test_reference_layout_by_hand():
    ids = [np.array([[0, 2], [1, 0]]), np.array([[0, -1], [3, 0]])]   # world 2, 4 experts
    packed = verify.moe_layout(ids, 4, None)
    assert packed == {(0, 0, 0): (0, 0), (0, 1, 1): (0, 1), (1, 0, 0): (0, 2), (1, 1, 1): (0, 3),
                      (0, 1, 0): (0, 4), (0, 0, 1): (1, 0), (1, 1, 0): (1, 1)}
    slotted = verify.moe_layout(ids, 4, 2)
    assert slotted == {(0, 0, 0): (0, 0), (0, 1, 1): (0, 1), (1, 0, 0): (0, 2), (1, 1, 1): (0, 3),
                       (0, 1, 0): (0, 4), (0, 0, 1): (1, 0), (1, 1, 0): (1, 6)}
    # per_expert(5): local expert l's rows start at row 5 l, the sources packed inside it
    regions = verify.moe_layout(ids, 4, None, 5)
    assert regions == {(0, 0, 0): (0, 0), (0, 1, 1): (0, 1), (1, 0, 0): (0, 2), (1, 1, 1): (0, 3),
                       (0, 1, 0): (0, 5), (0, 0, 1): (1, 0), (1, 1, 0): (1, 5)}


PLACE_ONLY = """
schedule d(x: sym T[tokens, hidden], ids: i32[tokens, topk], counts: sym i32[world, experts],
           win: sym T[world * tokens * topk, hidden]) implements moe_dispatch(x, ids -> win, counts) {
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv: mine[rank] = histogram(ids)
  barrier
  on sdma: for p in peers: mine[rank]@p = mine[rank]
  barrier
  on aiv: offs = exscan(counts)
  on sdma: win = place(x, ids, offs)
  barrier
}
"""


@pytest.mark.parametrize("routing", ROUTINGS)
def test_dispatch_verifies_under_every_routing(routing):
    s, = schedules(Source("d.strata", PLACE_ONLY))
    for world in (1, 2, 3, 5):
        sizes = {"tokens": 7, "hidden": 2, "topk": 3, "experts": 4 * world}
        assert verify.verify(s, world, sizes, routing).ok


def test_a_wrong_offset_is_caught_with_the_token():
    """exscan swapped for slots: the rows land in the slotted layout, which is not the packed
    layout the contract promises (or outside the window)."""
    s, = schedules(Source("d.strata", PLACE_ONLY.replace("exscan(counts)", "slots(tokens)")))
    res = verify.verify(s, 2, {"tokens": 4, "hidden": 2, "topk": 2, "experts": 4}, "uniform")
    d, = res.diagnostics
    assert d.code == "E0305"
    assert "place puts token" in d.message or "should be the token row the layout puts there" in d.message


def test_a_region_per_expert_is_proven_at_its_bound_and_one_row_below(root):
    """per_expert(expert_rows): the samples hold the bound at exactly the most rows one expert
    receives (counted here from the ids) and one row less, under a skewed and a uniform routing;
    both verify: within the bound every row is where the contract says, below it every rank must
    report the same expert, its rows and the bound, with nothing placed."""
    for s in schedules(load_source(str(root / "examples" / "moe_prefill_experts.strata"))):
        world, topk = 2, verify.samples.MOE_TOPK
        samples = verify.default_samples(s, world)
        for routing in ("skewed", "uniform"):
            ids = np.concatenate([expert_ids(routing, r, 5, topk, 2 * world) for r in range(world)])
            need = int(np.bincount(ids[ids >= 0].ravel(), minlength=2 * world).max())
            held = [x for x in samples if x.routing == routing and x["tokens"] == 5]
            assert {need, need - 1} <= {x["expert_rows"] for x in held}, (s.name, routing)
            for x in held:
                if x["expert_rows"] in (need, need - 1):
                    res = verify.verify(s, world, dict(x), routing)
                    assert res.ok, (s.name, routing, x, [d.message for d in res.diagnostics])
