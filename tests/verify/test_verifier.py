"""The verifier as a whole: the examples verify for every world size 1..16, sample sizes, the
happens-before relation it builds, and regressions for bugs found while writing these tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratac import ir, verify
from stratac.diagnostics import Codes, Source, StrataError
from stratac.ir import instantiate as instantiate_mod
from stratac.ir.instantiate import EventKind, instantiate
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["allreduce_twoshot.strata", "allgather_push.strata"]


def lower(text: str, name: str = "t.strata") -> list[ir.Schedule]:
    return frontend.schedules(Source(name, text))


def first_error(s: ir.Schedule, worlds, samples=None):
    bad = [r for r in verify.verify_worlds(s, list(worlds), samples) if not r.ok]
    return bad[0].diagnostics[0] if bad else None


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_verify_for_worlds_1_to_16(example):
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / example))
    worlds = list(range(1, 17))
    results = verify.verify_worlds(s, worlds)
    assert all(r.ok for r in results), [d.render() for r in results for d in r.diagnostics]
    # every world, with every default sample (1, world + 3, world + 4, 2 * world + 5 elements)
    assert [(r.world, r.sizes["n"]) for r in results] == [
        (w, n) for w in worlds for n in (1, w + 3, w + 4, 2 * w + 5)]
    assert all(r.events > 0 for r in results)
    assert all(r.accesses > 0 for r in results if r.world > 1)


def test_default_samples():
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_twoshot.strata"))
    assert verify.default_samples(s, 4) == [{"n": 1}, {"n": 7}, {"n": 8}, {"n": 13}]
    assert verify.default_samples(s, 1) == [{"n": 1}, {"n": 4}, {"n": 5}, {"n": 7}]
    assert verify.default_samples(s, 17) == [{"n": 1}, {"n": 20}, {"n": 21}]   # no 2 world + 5
    fixed, = lower("schedule s(x: sym f32[world]) implements allreduce(x, sum) {}")
    assert verify.default_samples(fixed, 3) == [{}]


def test_default_samples_stay_within_the_simulation_budget(monkeypatch):
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allgather_push.strata"))
    # x has n, out n * world elements per rank: (n + n * world) * world elements in all
    monkeypatch.setattr(verify.samples, "SIM_ELEMENT_BUDGET", (8 + 8 * 4) * 4)
    assert verify.default_samples(s, 4) == [{"n": 1}, {"n": 7}, {"n": 8}]
    monkeypatch.setattr(verify.samples, "SIM_ELEMENT_BUDGET", 0)
    assert verify.default_samples(s, 4) == [{"n": 1}]     # never none at all


def test_default_samples_with_a_size_dividing_by_zero():
    # regression: default_samples raised ZeroDivisionError out of verify_worlds
    s, = lower("schedule s(x: sym T[n], y: sym T[n / (world - 1)]) implements allreduce(x, sum) {}")
    assert verify.default_samples(s, 1) == [{"n": 1}, {"n": 4}, {"n": 5}, {"n": 7}]
    d = first_error(s, [1])
    assert d.code == Codes.BAD_WORLD and "division by zero" in d.message


# verified at world 1, refused at 2 (E0304: a rank returns while its peers still write into it)
LATE_EXIT = """schedule s(x: sym T[n]) implements allreduce(x, sum) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = sum(part[rank]@p for p in ranks)
  on sdma: for p in peers: part[rank]@p = part[rank]
}"""


def test_explicit_samples_and_stop_at_first_failure():
    s, = lower(LATE_EXIT)
    results = verify.verify_worlds(s, [1, 2, 3], [{"n": 5}, {"n": 6}])
    assert [(r.world, r.sizes, r.ok) for r in results] == [
        (1, {"n": 5}, True), (1, {"n": 6}, True), (2, {"n": 5}, False)]
    assert results[-1].diagnostics[0].code == Codes.EXIT


def test_a_proof_pauses_the_cycle_collector_and_leaves_no_cycles(monkeypatch):
    """verify pauses Python's cycle collector (verify/check.py) and restores it as it found it,
    enabled or not; what a proof made is freed by reference counting alone: a collection after
    proofs of a ring, a Broadcast from several roots and a MoE dispatch finds no cyclic garbage."""
    import gc
    paths = ["allreduce_ring.strata", "broadcast.strata", "moe_prefill.strata"]
    schedules = [frontend.schedules(frontend.load_source(ROOT / "examples" / p))[0] for p in paths]
    seen = []
    real = instantiate_mod.instantiate

    def spy(*args, **kw):
        seen.append(gc.isenabled())
        return real(*args, **kw)
    monkeypatch.setattr(verify.check, "instantiate", spy)
    enabled = gc.isenabled()
    try:
        gc.enable()
        gc.collect()
        for s in schedules:
            for sizes in verify.default_samples(s, 4):
                assert verify.verify(s, 4, sizes).ok
        assert gc.isenabled() and seen and not any(seen)
        assert gc.collect() == 0
        gc.disable()
        verify.verify(schedules[0], 2, {"n": 3})
        assert not gc.isenabled()
    finally:
        (gc.enable if enabled else gc.disable)()


def test_a_worker_keeps_only_its_last_proof_and_hides_it_from_the_collector(monkeypatch):
    """What a worker of `check -j` runs (verify.check._prove, here in this process): it keeps the
    instance of its last proof (its exit frees nothing one by one), frees the one before as it
    starts the next, so it never holds two, and freezes what it keeps so that no collection walks
    it; the collector is enabled again after each proof."""
    import gc
    ring, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_ring.strata"))
    monkeypatch.setattr(verify.check, "_WORK", ring)
    enabled = gc.isenabled()
    try:
        gc.enable()
        for n in (5, 6):
            assert verify.check._prove((3, {"n": n})).ok
            (inst, ex), = verify.check._KEPT        # this proof's alone
            assert inst.sizes == {"n": n} and ex.inst is inst
            assert gc.get_freeze_count() > 0 and gc.isenabled()
            del inst, ex
            gc.unfreeze()
    finally:
        verify.check._KEPT.clear()
        (gc.enable if enabled else gc.disable)()


def test_a_worker_that_dies_is_an_error_naming_the_instance(monkeypatch):
    """A worker process that ends before it answers (killed, out of memory) is a StrataError that
    names the schedule and the instance, not a traceback of the process pool."""
    import os
    ring, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_ring.strata"))
    # the forked workers' copy of the module: each one ends as it starts its first proof
    monkeypatch.setattr(verify.check, "verify", lambda *args, **kw: os._exit(9))
    with pytest.raises(StrataError) as exc:
        verify.verify_worlds(ring, [3], jobs=2)
    d, = exc.value.diagnostics
    assert d.code == Codes.BAD_WORLD and "a worker process proving allreduce_ring at world 3 (n=" in d.message
    assert "-j 1" in d.message


def test_instances_proven_side_by_side_give_the_same_results():
    """jobs = 2 (worker processes): the same results in the same order, stopping at the same
    failure; and over every corpus file at worlds 2-4, the same verdicts and diagnostics."""
    s, = lower(LATE_EXIT)
    results = verify.verify_worlds(s, [1, 2, 3], [{"n": 5}, {"n": 6}], jobs=2)
    assert [(r.world, r.sizes, r.ok) for r in results] == [
        (1, {"n": 5}, True), (1, {"n": 6}, True), (2, {"n": 5}, False)]
    assert results[-1].diagnostics[0].code == Codes.EXIT

    def seen(results):
        return [(r.world, r.sizes, r.skipped, [str(d) for d in r.diagnostics], r.events) for r in results]
    compared = 0
    for path in sorted((ROOT / "tests" / "verify" / "corpus").glob("*.strata"))[::4]:
        try:
            schedules = frontend.schedules(frontend.load_source(str(path)))
        except StrataError:
            continue   # a front-end error: nothing to prove
        for sched in schedules:
            assert seen(verify.verify_worlds(sched, [2, 3, 4])) == seen(
                verify.verify_worlds(sched, [2, 3, 4], jobs=2)), path.name
            compared += 1
    assert compared > 15


def test_world_must_be_positive():
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allgather_push.strata"))
    res = verify.verify(s, 0, {"n": 1})
    assert not res.ok and res.diagnostics[0].code == Codes.BAD_WORLD
    assert "at least 1" in res.diagnostics[0].message


def test_zero_elements_verify():
    for example in EXAMPLES:
        s, = frontend.schedules(frontend.load_source(ROOT / "examples" / example))
        for w in (1, 2, 5):
            assert verify.verify(s, w, {"n": 0}).ok


# ---- negative operands of / and % (regression) ----

RING = """schedule s(x: sym T[n]) implements allreduce(x, sum) {{
  part = split(x, world)
  barrier
  on aiv: part[rank] = sum(part[rank]@({rank}) for p in ranks)
  on sdma: for p in peers: part[rank]@p = part[rank]
  barrier
}}"""


def test_modulo_of_a_negative_rank_is_floored():
    # % is floored in the language: (rank - p) % world is a rank (3 for rank 0, p = 1, world 4),
    # and the kernel computes it with strata::Mod, since C++'s % truncates (-1 there).
    s, = lower(RING.format(rank="(rank - p) % world"))
    assert first_error(s, range(1, 9)) is None
    assert ir.c_source(s.body[1].body[0].src.rank, {"rank": "rank", "p": "p_", "world": "world"}) \
        == "strata::Mod(rank - p_, world)"


def test_modulo_by_a_nonpositive_number_is_rejected():
    s, = lower(RING.format(rank="(rank + p) % (world - 2)"))
    d = first_error(s, [1])
    assert d.code == Codes.BAD_WORLD and "-1: the right operand of % must be positive" in d.message


def test_modulo_of_a_nonnegative_rank_is_accepted():
    s, = lower(RING.format(rank="(rank + world - p) % world"))
    assert first_error(s, range(1, 9)) is None


def test_division_of_a_negative_offset_is_rejected():
    s, = lower("""schedule s(x: sym T[n], y: sym T[n]) implements allreduce(x, sum) {
  on aiv: y[(rank - 1) / 2:(rank - 1) / 2] = x[0:0]
}""")
    d = first_error(s, [1])
    assert d.code == Codes.BAD_WORLD and "negative operand in -1 / 2" in d.message


# ---- the happens-before relation ----

HB = """schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag go[1]
  on aiv: x = x
  signal go[0]@((rank + 1) % world)
  on aiv: x = x
  wait go[0]
  on aiv: x = x
  barrier
  on aiv: x = x
}"""


def test_vector_clocks_order_signal_before_wait_and_barriers():
    s, = lower(HB)
    inst = instantiate(s, 3, {"n": 2})
    kinds = [ev.kind for ev in inst.timelines[0]]
    assert kinds == [EventKind.ENTRY, EventKind.STAGE, EventKind.SIGNAL, EventKind.STAGE,
                     EventKind.WAIT, EventKind.STAGE, EventKind.BARRIER, EventKind.STAGE,
                     EventKind.EXIT]
    ex = verify.timeline.Execution(inst)
    assert ex.run() == []
    stage1, signal, stage2, wait, stage3, barrier, stage4, exit_ = range(1, 9)
    # rank 0 signals rank 1: what rank 0 did before its signal happens before rank 1's wait
    assert ex.hb(0, stage1, 1, wait) and ex.hb(0, signal, 1, stage3)
    assert not ex.hb(0, stage2, 1, stage3)         # after the signal: unordered
    assert not ex.hb(1, stage1, 0, stage3)         # rank 1 signals rank 2, not rank 0
    assert ex.hb(2, stage1, 0, stage3)             # rank 2 signals rank 0
    # a barrier orders everything before it before everything after it
    for a in range(3):
        for b in range(3):
            assert ex.hb(a, stage3, b, stage4)
            assert a == b or not ex.hb(a, stage4, b, exit_)
            assert ex.hb(a, 0, b, stage4)           # entries before the barrier's successors
    # within a rank: program order
    assert ex.hb(1, stage1, 1, stage2) and not ex.hb(1, stage2, 1, stage1)


def test_consecutive_signals_and_waits_merge_into_one_event():
    s, = lower("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag a[world]
  flag b[world]
  for p in ranks: signal a[rank]@p
  signal b[rank]@rank
  for p in ranks: wait a[p]
  wait b[rank]
}""")
    inst = instantiate(s, 4, {"n": 1})
    tl = inst.timelines[2]
    assert [ev.kind for ev in tl] == [EventKind.ENTRY, EventKind.SIGNAL, EventKind.WAIT, EventKind.EXIT]
    assert sorted(tl[1].signals)[0][:3] == (0, "a", 2) and len(tl[1].signals) == 5
    assert [(f, slot) for f, slot, _, _ in tl[2].waits] == [("a", 0), ("a", 1), ("a", 2), ("a", 3),
                                                          ("b", 2)]
    assert verify.timeline.Execution(inst).run() == []      # no deadlock (the contract is not the point)


