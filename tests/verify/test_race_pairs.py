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

import importlib.util
import sys
from pathlib import Path

import pytest

from stratac.diagnostics import Source, StrataError
from stratac.ir.instantiate import instantiate
from stratac.lang import frontend
from stratac.verify import races
from stratac.verify.samples import default_samples
from stratac.verify.timeline import Execution

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _schedules(sources):
    out = []
    for src in sources:
        try:
            out += frontend.schedules(src)
        except StrataError:
            pass     # the corpus's front-end errors: nothing to check
    return out


def _compare(schedules, worlds, monkeypatch) -> dict[str, int]:
    seen = {"instances": 0, "racy": 0, "ordered": 0, "left": 0}
    pair_test = races._all_ordered

    def counted(ex, items):
        got = pair_test(ex, items)
        seen["ordered" if got else "left"] += 1
        return got
    monkeypatch.setattr(races, "_all_ordered", counted)
    for s in schedules:
        for w in worlds:
            try:
                samples = default_samples(s, w)
            except StrataError:
                continue
            for sizes in samples:
                try:
                    inst = instantiate(s, w, sizes)
                except StrataError:
                    continue
                if s.contract.kind.moe:
                    continue       # routing is drawn per proof (verify.check); the plain kinds suffice
                ex = Execution(inst)
                try:
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
    seen = _compare(_schedules(frontend.load_source(str(p)) for p in paths), [2, 3, 4, 5], monkeypatch)
    assert seen["instances"] > 1000 and seen["racy"] >= 20, seen
    assert seen["ordered"] > seen["left"] > 0, seen


def _mutation_module():
    spec = importlib.util.spec_from_file_location("_race_pairs_mutations", HERE / "test_mutations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod    # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_mutants_report_the_same_races(monkeypatch):
    mutations = _mutation_module()
    sources = [Source(f"{p.stem}-without-{m.line}.strata", m.source)
               for p in mutations.EXAMPLES for m in mutations.mutants(p)]
    seen = _compare(_schedules(sources), [2, 3, 4], monkeypatch)
    assert seen["instances"] > 1000 and seen["racy"] >= 100, seen
