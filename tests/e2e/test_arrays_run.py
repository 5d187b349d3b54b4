"""Integer arrays (`var t[K]`, `set t[i]`, `t[i]`) on the CPU build, checked against torch: the
halving-doubling AllReduce whose doubling walks the tables its halving filled (a partner and a
range per step, read back in reverse), the AllGather whose one stage pushes to the peers in the
order a table lists them (an element read per move, under the move loop), and the AllGather whose
table a loop over the peers fills (the kernel's loop must skip the running rank) and whose lets of
it are negative (the kernel must floor their %). A table the kernel filled or read wrongly sends a
part to the wrong peer or reduces the wrong range: a wrong result on some rank, or a wait that
never returns (the run ends at its deadline, naming the flag)."""

from pathlib import Path

import pytest
import runkit

from stratac.tools.run import runner

FILE = Path(__file__).resolve().parents[1] / "verify" / "corpus" / "good_array_tables.strata"
SCHEDULES = 3


@pytest.mark.parametrize("world", [4, 8])
def test_schedules_with_arrays_run_correctly(world):
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "i32")
             for count, op in ((1, "sum"), (1001, "max"), (4099, "sum"))]
    out = runkit.run(FILE, world, cases, timeout=120)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * SCHEDULES
    wrong = [(r["schedule"], r["rank"], r["dtype"], r["count"], r["why"]) for r in out.results
             if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0