def test_deadlock_notes_say_who_waits_for_what():
    s, = lower("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag token[1]
  flag never[1]
  wait token[0]
  signal token[0]@((rank + 1) % world)
}""")
    d = first_error(s, [3])
    assert d.code == Codes.DEADLOCK and (d.span.line, d.span.col) == (4, 3)
    notes = [n.message for n in d.notes]
    assert notes == [f"rank {r} waits for token[0]; rank {(r + 2) % 3} signals it only after it is "
                     "itself blocked" for r in range(3)]
    assert all(n.span.line == 5 for n in d.notes)


def test_deadlock_at_a_barrier_names_the_waiting_ranks():
    s, = lower("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag go[world]
  for p in peers: signal go[rank]@p
  wait go[0]
  barrier
}""")
    # every rank but 0 gets go[0] from rank 0 and goes on to the barrier; rank 0 waits for ever
    d = first_error(s, [3])
    assert d.code == Codes.DEADLOCK and d.span.line == 4
    assert [n.message for n in d.notes] == [
        "rank 0 waits for go[0], which no rank ever signals",
        "ranks 1, 2 wait at a barrier for the others"]
    # more than six waiting ranks are named as a range
    assert first_error(s, [8]).notes[1].message == "ranks 1..7 (7 ranks) wait at a barrier for the others"


