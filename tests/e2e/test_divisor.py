"""Divisor parameters end to end (dsl/README.md, "Schedules and parameters"): the schedules of
tests/verify/corpus/good_divisor_team_size.strata (a two-level AllReduce with nodes of g ranks, an
AllGather with a flag array, a scratch buffer and a step loop sized by g) run through `stratac
run`'s runner with `--param g=D` for every divisor of the world, on rank processes of the CPU
build, each result checked against torch. tests/api/ranks.py (divisor_params) calls them from
Python, with a refused value and ranks that disagree; translation validation runs the file
against the verifier's memory at worlds 1-9."""

from pathlib import Path

import runkit

from stratac.tools.run import runner

FILE = Path(__file__).resolve().parents[1] / "verify" / "corpus" / "good_divisor_team_size.strata"


def test_every_divisor_runs_correctly():
    world = 4
    # a count per divisor, so that each result names the g it ran with
    counts = {1: 1001, 2: 1002, 4: 1003}
    cases = [runner.Case(dtype=d, count=counts[g], op="max", params={"g": g})
             for g in counts for d in ("f32", "bf16")]
    out = runkit.run(FILE, world, cases, iters=1, cores=world)
    assert out.failures == [] and out.exit_code == 0, out.failures
    assert [r for r in out.results if not r["ok"]] == []
    ran = {(r["schedule"], r["count"], r["dtype"]) for r in out.results}
    assert ran == {(s, counts[g], d) for s in ("two_level", "node_gather") for g in counts
                   for d in ("f32", "bf16")}
