"""The step-loop examples (ring AllReduce, ring ReduceScatter (also in place, and through a FIFO),
PAT ReduceScatter (binomial trees through FIFOs per dim, world 5 not a power of two),
recursive halving-doubling AllReduce, binomial-tree Broadcast; the pipelined ring AllGather,
Bruck's AllToAll and AllGather and the PAT AllGather, which take no reduction) on the CPU build
at worlds 3, 4 and 5 where they allow it: f32 and bf16, sum and max where there is a reduction,
one element and an uneven count, roots at both ends; results checked against torch by the runner.
And a schedule's world constraint, refused at the call with the constraint and its source line."""

from pathlib import Path

import pytest
import runkit

from stratac import ir
from stratac.ir import passes
from stratac.lang.frontend import load_source, schedules
from stratac.tools.run import runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEP_LOOPS = ["allreduce_ring", "allreduce_ring_reduce_send", "reducescatter_ring", "reducescatter_ring_fifo",
              "reducescatter_pat",
              "reducescatter_ring_in_place", "allreduce_halving_doubling", "allreduce_double_tree",
              "broadcast_tree"]


def _supported(path: Path, world: int) -> bool:
    return all(ir.unmet_requirement(s, world) is None for s in schedules(load_source(str(path))))


def _run(path, world, cases):
    return runkit.run(path, world, cases, timeout=120)


# Worlds 1-4 of every example (these included) run in tests/e2e/test_run.py with 14 cases each (f32,
# f16, bf16, i32; sum, max, min; 1 to 4099 elements and 3 MiB); here the worlds past that: 5, and 6
# where the hierarchical schedules have both levels.
@pytest.mark.parametrize("world", [5])
def test_step_loop_examples_run_correctly(world):
    files = [EXAMPLES / f"{name}.strata" for name in STEP_LOOPS]
    keep = [p for p in files if _supported(p, world)]
    assert keep == files
    cases = [runner.Case(dtype=d, count=count, op=op, root=root) for d in ("f32", "bf16")
             for op in ("sum", "max") for count, root in ((1, world - 1), (4099, 0))]
    out = _run(keep, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * len(keep)
    wrong = [(r["schedule"], r["rank"], r["dtype"], r["count"], r["op"], r["why"])
             for r in out.results if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [5])
def test_chunked_and_bruck_examples_run_correctly(world):
    keep = [EXAMPLES / "allgather_ring_pipelined.strata", EXAMPLES / "alltoall_bruck.strata",
            EXAMPLES / "allgather_bruck.strata",   # at 5 its steps 1 and 2 wrap past the end of out
            EXAMPLES / "allgather_pat.strata"]     # at 5 sub-steps 5-7 are skipped (no receiver)
    assert all(_supported(p, world) for p in keep)
    cases = [runner.Case(dtype=d, count=count) for d in ("f32", "bf16") for count in (1, 4099)]
    out = _run(keep, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * len(keep)
    assert [r for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [5, 6])
def test_hierarchical_allreduce_over_teams_runs_correctly(tmp_path, world):
    """Teams: nodes of min(lowest set bit of world, 8) ranks; world 3 and 5 give nodes of one
    rank (the lane is the world), 4 one node of four (the lane is one rank), 6 three nodes of two
    (both levels)."""
    path = EXAMPLES / "allreduce_hierarchical.strata"
    assert _supported(path, world)
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "bf16")
             for op in ("sum", "max") for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert [(r["rank"], r["dtype"], r["count"], r["op"], r["why"]) for r in out.results
            if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [5, 7])
def test_allreduce_over_unequal_groups_runs_correctly(tmp_path, world):
    """`team g = groups(world / 2, world - world / 2)`: groups of 2 and 3 ranks at world 5 (HCCL
    AHC's case), 3 and 4 at world 7; 6 chunks at 5, 12 at 7, cut at different places by the two
    groups."""
    path = EXAMPLES / "allreduce_groups.strata"
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "bf16")
             for op in ("sum", "max") for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert [(r["rank"], r["dtype"], r["count"], r["op"], r["why"]) for r in out.results
            if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [5, 6, pytest.param(7, marks=pytest.mark.slow),
                                   pytest.param(9, marks=pytest.mark.slow)])
