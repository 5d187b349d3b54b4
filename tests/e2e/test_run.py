"""Every example on the CPU build: real rank processes, real shared memory, results checked
against torch (stratac.workload) for every dtype, one element, a size that is not a multiple of
32 bytes or of the world size, and several MiB."""

from pathlib import Path

import pytest

from stratac import runner

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.strata"))

DTYPES = ["f32", "f16", "bf16", "i32"]
CASES = ([runner.Case(dtype=d, count=c) for d in DTYPES for c in (1, 1001)]
         + [runner.Case(dtype=d, size=3 << 20) for d in ("f32", "bf16")])


def _run(path, world, cases=CASES, **kw):
    spec = runner.RunSpec(file=str(path), world=world, cases=cases, iters=2, warmup=0, cores=4,
                          timeout=60, **kw)
    return runner.run(spec, echo=lambda line: None)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_correctly(example, world):
    out = _run(example, world)
    assert out.failures == []
    assert out.exit_code == 0
    # every rank reported every case, and every one matched torch
    assert len(out.results) == world * len(CASES)
    wrong = [(r["rank"], r["dtype"], r["count"], r["why"]) for r in out.results if not r["ok"]]
    assert wrong == []


def test_counters_show_the_engines_the_schedule_names(root):
    """Two-shot AllReduce: the reduce-scatter reads every peer's slice through UB (vector cores),
    the all-gather goes to SDMA; per rank, SDMA moves (world-1) slices of n/world elements."""
    world, n = 4, 1 << 16
    out = _run(root / "examples" / "allreduce_twoshot.strata", world, [runner.Case("f32", count=n)])
    assert out.exit_code == 0
    for r in out.results:
        ctr = r["counters"]
        sdma = sum(c["sdma"] for c in ctr)
        mte_in = sum(c["mte_in"] for c in ctr)
        mte_out = sum(c["mte_out"] for c in ctr)
        slice_bytes = n // world * 4
        assert sdma == (world - 1) * slice_bytes
        assert mte_in == world * slice_bytes       # one read of my slice from every rank
        assert mte_out == slice_bytes              # the reduced slice, written once
        assert sum(c["remote_write"] for c in ctr) == (world - 1) * slice_bytes


def test_heap_holds_only_user_tensors_and_flags(root):
    """Registration on allocation: nothing but the user's tensors and the flag area is on the heap."""
    world, n = 2, 1 << 20
    out = _run(root / "examples" / "allgather_push.strata", world, [runner.Case("f32", count=n)])
    assert out.exit_code == 0
    flags = (world + 4096) * 4
    for r in out.results:
        assert r["heap_user_bytes"] == n * 4 + n * world * 4
        assert r["heap_bytes"] - r["heap_user_bytes"] <= flags + 512


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_world_8(example):
    out = _run(example, 8, [runner.Case("f32", count=4099), runner.Case("bf16", count=33)])
    assert out.exit_code == 0, out.failures
    assert all(r["ok"] for r in out.results)
