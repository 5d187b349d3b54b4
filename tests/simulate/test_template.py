"""The model's walk of the IR against stratac.ir.instantiate on every example, and every example
is one the model can predict."""

import pytest
from simkit import EXAMPLES, REQUIRES, ROOT, moe_env, schedule

from stratac import ir
from stratac.ir import instantiate
from stratac.lang import frontend
from stratac.tools.simulate.machine import SimulateError
from stratac.tools.simulate.template import lengths, not_modelled, template


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_matches_instantiate(path):
    for s in frontend.schedules(frontend.load_source(path)):
        worlds = [w for w in (1, 2, 3, 4, 5) if ir.unmet_requirement(s, w) is None]
        assert len(worlds) >= 3, (s.name, worlds)
        for world in worlds:
            _check_template(s, world)


@pytest.mark.parametrize("name", ["allreduce_hierarchical", "allreduce_groups",
                                  "allreduce_hierarchical_composed", "alltoall_bruck",
                                  "allreduce_reduce_on_write", "broadcast"])
def test_template_matches_instantiate_where_teams_and_step_ranges_are_held(name):
    """Loops and reductions over a team's members (strides of 2-8, lanes of 2-8 ranks) and loops of
    copies over a range are held as one entry with a set of ranks (template.members), one per
    stretch of equal lengths (n = 7: a split's parts differ) and cut where an `if p != root` leaves
    a rank out; expanded, they are instantiate's moves, in its order, at worlds where the teams
    hold several ranks."""
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))
    for world in (6, 8, 12, 16):
        _check_template(s, world)


@pytest.mark.parametrize("hold", [True, False])
def test_a_held_set_past_the_world_is_refused_like_a_listed_move(hold, tmp_path, monkeypatch):
    """A run whose ranks leave the world (`check` refuses the schedule; `simulate` does not prove)
    names the first rank that does not exist, held as a set or listed move by move."""
    from stratac.tools.simulate import template as tpl
    monkeypatch.setattr(tpl, "HOLD_EVERY", hold)
    s = schedule(tmp_path, """
schedule past(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  on sdma: for i in 0 .. world: blk[rank]@(2 * i + 1) = x
}
""")
    with pytest.raises(SimulateError, match="rank 5 does not exist in a world of 4"):
        template(s, 4, {"n": 8})


def test_template_matches_instantiate_where_only_the_leaders_pass_barriers():
    """The corpus's leaders-only AllReduce: each barrier's place and members, rank by rank, as
    instantiate has them (the lane barriers on the node leaders alone)."""
    path = ROOT / "tests" / "verify" / "corpus" / "good_leader_barriers.strata"
    s, = frontend.schedules(frontend.load_source(path))
    for world in (2, 4, 6, 8):
        _check_template(s, world)
    t = template(s, 4, {"n": 5})
    assert [a for k, a in t.timelines[2] if k == "barrier"] == [
        (1, (2, 3)), (2, (0, 2)), (3, (0, 2)), (4, (2, 3)), (5, (2, 3))]
    assert [a for k, a in t.timelines[3] if k == "barrier"] == [(1, (2, 3)), (4, (2, 3)), (5, (2, 3))]


def test_a_world_the_schedule_excludes_is_refused_with_its_constraint():
    s = frontend.schedules(frontend.load_source(REQUIRES))[0]
    with pytest.raises(SimulateError, match="halving_doubling_pow2 does not support world 3: it requires "
                                            "world is pow2"):
        template(s, 3, {n: 7 for n in s.sizes})