def test_nhr_allreduce_runs_correctly(tmp_path, world):
    """HCCL's NHR with its renumbering and the port without it: at 5 every step goes block by
    block (odd world, the renumbering unshuffles once), at 6 step 0 is one run and the others one
    block, at 7 and 9 steps of several blocks go one by one (world 8: tests/e2e/test_run.py)."""
    path = EXAMPLES / "allreduce_nhr.strata"
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "bf16")
             for op in ("sum", "max") for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases) * 2
    assert [(r["schedule"], r["rank"], r["dtype"], r["count"], r["op"], r["why"])
            for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [5, 6])
def test_hierarchical_allreduce_by_composition_runs_correctly(tmp_path, world):
    """Composition: the ring AllReduce called on the lane team over the node's part (world 6:
    nodes of two, lanes of three, the ring on every lane; 4: lanes of one; 3, 5: the lane is the
    world); the ring is imported (allreduce_ring.strata), so the file's one schedule is the caller."""
    path = EXAMPLES / "allreduce_hierarchical_composed.strata"
    assert [s.name for s in schedules(load_source(str(path)))] == ["allreduce_hierarchical_composed"]
    cases = [runner.Case(dtype=d, count=count, op=op) for d in ("f32", "bf16")
             for op in ("sum", "max") for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert {r["schedule"] for r in out.results} == {"allreduce_hierarchical_composed"}
    assert [(r["schedule"], r["rank"], r["dtype"], r["count"], r["op"], r["why"]) for r in out.results
            if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [6])
def test_hierarchical_broadcast_by_composition_runs_correctly(world):
    """Composition with a rank parameter: the tree Broadcast called on the lane team with the
    root's node as its root, `(root / T)` (world 6: nodes of two, lanes of three); roots 0, 3
    (node 1, place 1) and 5, one element (part 1 empty) and an uneven count."""
    path = EXAMPLES / "broadcast_hierarchical_composed.strata"
    assert [s.name for s in schedules(load_source(str(path)))] == ["broadcast_hierarchical_composed"]
    cases = [runner.Case(dtype=d, count=count, root=root) for d in ("f32", "bf16")
             for root in (0, 3, 5) for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert [(r["rank"], r["dtype"], r["count"], r["root"], r["why"]) for r in out.results
            if not r["ok"]] == []
    assert out.exit_code == 0


@pytest.mark.parametrize("world", [3, 4, 5])
def test_barriers_in_step_loops_run_correctly(world):
    """A barrier per ring step (world - 1 of them: the epoch advances by stamps that depend on the
    world), a team barrier in a loop over the team, and a flag after them; two calls in a row, so
    the second call's stamps must lie above every stamp of the first."""
    path = Path(__file__).resolve().parents[1] / "verify" / "corpus" / "good_barriers_in_step_loops.strata"
    s, = schedules(load_source(str(path)))
    lowered = passes.pipeline(s, passes.Options())
    assert lowered.stamps({"world": world, "n": 1}) == 1 + (world - 1) + (2 - world % 2) + 1
    cases = [runner.Case(dtype=d, count=count) for d in ("f32", "bf16") for count in (1, 4099)]
    out = _run(path, world, cases)
    assert out.failures == []
    assert len(out.results) == world * len(cases)
    assert [r for r in out.results if not r["ok"]] == []
    assert out.exit_code == 0


def test_a_call_on_a_world_the_schedule_excludes_names_the_constraint():
    out = _run(Path(__file__).resolve().parent / "requires_pow2.strata", 3, [runner.Case("f32", count=8)])
    assert out.exit_code != 0
    text = "\n".join(map(str, out.failures))
    assert "halving_doubling_pow2 does not support world 3: it requires world is pow2, " in text
    assert "requires_pow2.strata:12" in text
