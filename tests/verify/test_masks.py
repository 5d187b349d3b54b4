"""Masked MoE variants (docs/robustness.md, "Masked ranks"): every mask of a small world is proven
for the example schedules; the masked simulation drops a masked rank's experts' entries, skips
masked ranks in loops and barriers, and refuses a schedule that names a masked rank itself."""

import numpy as np
import pytest

from stratac import verify
from stratac.diagnostics import Source
from stratac.ir.instantiate import EventKind, instantiate
from stratac.lang.frontend import load_source, schedules
from stratac.verify import provenance
from stratac.verify.samples import route_sample

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _schedules(name):
    return {s.name: s for s in schedules(load_source(ROOT / "examples" / name))}


def test_every_mask_of_worlds_2_to_4_is_proven():
    for name in ("moe_prefill.strata", "moe_decode.strata"):
        for s in _schedules(name).values():
            results = verify.verify_masks(s, [1, 2, 3, 4])
            assert results and all(r.ok for r in results), (s.name, [r.diagnostics for r in results
                                                                       if not r.ok][:1])
            # world 1 has no proper mask; each of worlds 2-4 every non-empty proper subset
            assert {(r.world, r.active) for r in results} == {
                (w, m) for w in (2, 3, 4) for m in verify.masks(w)}


def test_masks_are_every_nonempty_proper_subset():
    assert verify.masks(2) == [(True, False), (False, True)]
    assert len(verify.masks(5)) == 30 and (True,) * 5 not in verify.masks(5)


def test_a_masked_rank_does_not_run_and_barriers_skip_it():
    s = _schedules("moe_prefill.strata")["moe_prefill_dispatch"]
    inst = instantiate(s, 3, {"experts": 6, "hidden": 2, "tokens": 2, "topk": 2},
                       active=(True, False, True))
    assert [ev.kind for ev in inst.timelines[1]] == [EventKind.ENTRY, EventKind.EXIT]
    assert sum(ev.kind is EventKind.BARRIER for ev in inst.timelines[0]) == 2   # the entry is the agreement
    # the count exchange (for p in peers) goes to the other live rank only
    owners = {m.dst[0] for ev in inst.timelines[0] for m in ev.moves}
    assert owners == {2}


def test_the_model_drops_entries_of_a_masked_ranks_experts():
    s = _schedules("moe_prefill.strata")["moe_prefill_dispatch"]
    inst = instantiate(s, 2, {"experts": 4, "hidden": 1, "tokens": 2, "topk": 2}, active=(True, False))
    route_sample(inst, "uniform")
    ids = np.array([[0, 3], [2, 1]], dtype=np.int32)     # experts 2 and 3 live on rank 1 (masked)
    inst.data[(0, "ids")] = ids
    ex = verify.check.Execution(inst)
    assert ex.run() == []
    counts = np.asarray(ex.values.cur[(0, "counts")]).astype(np.int64).reshape(2, 4)
    assert counts[0].tolist() == [1, 1, 0, 0]            # only rank 0's own experts are counted
    win1 = np.asarray(ex.values.cur[(1, "win")])
    assert (win1 == np.asarray(ex.values.init[(1, "win")])).all()    # nothing is written to the masked rank
    assert verify.check.check_contract(inst, ex.values) == []


def test_a_schedule_that_names_a_masked_rank_is_refused():
    src = Source("named.strata", """
schedule named_dispatch(x: sym T[tokens, hidden], ids: i32[tokens, topk],
                        counts: sym i32[world, experts], win: sym T[world * tokens * topk, hidden])
    implements moe_dispatch(x, ids -> win, counts) {
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv: mine[rank] = histogram(ids)
  barrier
  on aiv: mine[rank]@((rank + 1) % world) = mine[rank]
  barrier
  on aiv: offs = exscan(counts)
  on aiv: win = place(x, ids, offs)
  barrier
}
""")
    s = schedules(src)[0]
    assert all(r.ok for r in verify.verify_worlds(s, [2]))   # at world 2 rank + 1 is the peer
    bad = [r for r in verify.verify_masks(s, [3]) if not r.ok]
    assert bad
    msg = bad[0].diagnostics[0].message
    assert "the call's mask of active ranks excludes" in msg and "for p in peers" in msg, msg


def test_a_model_that_ignored_the_mask_is_caught(monkeypatch):
    """The verifier can fail: with the routing simulation blind to the mask (a kernel that sent
    tokens to a masked rank), the masked variants are refused."""
    orig = provenance.Values._route

    def blind(self, ri, ev):
        active, self.inst.active = self.inst.active, None
        try:
            return orig(self, ri, ev)
        finally:
            self.inst.active = active
    monkeypatch.setattr(provenance.Values, "_route", blind)
    s = _schedules("moe_prefill.strata")["moe_prefill_dispatch"]
    bad = [r for r in verify.verify_masks(s, [3]) if not r.ok]
    assert bad and "active ranks" in bad[0].diagnostics[0].message


def test_instantiate_refuses_a_mask_for_a_schedule_without_one():
    s = _schedules("alltoallv.strata")["alltoallv"]
    with pytest.raises(Exception, match="does not take a mask"):
        instantiate(s, 2, {"n": 2, "hidden": 1, "tokens": 1}, active=(True, False))
