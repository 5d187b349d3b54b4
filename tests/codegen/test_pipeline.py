"""The one compile pipeline (stratac.codegen.pipeline): verify, run the passes, re-verify the IR they
made, generate. Every way in (`stratac compile`, `comm.load`, `stratac run`) goes through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from old_passes import epoch_pass_before_ifs

from stratac.codegen import pipeline
from stratac.diagnostics import Codes, Source, StrataError
from stratac.ir import passes
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "verify" / "corpus"


def barriers_in(kernel: str) -> list[str]:
    return [line.strip() for line in kernel.splitlines() if "strata::Barrier(" in line]


def test_barriers_under_ifs_get_the_stamps_of_their_places():
    """The kernel text, read by hand: in bcast_where_needed the last barrier is the 3rd place of the
    call whether or not `world > 2` passed the one before it; in both arms of bcast_both_arms the
    barrier is the 2nd place. The 1st, the entry barrier, is where the ranks agree on the call
    (strata::Agree, at stamp epoch_)."""
    compiled = {c.schedule.name: c for c in pipeline.compile_schedules(
        frontend.load_source(CORPUS / "good_barriers_under_if.strata"), passes.Options(), [1, 2, 3])}
    agree = "if (!strata::Agree(mv_, sync_, epoch_, strata::Ranks())) return;"
    for name in ("bcast_where_needed", "bcast_both_arms"):
        text = compiled[name].output.files["kernel.cpp"]
        assert text.count(agree) == 1 and text.index(agree) < text.index("strata::Barrier(")
    assert barriers_in(compiled["bcast_where_needed"].output.files["kernel.cpp"]) == [
        "strata::Barrier(sync_, epoch_ + 2);",
        "strata::Barrier(sync_, epoch_ + 3);"]
    assert barriers_in(compiled["bcast_both_arms"].output.files["kernel.cpp"]) == [
        "strata::Barrier(sync_, epoch_ + 2);",
        "strata::Barrier(sync_, epoch_ + 2);", "strata::Barrier(sync_, epoch_ + 3);"]
    assert all(c.worlds == (1, 2, 3) and c.schedule.lowered for c in compiled.values())


def test_a_pass_that_breaks_a_stamp_is_caught_before_code_generation(monkeypatch):
    """Today's bug, had the pipeline re-verified: the old epoch pass left barriers under ifs at stamp
    0. The source verifies; the IR after the passes does not, and the diagnostic says whose bug."""

    generated = []
    monkeypatch.setattr(passes, "flag_epochs", epoch_pass_before_ifs)
    monkeypatch.setattr(pipeline, "generate", generated.append)
    with pytest.raises(StrataError) as exc:
        pipeline.compile_schedules(frontend.load_source(CORPUS / "good_barriers_under_if.strata"),
                                   passes.Options(), [2])
    d, = exc.value.diagnostics
    assert d.code == Codes.SYNC_STAMP and d.span.line == 10, d.render()
    assert "a bug of stratac's passes" in d.notes[-1].message
    assert generated == []


def test_nothing_is_generated_unless_every_schedule_verified(monkeypatch):
    good = (CORPUS / "good_barriers_under_if.strata").read_text()
    bad = (CORPUS / "deadlock_barrier_in_one_arm_then_common.strata").read_text()
    generated = []
    monkeypatch.setattr(pipeline, "generate", generated.append)
    with pytest.raises(StrataError) as exc:
        pipeline.compile_schedules(Source("two.strata", good + "\n" + bad), passes.Options(), [2, 3])
    assert exc.value.diagnostics[0].code == Codes.DEADLOCK
    assert generated == []


def test_compile_of_a_deadlocking_file_writes_nothing(tmp_path):
    bad = CORPUS / "deadlock_barrier_in_one_arm_then_common.strata"
    p = subprocess.run([sys.executable, "-m", "stratac", "compile", str(bad), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert p.returncode == 1
    assert f"{bad}:11:5: error[E0302]: deadlock" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


# ---- join_places: an int8 dispatch's rows and scales placed in one pass over the ids

JOIN_SRC = """
schedule d(xq: sym i8[tokens, hidden], xs: sym f32[tokens, 8], ids: i32[tokens, topk],
           counts: sym i32[world, experts], wq: sym i8[experts * capacity, hidden],
           ws: sym f32[experts * capacity, 8])
    implements moe_dispatch(xq, ids -> wq, counts, capacity, xs -> ws) {
  flag ready[world]
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv {
    mine[rank] = histogram(ids)
    offs = slots(capacity)
  }
  on aiv {
    for p in peers: mine[rank]@p = mine[rank]
    wq = place(xq, ids, offs)
    ws = place(xs, ids, offs)
  }
  for p in peers: signal ready[rank]@p
  for p in peers: wait ready[p]
}
"""


def _places(s):
    return [r for r in passes.routes(s) if r.kind.value == "place"]


def test_two_places_of_one_stage_are_joined_into_one_pass_over_the_ids():
    """The scales' place is marked joined, the kernel makes both in one Router::Place (two payloads,
    the second's line named beside it), and the printed IR says so; with join_places=False (the
    bench's two-pass twin) each place is its own call with an empty second payload."""
    from stratac.ir.printer import dump
    joined, = pipeline.compile_schedules(Source("j.strata", JOIN_SRC), passes.Options(), [1, 2, 3])
    assert [p.joined for p in _places(joined.schedule)] == [False, True]
    kernel = joined.output.files["kernel.cpp"]
    calls = [line.strip() for line in kernel.splitlines() if "rt_.Place(" in line]
    assert len(calls) == 1 and "{wq_, " in calls[0] and "Reinterpret<T>(ws_)" in calls[0], calls
    assert "// strata:16 is placed in the same pass over the ids" in kernel
    assert "[in the pass of the place above]" in dump(joined.schedule)
    apart, = pipeline.compile_schedules(Source("j.strata", JOIN_SRC),
                                        passes.Options(join_places=False), [1, 2])
    assert [p.joined for p in _places(apart.schedule)] == [False, False]
    calls = [line.strip() for line in apart.output.files["kernel.cpp"].splitlines() if "rt_.Place(" in line]
    assert len(calls) == 2 and all("{nullptr, 0, nullptr, 0}" in c for c in calls), calls


