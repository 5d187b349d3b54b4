"""Every example on the CPU build: real rank processes, real shared memory, results checked
against torch (stratac.tools.run.workload) for every dtype and reduction, roots at both ends and in the
middle, one element, sizes that are not a multiple of 32 bytes or of the world size, and several
MiB. All examples run in one job per world size (`stratac run` of several files, each its own
module) to keep CI short; their kernels are the ones every other test of an example builds."""

import os
from pathlib import Path

import pytest
import runkit

from stratac import ir
from stratac.lang.frontend import load_source, schedules
from stratac.tools.run import runner

ALL = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.strata"))
# MoE dispatch/combine and AllToAllV take routed tokens, not a count (tests/e2e/test_moe.py)
MOE = [p for p in ALL if any(s.contract.kind.moe for s in schedules(load_source(str(p))))]
EXAMPLES = [p for p in ALL if p not in MOE]

DTYPES = ["f32", "f16", "bf16", "i32"]


def cases(world):
    out = [runner.Case(dtype=d, count=count, op=op, root=root) for d in DTYPES
           for count, op, root in ((1, "sum", world - 1), (1001, "max", 0), (4099, "min", world // 2))]
    return out + [runner.Case(dtype=d, size=3 << 20, op="sum", root=world // 2) for d in ("f32", "bf16")]


CASES = cases(1)


def _supports(path, world):
    """Whether every schedule of an example allows the world (its `requires`)."""
    return all(ir.unmet_requirement(s, world) is None for s in schedules(load_source(str(path))))


def _schedules_at(world):
    """The schedules of the examples that allow the world (a file may hold several: a composed
    schedule's callee is a schedule of its own)."""
    return sum(len(schedules(load_source(str(p)))) for p in EXAMPLES if _supports(p, world))


@pytest.fixture(scope="module")
def all_examples():
    """The examples that allow a world, run in one job (each file its own module, so that its
    kernels are the ones every other test of the example builds)."""
    return lambda world: [p for p in EXAMPLES if _supports(p, world)]


def _run(path, world, cases=CASES, **kw):
    return runkit.run(path, world, cases, **kw)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_example_runs_correctly(all_examples, world):
    out = _run(all_examples(world), world, cases(world))
    assert out.failures == []
    # every rank reported every case of every schedule, and every one matched torch
    assert len(out.results) == world * len(cases(world)) * _schedules_at(world)
    wrong = [(r["schedule"], r["rank"], r["dtype"], r["count"], r["op"], r["why"])
             for r in out.results if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0


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
    """Registration on allocation: nothing but the user's tensors and the sync area is on the heap."""
    world, n = 2, 1 << 20
    out = _run(root / "examples" / "allgather_push.strata", world, [runner.Case("f32", count=n)])
    assert out.exit_code == 0
    # one 64-byte line per barrier or flag slot, the status line, the two agreement records of 4
    # lines and the agreement's verdict line
    sync = (world + 4096) * 64 + 64 + 2 * 4 * 64 + 64
    for r in out.results:
        assert r["heap_user_bytes"] == n * 4 + n * world * 4
        assert r["heap_bytes"] - r["heap_user_bytes"] <= sync + 512


@pytest.mark.slow
def test_every_example_world_8(all_examples):
    out = _run(all_examples(8), 8, [runner.Case("f32", count=4099, op="max", root=5),
                                    runner.Case("bf16", count=33, op="sum", root=0)])
    assert out.exit_code == 0, out.failures
    assert len(out.results) == 8 * 2 * _schedules_at(8)
    assert all(r["ok"] for r in out.results)


def test_cores_follow_the_bytes_of_the_call(tmp_path):
    """Without --cores, a launch uses one vector core per 64 KiB of its largest buffer
    (stratac.host.cores), at most the SoC's 40 and, on the CPU model, at most the CPUs each of the
    two ranks has on this host: the CPU model's per-core counters of a 4 KiB two-shot AllReduce
    show one core that moved bytes, those of a 4 MiB one 40 (or the cap), each busy; --cores still
    fixes the number, above the cap too."""
    ex = Path(__file__).resolve().parents[2] / "examples" / "allreduce_twoshot.strata"
    spec = runner.RunSpec(file=str(ex), world=2, iters=1, warmup=0, timeout=60,
                          cases=[runner.Case(size=4096), runner.Case(size=256 << 10),
                                 runner.Case(size=4 << 20)])
    out = runner.run(spec, echo=lambda line: None)
    assert out.exit_code == 0, out.failures
    cap = max(1, len(os.sched_getaffinity(0)) // 2)
    for r in out.results:
        busy = [c for c in r["counters"] if c["mte_in"] + c["mte_out"] + c["sdma"] > 0]
        want = min({4096: 1, 256 << 10: 4, 4 << 20: 40}[r["size"]], cap)
        assert (r["cores"], len(r["counters"]), len(busy)) == (want, want, want), r
    fixed = runner.run(runner.RunSpec(file=str(ex), world=2, iters=1, warmup=0, timeout=60, cores=3,
                                      cases=[runner.Case(size=4096)]), echo=lambda line: None)
    assert fixed.exit_code == 0 and {r["cores"] for r in fixed.results} == {3}
