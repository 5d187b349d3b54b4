"""Control blocks whose loops the cores share (stratac/ir/control.py), and one kept on core 0, run
on the CPU build with 2 core threads per rank (so that a core takes several trips of a loop, and
the rank's own trip falls to either core) and checked against torch. A trip no core takes leaves a
wait that never returns (the run ends at its deadline, naming the flag); a result that differs
from torch is reported per rank."""

from pathlib import Path

import pytest

from stratac.tools.run import runner

FILE = Path(__file__).resolve().parent / "shared_control.strata"
SCHEDULES = 5


@pytest.mark.parametrize("world", [3, 5])
def test_shared_control_blocks_run_correctly(world):
    cases = [runner.Case(dtype=d, count=count) for d in ("f32", "i32") for count in (1, 1001)]
    spec = runner.RunSpec(file=str(FILE), world=world, cases=cases, iters=2, warmup=0, cores=2,
                          timeout=60)
    out = runner.run(spec, echo=lambda line: None)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * SCHEDULES
    assert [r for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0
