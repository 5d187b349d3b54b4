"""The race check's pair test (races._all_ordered) against its sweep: a group of accesses the pair
test finds ordered is one in which the sweep finds no race, so `check_races` reports the same with
the pair test tried on every group as with the sweep alone.

The verifier tries the pair test only on groups of 64 accesses or more, which worlds 2-5 seldom
make; here it is tried on every group. Every example, every corpus file (racy ones among them)
and every line-deletion mutant of the examples (the verifier rejects hundreds of them for races),
at worlds 2-5 with the verifier's samples, is checked both ways; the pair test must also have
decided most groups, and left some to the sweep, so that the comparison compared something.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stratac.diagnostics import StrataError
from stratac.ir.instantiate import instantiate
from stratac.verify import races
from stratac.verify.timeline import Execution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import verifykit  # noqa: E402


def _compare(schedules, worlds, monkeypatch) -> dict[str, int]:
    seen = {"instances": 0, "racy": 0, "ordered": 0, "left": 0}
    pair_test = races._all_ordered

    def counted(ex, items):
        got = pair_test(ex, items)
        seen["ordered" if got else "left"] += 1
        return got
    monkeypatch.setattr(races, "_all_ordered", counted)
    for s, w, sizes in verifykit.sampled(schedules, worlds):
        if s.contract.kind.moe:
            continue       # routing is drawn per proof (verify.check); the plain kinds suffice
        try:
            inst = instantiate(s, w, sizes)
            ex = Execution(inst)
            if ex.run():
                continue   # a deadlock or double signal: the races are not checked
        except StrataError:
            continue
        monkeypatch.setattr(races, "_PAIRS_FROM", 10**12)
        sweep = [str(d) for d in races.check_races(inst, ex)]
        monkeypatch.setattr(races, "_PAIRS_FROM", 2)
        both = [str(d) for d in races.check_races(inst, ex)]
        assert both == sweep, f"{s.name} at world {w}, {sizes}"
        seen["instances"] += 1
        seen["racy"] += bool(sweep)
    return seen


def test_examples_and_corpus_report_the_same_races(monkeypatch):
    paths = sorted((ROOT / "examples").glob("*.strata")) + sorted((HERE / "corpus").glob("*.strata"))
    seen = _compare(verifykit.schedules(paths), [2, 3, 4, 5], monkeypatch)
    assert seen["instances"] > 1000 and seen["racy"] >= 20, seen
    assert seen["ordered"] > seen["left"] > 0, seen


@pytest.mark.slow
def test_mutants_report_the_same_races(monkeypatch):
    seen = _compare(verifykit.schedules(verifykit.mutant_sources()), [2, 3, 4], monkeypatch)
    assert seen["instances"] > 1000 and seen["racy"] >= 100, seen