def test_an_instance_is_proven_at_any_size_and_refused_by_its_events(monkeypatch):
    """The simulation holds pieces, not elements (verify.segments): 400 M elements of a fixed size
    and a 2^30-element AllGather verify, and a 2^30-element one that drops its last element is
    rejected naming that element. What bounds an instance is its events, moves, sources, signals and waits
    (ir.instantiate.MAX_EVENTS): more is refused while it is built, naming the schedule and sizes."""
    s, = lower("schedule s(x: sym T[400000000]) implements allreduce(x, sum) {}")
    assert verify.verify(s, 1, {}).ok
    ok, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allgather_push.strata"))
    assert verify.verify(ok, 3, {"n": 1 << 30}).ok
    short, = lower(CUT_LAST)
    d, = verify.verify(short, 2, {"n": 1 << 30}).diagnostics
    assert d.code == Codes.CONTRACT and f"out@0[{(2 << 30) - 1}] should be" in d.message, d.message
    assert "it holds out@0[2147483647] as the call found it" in d.message
    monkeypatch.setattr(instantiate_mod, "MAX_EVENTS", 40)
    ring, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_ring.strata"))
    assert verify.verify(ring, 2, {"n": 3}).ok
    d, = verify.verify(ring, 6, {"n": 3}).diagnostics
    assert d.code == Codes.BAD_WORLD and d.message.startswith(
        "allreduce_ring at n=3, world=6 has more than 40 events, moves, sources, signals and waits "
        "over its ranks"), d.message