@pytest.mark.parametrize("change, joins", [
    ("", True),
    # the second place reads the window the first writes: the joined pass would read rows early
    ("ws = place(xs, ids, offs)|wq = place(wq, ids, offs)", False),
    # other offsets: the rows' cursors differ
    ("ws = place(xs, ids, offs)|ws = place(xs, ids, offs2)", False),
    # a stage apart
    ("    ws = place(xs, ids, offs)\n  }|  }\n  on aiv: ws = place(xs, ids, offs)", False),
])
def test_join_places_joins_only_places_of_the_same_ids_and_offsets_into_separate_buffers(change, joins):
    src = JOIN_SRC
    if change:
        old, new = change.split("|")
        src = src.replace(old, new).replace("scratch offs: i32[experts]",
                                            "scratch offs: i32[experts]\n  scratch offs2: i32[experts]")
        src = src.replace("    offs = slots(capacity)\n", "    offs = slots(capacity)\n    offs2 = slots(capacity)\n")
    s, = frontend.schedules(Source("j.strata", src))
    joined = passes.join_places(s, passes.Options())
    assert [p.joined for p in _places(joined)] == [False, joins]


def test_an_unsound_join_mark_is_refused_by_the_verifier_of_the_lowered_ir():
    """The verifier does not trust the pass: a place marked joined to a place of other offsets
    (whose cursors differ, so the joined pass would put its rows elsewhere) is refused on the IR
    after the passes (E0301), though each place alone verifies."""
    from dataclasses import replace

    from stratac import ir, verify
    src = JOIN_SRC.replace("ws = place(xs, ids, offs)", "ws = place(xs, ids, offs2)").replace(
        "scratch offs: i32[experts]", "scratch offs: i32[experts]\n  scratch offs2: i32[experts]").replace(
        "    offs = slots(capacity)\n", "    offs = slots(capacity)\n    offs2 = slots(capacity)\n")
    s, = frontend.schedules(Source("j.strata", src))
    assert verify.verify_worlds(s, [2])[0].ok
    lowered = passes.pipeline(s, passes.Options())
    assert verify.verify_lowered(lowered, s, [2])[-1].ok

    def mark(ops):
        return tuple(replace(op, body=mark(op.body)) if isinstance(op, ir.Stage) else
                     replace(op, joined=True) if isinstance(op, ir.Route) and op.operands[:1] == ("xs",) else op
                     for op in ops)
    res = verify.verify_lowered(replace(lowered, body=mark(lowered.body)), s, [2])
    d, = res[-1].diagnostics
    assert d.code == Codes.RACE and d.span.line == 18 and "not places of the same ids" in d.message, d.render()
