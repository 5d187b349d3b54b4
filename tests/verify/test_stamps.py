"""The verifier on the IR after the passes: it meets ranks at barriers of equal stamps (the ones the
kernel compares), refuses stamps the kernel could not synchronise with, and `verify_lowered`
re-verifies what the passes made against the proof of the source. Each broken stamp below is set by
hand on the lowered IR of a schedule from tests/verify/corpus/good_barriers_under_if.strata, whose
barriers are numbered in the comments."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from old_passes import epoch_pass_before_ifs

from stratac import ir, verify
from stratac.diagnostics import Codes
from stratac.ir import passes
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "verify" / "corpus"
UNDER_IF = CORPUS / "good_barriers_under_if.strata"
WORLDS = [1, 2, 3, 4, 5]


def schedule(name: str, path: Path = UNDER_IF) -> ir.Schedule:
    return next(s for s in frontend.schedules(frontend.load_source(path)) if s.name == name)


def lowered(name: str) -> ir.Schedule:
    return passes.pipeline(schedule(name), passes.Options())


def restamp(s: ir.Schedule, *stamps: int) -> ir.Schedule:
    """s with its barriers, in source order, stamped `stamps`."""
    todo = iter(stamps)

    def walk(ops):
        out = []
        for op in ops:
            if isinstance(op, ir.Barrier):
                op = replace(op, seq=ir.Const(next(todo)))
            elif isinstance(op, ir.If):
                op = replace(op, then=walk(op.then), orelse=walk(op.orelse))
            out.append(op)
        return tuple(out)
    return replace(s, body=walk(s.body))


def first_error(results):
    bad = [r for r in results if not r.ok]
    return bad[0].diagnostics[0] if bad else None


def test_the_stamps_the_pass_makes_verify_in_full_and_against_the_source():
    for path in (UNDER_IF, CORPUS / "good_ring_steps_under_if.strata", CORPUS / "good_nested_step_loops.strata",
                 ROOT / "examples" / "broadcast.strata", ROOT / "examples" / "reduce.strata",
                 ROOT / "examples" / "allreduce_twoshot_flags.strata"):
        worlds = WORLDS[:4] if "ring" in path.name else WORLDS
        for s in frontend.schedules(frontend.load_source(path)):
            low = passes.pipeline(s, passes.Options())
            assert low.lowered and not s.lowered
            assert first_error(verify.verify_worlds(low, worlds)) is None, s.name
            assert first_error(verify.verify_lowered(low, s, worlds)) is None, s.name


def test_todays_bug_is_caught_by_verifying_the_lowered_ir(monkeypatch):
    """bcast_true_everywhere's barriers are lines 8, 10 (under `if world > 0`) and 12. The old
    pass stamped them 1, 0, 2: the kernel's second barrier passed on the first one's announcements,
    and broadcasts came out wrong (they run right now: tests/e2e/test_sync_under_if.py)."""
    s = schedule("bcast_true_everywhere")
    monkeypatch.setattr(passes, "flag_epochs", epoch_pass_before_ifs)
    bug = passes.pipeline(s, passes.Options())
    for d in (first_error(verify.verify_worlds(bug, WORLDS)),
              first_error(verify.verify_lowered(bug, s, WORLDS))):
        assert d.code == Codes.SYNC_STAMP and d.span.line == 10, d.render()
        assert "on rank 0 this barrier has stamp epoch + 0 (world=1" in d.message
        assert "not above the stamp 1 of its barrier before (line 8)" in d.message


def test_barriers_meet_only_at_equal_stamps():
    """bcast_both_arms: barriers at lines 26, 29 (the root's arm), 31 (the others') and 34. With
    the arms stamped 2 and 3, every rank's stamps still grow, but the second barriers do not meet:
    executed, that is a deadlock; against the source's proof, an unmet barrier."""
    s = schedule("bcast_both_arms")
    bad = replace(restamp(lowered("bcast_both_arms"), 1, 2, 3, 4), sync_ops=4)
    d = first_error(verify.verify_worlds(bad, [3]))
    assert d.code == Codes.DEADLOCK and d.span.line == 29, d.render()
    assert [(n.span.line, n.message) for n in d.notes] == [
        (29, "rank 0 waits at this barrier, the 2nd barrier of the call (stamp epoch + 2)"),
        (31, "ranks 1, 2 wait at this barrier, the 2nd barrier of the call (stamp epoch + 3)")]
    d = first_error(verify.verify_lowered(bad, s, [3]))
    assert d.code == Codes.SYNC_STAMP and d.span.line == 31, d.render()
    assert d.message == ("this barrier has stamp epoch + 3 on rank 1 but epoch + 2 on rank 0, where the "
                         "verifier met the two (world=3, n=1, root=0): the kernel's barriers would not "
                         "meet where the verified ones do")
    assert d.notes[0].span.line == 29


@pytest.mark.parametrize("stamps, sync_ops, line, why", [
    ((0, 1, 1, 2), 2, 26, "below 1: the zeroed sync area of a first call already lets it through"),
    ((1, 2, 2, 2), 2, 34, "not above the stamp 2 of its barrier before (line 29)"),
    ((1, 2, 2, 3), 2, 34, "beyond the 2 stamps a call reserves"),
])
def test_stamps_the_kernel_cannot_synchronise_with(stamps, sync_ops, line, why):
    bad = replace(restamp(lowered("bcast_both_arms"), *stamps), sync_ops=sync_ops)
    for results in (verify.verify_worlds(bad, WORLDS),
                    verify.verify_lowered(bad, schedule("bcast_both_arms"), WORLDS)):
        d = first_error(results)
        assert d.code == Codes.SYNC_STAMP and d.span.line == line and why in d.message, d.render()