def test_an_instance_too_large_is_refused_before_it_is_built_from_three_ranks(monkeypatch):
    """From PROBE_FROM live ranks on, three ranks' timelines estimate the instance: its events and
    moves against MAX_EVENTS, its vector clocks against CLOCK_BYTES; either refuses it at once."""
    ring, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_ring.strata"))
    monkeypatch.setattr(instantiate_mod, "PROBE_FROM", 4)
    # world 8, per rank: entry, 2 * 8 - 2 steps of a wait (but the first), a stage and a signal,
    # the last wait, exit: 44 events; a move of one source per step (28); 14 signals and 14 waits:
    # 100
    monkeypatch.setattr(instantiate_mod, "MAX_EVENTS", 300)
    d, = verify.verify(ring, 8, {"n": 3}).diagnostics
    assert d.code == Codes.BAD_WORLD and "would hold about 800 events, moves, sources, signals and " \
        "waits (up to 100 on a rank), more than the 300 the verifier holds: refused before it is built" in d.message, d.message
    monkeypatch.setattr(instantiate_mod, "MAX_EVENTS", 10_000)
    # 14 joins x 8 ranks x 8 entries of one byte (timelines of 44 events count in a byte):
    # 896 bytes, over a budget of 895 and within one of 896
    monkeypatch.setattr(instantiate_mod, "CLOCK_BYTES", 895)
    d, = verify.verify(ring, 8, {"n": 3}).diagnostics
    assert "would hold vector clocks of about 0.0 GiB (14 waits and barriers on a rank, 8 entries " \
        "each), more than the 0 GiB" in d.message, d.message
    monkeypatch.setattr(instantiate_mod, "CLOCK_BYTES", 896)
    assert verify.verify(ring, 8, {"n": 3}).ok


