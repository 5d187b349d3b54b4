"""A step-loop bound whose top operator binds looser than `<` (here `&`: the rings of a
hierarchical AllReduce in the style of msccl-tools take `(world & -world) - 1 & 3` steps) runs its
stated number of steps: the kernel once printed `s_ < X & 3`, which C++ reads as `(s_ < X) & 3`,
so that at world 8 each ring took 7 steps instead of 3. Run on the CPU build against torch at the
worlds where the two readings differ (8) and where they agree (4, 6)."""

from pathlib import Path

import pytest
import runkit

from stratac.tools.run import runner

FILE = Path(__file__).resolve().parent / "hierarchical_ring.strata"


@pytest.mark.parametrize("world", [8, pytest.param(4, marks=pytest.mark.slow),
                                   pytest.param(6, marks=pytest.mark.slow)])
def test_loop_bound_with_a_bitwise_top_operator_runs_correctly(world):
    cases = [runner.Case(dtype="f32", count=count, op=op) for count, op in ((1000, "sum"), (4099, "max"))]
    out = runkit.run(FILE, world, cases, iters=1, cores=2, timeout=120)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    wrong = [(r["rank"], r["count"], r["op"], r["why"]) for r in out.results if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0