def _check_template(s: ir.Schedule, world: int) -> None:
    """The model's walk of the IR gives the same moves and routing constructs, per rank and stage,
    as stratac.instantiate."""
    if s.contract.kind.moe:
        env = moe_env(s, world)
    else:
        env = {**{n: 7 for n in s.sizes}, **{x.name: world - 1 for x in s.rank_params}}
    inst = instantiate.instantiate(s, world, env)
    t = template(s, world, env)
    lens = lengths(t, env)
    for r, events in enumerate(inst.timelines):
        kinds, got_kinds = [], []
        stage_events = [ev for ev in events if ev.kind is instantiate.EventKind.STAGE]
        keys = [arg for kind, arg in t.timelines[r] if kind == "stage"]
        assert len(keys) == len(stage_events), (world, r)
        for ev, key in zip(stage_events, keys):
            # each execution of a stage (a step of a loop) is its own instance, holding that
            # step's moves and routing constructs only
            want = [(r, 1 if mv.accumulate else (0 if mv.op is None else 2), mv.dst[0],
                     tuple(x[0] for x in mv.srcs), mv.dst[3] - mv.dst[2]) for mv in ev.moves]
            assert [mv for mv in t.moves(key, lens) if mv[0] == r] == want, (world, r, ev.stage.index)
            got = [(q, k, sh["experts"], sh.get("tokens", 0), sh.get("topk", 0), sh.get("hidden", 0))
                   for q, k, sh in t.routes(key) if q == r]
            assert got == [(ri.rank, ri.kind, ri.experts, ri.tokens, ri.topk, ri.hidden)
                           for ri in ev.routes], (world, r, ev.stage.index)
        for ev in events:
            if ev.kind is instantiate.EventKind.STAGE:
                kinds.append(("stage", ev.stage.index))
            elif ev.kind is instantiate.EventKind.BARRIER:
                kinds.append(("barrier", (ev.barrier, ev.members)))
            elif ev.kind is instantiate.EventKind.SIGNAL:
                kinds.append(("signal", [(o, f, (slot, rnd)) for o, f, slot, rnd, _ in ev.signals]))
            elif ev.kind is instantiate.EventKind.WAIT:
                kinds.append(("wait", [(f, (slot, rnd)) for f, slot, rnd, _ in ev.waits]))
            elif ev.kind is instantiate.EventKind.AWAIT:
                kinds.append(("await", None))
        for kind, arg in t.listed_timeline(r):     # a held signal's or wait's set, member by member
            got_kinds.append((kind, t.stages[arg].stage.index) if kind == "stage" else (kind, arg))
        assert got_kinds == kinds, (world, r)
    # every instance's moves belong to exactly one execution per rank: none counted twice
    total = sum(len(t.moves(key, lens)) for key in t.stages)
    assert total == sum(len(ev.moves) for events in inst.timelines for ev in events
                        if ev.kind is instantiate.EventKind.STAGE)


def test_every_example_is_modelled():
    for path in EXAMPLES:
        for s in frontend.schedules(frontend.load_source(path)):
            assert not_modelled(s) is None, s.name


def test_a_template_too_large_is_refused_from_three_ranks_before_it_is_walked(monkeypatch):
    """From PROBE_FROM on, three ranks estimate the walk; over MAX_ENTRIES it is refused at once.
    The ring at world 8, per rank: 2 * 8 - 2 steps of a wait (but the first), a stage and a signal,
    the last wait (42 entries), and a move of one source per step (28): 70, 560 in all."""
    from stratac.tools.simulate import template as template_mod
    path, = [p for p in EXAMPLES if p.name == "allreduce_ring.strata"]
    ring, = frontend.schedules(frontend.load_source(path))
    monkeypatch.setattr(template_mod, "PROBE_FROM", 4)
    monkeypatch.setattr(template_mod, "MAX_ENTRIES", 559)
    with pytest.raises(SimulateError, match=r"^allreduce_ring at world 8 would hold about 560 timeline "
                       r"entries, flag slots, moves and sources \(70 on a rank\), more than the 559 the "
                       r"model holds"):
        template(ring, 8, {"n": 1024})
    monkeypatch.setattr(template_mod, "MAX_ENTRIES", 560)
    assert len(template(ring, 8, {"n": 1024}).timelines) == 8


