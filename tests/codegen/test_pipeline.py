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


def test_barriers_under_ifs_get_the_stamps_of_the_barriers_passed_before():
    """The kernel text, read by hand: in bcast_where_needed the last barrier is the 2nd or the 3rd
    of the call, as `world > 2` says; in both arms of bcast_both_arms the barrier is the 2nd. The
    1st, the entry barrier, is where the ranks agree on the call (strata::Agree, at stamp epoch_)."""
    compiled = {c.schedule.name: c for c in pipeline.compile_schedules(
        frontend.load_source(CORPUS / "good_barriers_under_if.strata"), passes.Options(), [1, 2, 3])}
    agree = "if (!strata::Agree(mv_, sync_, epoch_, strata::kAllRanks)) return;"
    for name in ("bcast_where_needed", "bcast_both_arms"):
        text = compiled[name].output.files["kernel.cpp"]
        assert text.count(agree) == 1 and text.index(agree) < text.index("strata::Barrier(")
    assert barriers_in(compiled["bcast_where_needed"].output.files["kernel.cpp"]) == [
        "strata::Barrier(sync_, epoch_ + 2);",
        "strata::Barrier(sync_, epoch_ + 2 + (world > 2));"]
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
    assert f"{bad}:13:3: error[E0302]: deadlock" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()
