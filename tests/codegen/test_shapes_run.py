"""The kernels of tests/codegen/shapes.strata (shapes the examples lack: ranges, a split into a
constant number of parts, a fixed element type, conditions with %) built and run on the CPU model,
every result checked against torch: the readable text computes what the IR says."""

from pathlib import Path

import pytest

from stratac.tools.run import runner

SHAPES = Path(__file__).resolve().parent / "shapes.strata"


@pytest.mark.parametrize("world", [3, 4])
def test_shapes_run_correctly(world):
    cases = [runner.Case(dtype="i32", count=count, op="sum", root=root)
             for count, root in ((1, world - 1), (1001, 0), (4099, world // 2))]
    spec = runner.RunSpec(file=str(SHAPES), world=world, cases=cases, iters=1, warmup=0, cores=4,
                          timeout=60)
    out = runner.run(spec, echo=lambda line: None)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * 3
    assert [r for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0
