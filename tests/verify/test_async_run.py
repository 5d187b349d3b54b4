"""An asynchronous copy in flight across a barrier races on the CPU model too (issue 23).

The ring AllGather whose steps overlap (tests/verify/corpus/race_async_allgather_ring_overlap.strata:
each step's forward awaited after the step's barrier; the verifier refuses it) is built and run
WITHOUT the verifier (tests/verify/unverified_worker.py, as tests/verify/test_mutations.py's
oracle runs do) at world 3, with the model's SDMA copies given seeded latencies of their own
(STRATA_CPU_SDMA_DELAY_US, STRATA_CPU_SDMA_DELAY_SEED; runtime/README.md, "SDMA latency"): the
next step's forward, itself an SDMA copy, reads the block while the previous rank's copy into it is
still in flight, and the run is WRONG against torch. The corrected schedule (the await before the
barrier, good_async_allgather_ring.strata), verified, runs OK in the same run. Without the delays,
or with one latency for every copy (the consumer's copy then waits as long as the producer's), the
racy schedule runs OK: that is what the seeded latencies add (measured when this test was written).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stratac import verify
from stratac.diagnostics import Source
from stratac.lang import frontend
from stratac.tools.run import runner

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
sys.path.insert(0, str(HERE))
import verifykit  # noqa: E402
# each copy lands 0..20 ms after its post (ample against a barrier's latency on a loaded machine;
# each step's await costs at most that); the seed fixes which copy gets which latency
DELAYS = {"STRATA_CPU_SDMA_DELAY_US": "20000", "STRATA_CPU_SDMA_DELAY_SEED": "23"}


def _mutations():
    """tests/verify/test_mutations.py's run helpers (run_mutant, the unverified ranks)."""
    return verifykit.mutations()


def _cache() -> Path:   # the mutants' build cache (test_mutations.cache_dir)
    return Path(os.environ.get("STRATAC_TEST_MUTANT_CACHE", Path.home() / ".cache" / "stratac-test-mutants"))


@pytest.mark.slow
def test_an_async_copy_awaited_after_the_barrier_runs_wrong(tmp_path, monkeypatch):
    """The corrected schedule runs OK under the seeded SDMA delays; the racy one does not: some
    call is WRONG, or the CPU model refuses it first (its SDMA ledger: a rank read bytes of a
    peer's SDMA copy announced by a signal raised before that copy's quiet, whatever the timing;
    runtime/README.md). Each runs on rank processes of its own: a refusal ends the job."""
    m = _mutations()
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(_cache()))
    for k, v in DELAYS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(runner, "compile_schedules", m._unverified_worker().compile_unverified)
    monkeypatch.setattr(runner, "Rank", m._UnverifiedRanks())
    racy = (CORPUS / "race_async_allgather_ring_overlap.strata").read_text()
    good = (CORPUS / "good_async_allgather_ring.strata").read_text()
    (s_racy,) = frontend.schedules(Source("racy.strata", racy))
    (s_good,) = frontend.schedules(Source("good.strata", good))
    assert not all(r.ok for r in verify.verify_worlds(s_racy, [3]))
    assert all(r.ok for r in verify.verify_worlds(s_good, [3]))

    world, cases = 3, m.collective_cases(3)

    def run(name, source):
        path = tmp_path / f"{name}.strata"
        path.write_text(source, encoding="utf-8")
        return runner.run(runner.RunSpec(file=str(path), world=world, cases=cases, iters=1, warmup=0,
                                         cores=4, timeout=10), echo=lambda line: None)

    out = run("good", good)
    assert not out.failures, out.failures
    assert len(out.results) == world * len(cases) and all(r["ok"] for r in out.results), \
        [r for r in out.results if not r["ok"]]
    out = run("racy", racy)
    wrong = [r for r in out.results if not r["ok"]]
    refused = [f for f in out.failures if "only the quiet says the copy landed" in f]
    assert wrong or refused, ("the racy schedule ran OK under the seeded SDMA delays", out.failures)
    assert all("expected" in r["why"] for r in wrong), wrong
    assert len(refused) == len(out.failures), out.failures
