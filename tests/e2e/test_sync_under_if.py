"""Barriers and flags under ifs, run on the CPU build and checked against torch: a condition true on
every rank, one true only for some world sizes (the hand-written ring's steps), both arms of a
rank-dependent if, and ifs whose arms pass different numbers of barriers. Before the epoch pass
stamped barriers under ifs, these broadcasts came out WRONG from world 3 and the ring hung at world
2 (a barrier stamped `epoch_ + 0` waited for nobody)."""

from pathlib import Path

import pytest

from stratac.tools.run import runner

CORPUS = Path(__file__).resolve().parents[1] / "verify" / "corpus"
FILES = ["good_barriers_under_if.strata", "good_ring_steps_under_if.strata"]
SCHEDULES = {"good_barriers_under_if.strata": 4, "good_ring_steps_under_if.strata": 1}


def cases(world):
    small = [runner.Case(dtype=d, count=count, root=root) for d in ("f32", "i32")
             for count, root in ((1, world - 1), (1001, 0), (4099, world // 2))]
    # large enough that a barrier that does not wait lets a rank forward data not yet landed
    return small + [runner.Case(dtype="f32", size=3 << 20, root=world // 2)]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_sync_under_if_runs_correctly(name, world):
    spec = runner.RunSpec(file=str(CORPUS / name), world=world, cases=cases(world), iters=2, warmup=0,
                          cores=4, timeout=60)
    out = runner.run(spec, echo=lambda line: None)
    assert out.failures == []
    assert len(out.results) == world * len(cases(world)) * SCHEDULES[name]
    wrong = [(r["schedule"], r["rank"], r["dtype"], r["count"], r["why"]) for r in out.results
             if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [2, 4, 6])
def test_barriers_only_the_node_leaders_pass_run_correctly(world):
    """good_leader_barriers.strata: the lane barriers inside `if node.rank == 0` are passed by the
    node leaders alone, and every rank meets at the node barriers after them (a barrier's stamp is
    its place in the program). Sums and maxima of every rank's input, against torch."""
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "i32")
             for count, op in ((1, "sum"), (1001, "max"), (4099, "sum"))]
    cases.append(runner.Case(dtype="f32", size=3 << 20, op="sum"))
    spec = runner.RunSpec(file=str(CORPUS / "good_leader_barriers.strata"), world=world, cases=cases,
                          iters=2, warmup=0, cores=4, timeout=60)
    out = runner.run(spec, echo=lambda line: None)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert [r for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0
