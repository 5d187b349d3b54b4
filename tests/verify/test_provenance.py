"""The contract check by provenance, against values computed by hand.

Every element of every rank's buffers starts as a distinct 64-bit tag; copies move tags, reductions
add them mod 2^64. These tests run the verifier's simulation and compare its final state with
what the algebra of each schedule says it must be, independently of the verifier's own notion of
the contract; then they check the verdict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratac import ir, verify
from stratac.diagnostics import Codes, Source
from stratac.ir.instantiate import instantiate
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]

TWOSHOT = """schedule twoshot(x: sym T[n]) implements allreduce(x, {op}) {{
  part = split(x, world)
  barrier
  on aiv: part[rank] = {op}(part[rank]@p for p in ranks)
  barrier
{again}  on sdma: for p in peers: part[rank]@p = part[rank]
  barrier
}}"""

AGAIN = """  on aiv: part[rank] = {op}(part[rank]@p for p in ranks)
  barrier
"""


def schedule(op: str = "sum", again: bool = False) -> ir.Schedule:
    s, = frontend.schedules(Source("p.strata", TWOSHOT.format(
        op=op, again=AGAIN.format(op=op) if again else "")))
    return s


def simulate(s: ir.Schedule, world: int, n: int):
    """(initial tags of x per rank, final x per rank) from the verifier's simulation."""
    inst = instantiate(s, world, {"n": n})
    ex = verify.timeline.Execution(inst)
    assert ex.run() == []
    init = [np.asarray(ex.values.init[(r, "x")]) for r in range(world)]
    cur = [np.asarray(ex.values.cur[(r, "x")]) for r in range(world)]
    return init, cur


def part_bounds(n: int, world: int, i: int) -> tuple[int, int]:
    base, extra = divmod(n, world)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


def wrap(values) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.array(values, dtype=np.uint64)


@pytest.mark.parametrize("world, n", [(1, 1), (2, 5), (3, 7), (4, 13)])
def test_twoshot_leaves_the_sum_of_all_tags_everywhere(world, n):
    init, cur = simulate(schedule(), world, n)
    with np.errstate(over="ignore"):
        total = np.zeros(n, dtype=np.uint64)
        for t in init:
            total += t
    for r in range(world):
        assert np.array_equal(cur[r], total)
    assert len({int(v) for t in init for v in t}) == world * n      # tags are distinct
    assert verify.verify(schedule(), world, {"n": n}).ok


@pytest.mark.parametrize("world, n", [(2, 5), (3, 7), (4, 6)])
def test_double_counting_is_rejected(world, n):
    # Reduce-scatter twice: the second pass adds the peers' untouched slices to the total again.
    # By hand, element i of part q ends up on every rank as
    #   (sum over p of t_p[i]) + (sum over p != q of t_p[i]) = 2 * sum_p t_p[i] - t_q[i].
    s = schedule(again=True)
    init, cur = simulate(s, world, n)
    with np.errstate(over="ignore"):
        for q in range(world):
            lo, hi = part_bounds(n, world, q)
            for i in range(lo, hi):
                total = wrap([0])
                for p in range(world):
                    total += wrap([int(init[p][i])])
                want = wrap([2]) * total - wrap([int(init[q][i])])
                for r in range(world):
                    assert cur[r][i] == want[0], (q, i, r)
    res = verify.verify(s, world, {"n": n})
    d, = res.diagnostics
    assert d.code == Codes.CONTRACT
    assert "x@0[0] should be the sum over all ranks of x[i]" in d.message
    assert "a combination with some contribution missing or counted twice" in d.message
    assert "elements are wrong" in d.message           # every element is wrong
    assert (d.span.line, d.span.col) == (1, TWOSHOT.index("allreduce") + 1)  # the contract


def test_reducing_twice_at_world_one_is_accepted_as_it_adds_nothing():
    # With one rank the second pass adds nothing (there are no peers): x is reduced once, correct,
    # so the verifier accepts it (at worlds 2-4 it is rejected: test_double_counting_is_rejected).
    assert verify.verify(schedule(again=True), 1, {"n": 3}).ok


def test_max_is_held_to_exactly_once():
    # max(a, a) = a, so reducing twice with max would be harmless on real data; the verifier is
    # conservative and rejects it anyway, as documented.
    assert verify.verify(schedule("max"), 3, {"n": 4}).ok
    res = verify.verify(schedule("max", again=True), 3, {"n": 4})
    assert [d.code for d in res.diagnostics] == [Codes.CONTRACT]
    assert "should be the max over all ranks of x[i]" in res.diagnostics[0].message


def test_missing_contribution_names_the_tag_it_found():
    s, = frontend.schedules(Source("p.strata", """
schedule s(x: sym T[n]) implements allreduce(x, sum) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = sum(part[rank]@p for p in ranks)
  barrier
}"""))
    # part r is reduced on rank r only and never pushed: rank 0's part 1 still holds its own input
    init, cur = simulate(s, 2, 4)
    assert np.array_equal(cur[0][2:], init[0][2:]) and np.array_equal(cur[1][:2], init[1][:2])
    d, = verify.verify(s, 2, {"n": 4}).diagnostics
    assert d.code == Codes.CONTRACT
    assert "x@0[2] should be the sum over all ranks of x[i], but it holds x@0[2] as the call " \
           "found it; 2 elements are wrong" in d.message


def test_allgather_final_state_is_the_concatenation():
    s, = frontend.schedules(frontend.load_source(ROOT / "examples" / "allgather_push.strata"))
    world, n = 3, 4
    inst = instantiate(s, world, {"n": n})
    ex = verify.timeline.Execution(inst)
    assert ex.run() == []
    xs = [np.asarray(ex.values.init[(p, "x")]) for p in range(world)]
    for r in range(world):
        assert np.array_equal(ex.values.cur[(r, "out")], np.concatenate(xs))
        assert np.array_equal(ex.values.cur[(r, "x")], xs[r])
    assert verify.verify(s, world, {"n": n}).ok