def test_an_instance_whose_memory_outgrows_its_pieces_is_refused_at_the_move(monkeypatch):
    """The simulated memory's pieces (verify.provenance.MAX_PIECES) are counted as moves cut them:
    the direct AllToAll at world 8 ends with 72 (a piece per block of out on every rank, each from
    another rank's draws, and one per x), so a budget of 72 proves it and one of 71 refuses it,
    naming the schedule, the instance and the move that cut the last piece."""
    from stratac.verify import provenance
    a2a, = frontend.schedules(frontend.load_source(ROOT / "examples" / "alltoall.strata"))
    monkeypatch.setattr(provenance, "MAX_PIECES", 72)
    assert verify.verify(a2a, 8, {"n": 3}).ok
    monkeypatch.setattr(provenance, "MAX_PIECES", 71)
    d, = verify.verify(a2a, 8, {"n": 3}).diagnostics
    assert d.code == Codes.BAD_WORLD and d.message.startswith(
        "alltoall (world=8, n=3): its simulated memory holds more than 71 pieces"), d.message
    assert d.span.line == 8, d.span   # on sdma: for p in ranks: dst[rank]@p = src[p]


def test_an_allgathers_input_is_one_function_over_the_ranks():
    """The input of an out-of-place AllGather is tagged a + c (p n + j) (verify.segments), so its
    gathered output is one piece on every rank: Bruck's AllGather at world 64 ends with one piece
    per buffer and rank; and a block gathered from the wrong rank, or a sum of two elements whose
    indices add up to the right one, is still told apart."""
    from stratac.verify import provenance
    from stratac.verify.segments import Buffer, mismatch
    bruck, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allgather_bruck.strata"))
    inst = instantiate(bruck, 64, {"n": 5})
    ex = verify.timeline.Execution(inst)
    assert ex.run() == []
    assert ex.values.pieces == 2 * 64
    assert all(len(ex.values.cur[(r, "out")].parts) == 1 for r in range(64))
    init = ex.values.init
    x3, x4 = init[(3, "x")], init[(4, "x")]
    out = Buffer.tags(64 * 5, *provenance._tag_params(0, 0, 5))
    gathered = ex.values.cur[(0, "out")]
    assert mismatch(gathered, out) is None
    wrong = gathered.copy()
    wrong[15:20] = x4[0:5]                    # block 3 from rank 4
    assert mismatch(wrong, gathered) == (15, 5)
    two = gathered.copy()
    two[17:18] = x3[1:2] + x3[3:4]            # indices 16 + 18 = 2 x 17: a sum, not the element
    assert mismatch(two, gathered) == (17, 1)