def test_the_estimate_counts_each_flag_slot_and_a_held_entry_once(monkeypatch):
    """A signal (wait) entry of the timeline holds a slot per flag it names. Two-shot with flags
    at world 8, everything listed, per rank: two stages, a signal of 7 peers' slots, a wait for 7,
    the reduction's move and 8 sources, 7 copies and their 7 sources: 39, 312 in all. A loop over
    the peers' flags grows with the world's square: 134 M slots at world 8,192; counted once per
    signal, the walk reached 11 GB there once two-shot's copies were held as runs. Held
    (template.Held: the peers as one set), the signal and the wait are one entry each, and the
    reduction and the copies one move each (the copies' one source listed): 7, 56 in all.
    Two-shot without flags: two stages and a barrier, and its reduction and loop of copies held as
    one entry each (3): 6, 48 in all."""
    from stratac.tools.simulate import template as template_mod
    flags = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_twoshot_flags.strata"))[0]
    plain = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_twoshot.strata"))[0]
    monkeypatch.setattr(template_mod, "PROBE_FROM", 4)
    monkeypatch.setattr(template_mod, "MAX_ENTRIES", 100)
    monkeypatch.setattr(template_mod, "HOLD_EVERY", False)
    with pytest.raises(SimulateError, match=r"^allreduce_twoshot_flags at world 8 would hold about 312 "):
        template(flags, 8, {"n": 1024})
    monkeypatch.setattr(template_mod, "HOLD_EVERY", True)
    monkeypatch.setattr(template_mod, "MAX_ENTRIES", 55)
    with pytest.raises(SimulateError, match=r"^allreduce_twoshot_flags at world 8 would hold about 56 "):
        template(flags, 8, {"n": 1024})
    monkeypatch.setattr(template_mod, "MAX_ENTRIES", 56)
    assert len(template(flags, 8, {"n": 1024}).timelines) == 8
    assert len(template(plain, 8, {"n": 1024}).timelines) == 8

def test_template_matches_instantiate_with_arrays(tmp_path):
    """Arrays (`var t[K]`): the corpus's tables, and a ring whose part index, peer and flag slots
    are elements (a length that reads an element is computed key by key: an array is not a
    column of the fixed names' values), at worlds 2-9 (world 7: uneven parts)."""
    good = frontend.schedules(frontend.load_source(ROOT / "tests" / "verify" / "corpus" /
                                                   "good_array_tables.strata"))
    ring = schedule(tmp_path, """
schedule ag_tab(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  flag got[world]
  blk = split(out, world)
  var nxt[1] = (rank + 1) % world
  var c[1] = rank
  on sdma: blk[rank] = x
  barrier
  for s in 0 .. world - 1 {
    if s > 0: wait got[s - 1]
    on sdma: blk[c[0]]@nxt[0] = blk[c[0]]
    signal got[s]@nxt[0]
    set c[0] = (c[0] - 1) % world
  }
  if world > 1: wait got[world - 2]
}
""")
    for s in [*good, ring]:
        for world in range(2, 10):
            if ir.unmet_requirement(s, world) is None:
                _check_template(s, world)


def test_an_array_outside_its_bounds_is_refused_at_its_file_line_and_column(tmp_path):
    """`simulate` does not prove: an array that `check` refuses at a world (a size above 64, a
    `set` outside it) is named with the file:line:col of its statement."""
    text = """
schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  var t[world - 2] = 0
  set t[1] = 1
  var u[world * 20] = 0
  blk = split(out, world)
  on sdma: for p in ranks: blk[rank]@p = x
  barrier
}
"""
    s = schedule(tmp_path, text)
    with pytest.raises(SimulateError, match=r"`set t\[1\]` is outside t's 0 elements at world 2 "
                                            r"\(\S*s\.strata:4:3\)"):
        template(s, 2, {"n": 8})
    with pytest.raises(SimulateError, match=r"array u would hold 80 integers at world 4 \(\S*s\.strata:5:3\)"):
        template(s, 4, {"n": 8})
