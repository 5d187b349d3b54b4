"""Flags with rounds (`flag f[K] rounds R`, `signal f[i]@p round r`, `wait f[i] round r`): a slot
signalled once per round, each round after the one before it; the verifier meets a wait of round
r with the signal of round r, and names the credit a reused FIFO slot is missing. The corpus holds
one file per refusal (tests/verify/corpus/rounds_*.strata, credit_missing_fifo_reuse.strata); these
tests check what the corpus' one-line markers cannot: notes, and which signal a wait is met by."""

from __future__ import annotations

from pathlib import Path

from stratac import ir, verify
from stratac.diagnostics import Codes, Source
from stratac.ir.instantiate import EventKind, instantiate
from stratac.lang import frontend
from stratac.verify.timeline import Execution

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "verify" / "corpus"


def lower(text: str) -> ir.Schedule:
    s, = frontend.schedules(Source("t.strata", text))
    return s


def first_error(s: ir.Schedule, worlds):
    bad = [r for r in verify.verify_worlds(s, list(worlds)) if not r.ok]
    return bad[0].diagnostics[0] if bad else None


def test_a_fifo_reuse_without_a_credit_names_the_credit():
    s, = frontend.schedules(frontend.load_source(CORPUS / "credit_missing_fifo_reuse.strata"))
    d = first_error(s, [4])
    assert d.code == Codes.RACE and d.span.line == 19
    assert [n.span.line if n.span else None for n in d.notes] == [16, None]
    assert d.notes[1].message.startswith("if rank 0 reuses elements rank 1 reads (a FIFO slot), the "
                                         "reuse needs a credit: rank 1 signals a flag after its read "
                                         "and rank 0 waits for it before it writes")


def test_a_race_in_a_schedule_without_rounds_has_no_credit_note():
    """The same ring with one slot per step (no reuse, no rounds) and the step's wait left out: a
    race, but not a FIFO's, so no credit is suggested."""
    s = lower("""
schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  flag ready[1]
  flag full[world]
  scratch fifo: sym T[n * world]
  slot = split(fifo, world)
  blk = split(out, world)
  let next = (rank + 1) % world
  signal ready[0]@((rank - 1) % world)
  on aiv: blk[rank] = x
  wait ready[0]
  for s in 0 .. world - 1 {
    on aiv: slot[s]@next = blk[(rank - s) % world]
    signal full[s]@next
    on aiv: blk[(rank - s - 1) % world] = slot[s]
  }
  barrier
}""")
    d = first_error(s, [3])
    assert d.code == Codes.RACE and all("credit" not in n.message for n in d.notes), d.render()


def test_the_same_round_twice_is_a_double_signal():
    s = lower("""
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1] rounds 2
  signal got[0]@0 round 0
  barrier
}""")
    d = first_error(s, [2])     # ranks 0 and 1 both signal round 0
    assert d.code == Codes.DOUBLE_SIGNAL
    assert d.message.startswith("got[0] round 0 of rank 0 is signalled twice in one call (world=2, "
                                "n=1): a wait cannot tell the two apart"), d.message
    assert "declare rounds" not in d.message      # the hint is for flags without rounds
    s = lower("""
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1]
  signal got[0]@0
  barrier
}""")
    assert "(declare rounds and give each signal its own: flag got[...] rounds R, signal got[i]@p " \
        "round r)" in first_error(s, [2]).message


def test_a_wait_is_met_by_its_own_round_and_not_an_earlier_one():
    """Rank 0 signals rounds 0 and 1 of rank 1's counter; rank 1 waits for round 1 only. Its wait
    follows round 1's signal; with round 1's signal gone, the wait is a deadlock that names round 1."""
    text = """
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1] rounds 2
  if rank == 0 {
    signal got[0]@1
    barrier
    signal got[0]@1 round 1
  } else {
    barrier
    if rank == 1: wait got[0] round 1
  }
}"""
    inst = instantiate(lower(text), 2, {"n": 1})
    ex = Execution(inst)
    assert ex.run() == []
    r0, r1 = inst.timelines
    sig1 = next(ev for ev in r0 if ev.kind is EventKind.SIGNAL and ev.signals[0][3] == 1)
    wait = next(ev for ev in r1 if ev.kind is EventKind.WAIT)
    assert wait.waits[0][:3] == ("got", 0, 1)
    assert ex.hb(0, sig1.index, 1, wait.index) and not ex.hb(1, wait.index, 0, sig1.index)
    d = first_error(lower(text.replace("    signal got[0]@1 round 1\n", "")), [2])
    assert d.code == Codes.DEADLOCK
    assert any(n.message == "rank 1 waits for got[0] round 1, which no rank ever signals"
               for n in d.notes), d.render()


def test_rounds_that_follow_each_other_through_another_rank_are_accepted():
    """Round 0 by rank 1, round 1 by rank 2 after a flag from rank 1: different signallers, but
    ordered, so the slot only grows."""
    s = lower("""
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1] rounds 2
  flag go[1]
  if rank == 1 {
    signal got[0]@0
    signal go[0]@2
  }
  if rank == 2 {
    wait go[0]
    signal got[0]@0 round 1
  }
  if rank == 0: wait got[0] round 1
  barrier
}""")
    assert Execution(instantiate(s, 3, {"n": 1})).run() == []
    # without the hand-over from rank 1 to rank 2 the rounds are unordered
    loose = lower("""
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1] rounds 2
  if rank == 1: signal got[0]@0
  if rank == 2: signal got[0]@0 round 1
  if rank == 0: wait got[0] round 1
  barrier
}""")
    d = Execution(instantiate(loose, 3, {"n": 1})).run()[0]
    assert d.code == Codes.DOUBLE_SIGNAL and d.span.line == 5
    assert d.notes[0].message == "round 0: rank 1 signals it here" and d.notes[0].span.line == 4


def test_rounds_of_one_signal_event_follow_program_order():
    """Consecutive signals are one event, which core 0 issues in program order: rounds 0 then 1
    of a slot in one event are ordered, 1 then 0 are not."""
    text = """
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag got[1] rounds 2
  signal got[0]@rank round FIRST
  signal got[0]@rank round SECOND
  wait got[0] round 1
}"""
    inst = instantiate(lower(text.replace("FIRST", "0").replace("SECOND", "1")), 2, {"n": 1})
    assert [len(ev.signals) for ev in inst.timelines[0] if ev.kind is EventKind.SIGNAL] == [2]
    assert Execution(inst).run() == []
    d = Execution(instantiate(lower(text.replace("FIRST", "1").replace("SECOND", "0")), 2,
                              {"n": 1})).run()[0]
    assert d.code == Codes.DOUBLE_SIGNAL and d.span.line == 4
    assert d.notes[0].message == "round 0: rank 0 signals it here" and d.notes[0].span.line == 5