CUT_LAST = """schedule short(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  on sdma: out[rank * n:(rank + 1) * n] = x
  barrier
  on sdma: for p in peers: out[p * n:(p + 1) * n - (1 if p == world - 1 else 0)] = x[0:n - (1 if p == world - 1 else 0)]@p
  barrier
}"""


def test_a_callees_requires_is_inherited_on_its_team():
    """`call ring(x, op) on lane` with ring's `requires world is pow2`: the caller supports only the
    worlds whose lanes are powers of two; world 6 (lanes of 3) is skipped naming the call, the
    callee's constraint and its line, and a direct verify of it refuses the world (E0201) at the
    call's line, as for the caller's own `requires`."""
    path = ROOT / "tests" / "verify" / "corpus" / "good_call_requires_inherited.strata"
    ring, twolevel = frontend.schedules(frontend.load_source(path))
    results = verify.verify_worlds(twolevel, [2, 4, 6])
    assert [r.world for r in results if r.skipped] == [6]
    assert all(r.ok for r in results)
    skipped = next(r.skipped for r in results if r.skipped)
    assert skipped.startswith("requires lane.size is pow2 (call ring(x, op) on lane: ring requires world "
                              "is pow2, line 8)"), skipped
    d, = verify.verify(twolevel, 6, {"n": 12}).diagnostics
    assert d.code == Codes.BAD_WORLD and "twolevel does not support world 6" in d.message
    assert d.span.line == 30 and ir.unmet_requirement(twolevel, 4) is None


def test_a_moe_instance_whose_count_tables_are_too_large_is_refused_before_routing(monkeypatch):
    """A MoE combine reads every rank's world x experts count table element by element: over all
    ranks world^2 x experts, refused before the routing is drawn (world 8,192: 5.5e11 elements)."""
    _, combine = frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_prefill.strata"))
    sizes = {"experts": 8, "hidden": 3, "tokens": 5, "topk": 2}
    assert verify.verify(combine, 4, sizes, "uniform").ok
    monkeypatch.setattr(verify.check, "TABLE_ELEMENT_LIMIT", 4 * 4 * 8 - 1)   # world x (world x experts)
    d, = verify.verify(combine, 4, sizes, "uniform").diagnostics
    assert d.code == Codes.BAD_WORLD and "its count tables (counts, 32 elements on each rank) hold 128 " \
        "elements over all ranks, more than the 127 the verifier reads: refused before the routing is " \
        "drawn" in d.message, d.message


@pytest.mark.parametrize("world, itemsize", [(3, 1), (100, 2)])
def test_a_race_is_found_with_clocks_of_either_entry_size(world, itemsize):
    """Vector clock entries take a byte while every timeline is shorter than 255 events, two bytes
    beyond (the ring at world 100: 396 events on a rank); the ring without its wait for the previous
    step is a race (E0301) with either."""
    ring_text = (ROOT / "examples" / "allreduce_ring.strata").read_text()
    line = "    if s > 0: wait got[s - 1]"
    assert line in ring_text
    ring, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allreduce_ring.strata"))
    bad, = frontend.schedules(Source("ring_no_wait.strata", ring_text.replace(line, "")))
    inst = instantiate(ring, world, {"n": world})
    assert instantiate_mod.clock_itemsize(max(map(len, inst.timelines))) == itemsize
    assert verify.verify(ring, world, {"n": world}).ok
    d = verify.verify(bad, world, {"n": world}).diagnostics[0]
    assert d.code == Codes.RACE, d.render()