def test_stamps_may_leave_gaps():
    """A barrier waits for every rank's stamp or a later one: stamps 1, 3, 3, 4 synchronise as
    1, 2, 2, 3 do (the arms' barriers 3 on every rank), within 4 stamps per call."""
    ok = replace(restamp(lowered("bcast_both_arms"), 1, 3, 3, 4), sync_ops=4)
    assert first_error(verify.verify_worlds(ok, WORLDS)) is None
    assert first_error(verify.verify_lowered(ok, schedule("bcast_both_arms"), WORLDS)) is None


def test_a_flag_outside_the_calls_stamps_is_rejected():
    """bcast_flags_and_arms: flags ready (line 41) and landed; a wait for stamp epoch + 0 would be
    satisfied by a zeroed slot in the first call."""
    s = schedule("bcast_flags_and_arms")
    low = passes.pipeline(s, passes.Options())
    assert [f.seq for f in low.flags] == [3, 4] and low.sync_ops == 4   # after 2 barrier places
    bad = replace(low, flags=(replace(low.flags[0], seq=0), low.flags[1]))
    for results in (verify.verify_worlds(bad, [2]), verify.verify_lowered(bad, s, [2])):
        d = first_error(results)
        assert d.code == Codes.SYNC_STAMP and d.span.line == 41, d.render()
        assert d.message.startswith("flag ready has stamp epoch + 0, outside the stamps 1..4")


def test_a_pass_that_changes_the_data_movement_is_verified_in_full():
    """Only stamps and plans may differ for the cheap re-verification; here the lowered IR lost the
    root's scatter (line 9), so verify_lowered verifies it in full and finds the broadcast wrong."""
    s = schedule("bcast_true_everywhere")
    low = passes.pipeline(s, passes.Options())
    no_scatter = replace(low, body=tuple(op for op in low.body
                                         if not (isinstance(op, ir.If) and op.span.line == 9)))
    d = first_error(verify.verify_lowered(no_scatter, s, [2]))
    assert d.code == Codes.CONTRACT, d.render()


def test_one_stamp_at_two_places_is_refused(tmp_path):
    """Rank 0 passes places 1 and 2, rank 1 places 1 and 3. Stamped 1, 2, 2 each rank's stamps
    still grow and each place has one stamp, but stamp 2 names two places: the kernel would meet
    rank 0's second barrier with rank 1's, which the verifier never met."""
    path = tmp_path / "two_places.strata"
    path.write_text("schedule two_places(x: sym T[n]) implements allreduce(x, sum) {\n"
                    "  barrier\n"
                    "  if rank == 0 { barrier }\n"
                    "  if rank == 1 { barrier }\n"
                    "}\n")
    s = schedule("two_places", path)
    low = passes.pipeline(s, passes.Options())
    assert [b.seq.value for b in _barriers(low.body)] == [1, 2, 3]   # the pass's stamps: their places
    bad = restamp(low, 1, 2, 2)
    d = first_error(verify.verify_lowered(bad, s, [2]))
    assert d.code == Codes.SYNC_STAMP and d.span.line == 4, d.render()
    assert d.message.startswith("this barrier has stamp epoch + 2 on rank 1, as a barrier of rank 0 the "
                                "verifier did not meet it with")
    assert d.notes[0].span.line == 3


def _barriers(ops):
    for op in ops:
        if isinstance(op, ir.Barrier):
            yield op
        elif isinstance(op, ir.If):
            yield from _barriers(op.then + op.orelse)


def test_a_flag_with_rounds_takes_one_stamp_per_round():
    """examples/reducescatter_ring_fifo.strata: full and free ((world + 1) / 2 rounds each). Round r
    of a flag has stamp epoch + seq + r, so the flags take 2 x rounds stamps per call, each flag's after the one before; a call that reserves one stamp fewer leaves
    free's last round to the next call, which the verifier refuses."""
    path = ROOT / "examples" / "reducescatter_ring_fifo.strata"
    s = schedule("reducescatter_ring_fifo", path)
    low = passes.pipeline(s, passes.Options())
    for world in (1, 2, 5, 8):
        env = {"world": world, "n": 1}
        rounds = (world + 1) // 2
        assert [f.seq if isinstance(f.seq, int) else f.seq.eval(env) for f in low.flags] == \
            [1, 1 + rounds], world
        assert low.stamps(env) == 2 * rounds
    assert first_error(verify.verify_lowered(low, s, WORLDS)) is None
    short = replace(low, sync_expr=ir.simplify(ir.Bin(ir.BinKind.SUB, low.sync_expr, ir.Const(1))))
    d = first_error(verify.verify_worlds(short, [5]))
    assert d.code == Codes.SYNC_STAMP and d.span.line == 18, d.render()   # flag free
    assert d.message.startswith("flag free has stamps epoch + 4..6 (its rounds), outside the stamps "
                                "1..5"), d.message
