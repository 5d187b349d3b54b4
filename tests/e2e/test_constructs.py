"""Constructs the examples never run (tests/e2e/constructs.strata), on real rank processes of the
CPU build through the runner `stratac run` uses, every result checked against torch: `on auto`
on both sides of its 256 KiB threshold, `if ... else` on `<`, `<=`, `>`, `>=` of the rank and of a
size, out-of-place broadcast and reduce at every root, pieces cut by min, max and a conditional,
a ReduceScatter that calls the shipped one (an imported out-of-place callee), one that calls the
shipped ring (a callee with a scratch buffer), an AllReduce that calls the two-level one (a callee
with teams) and an AllGather
with a stage per peer (a loop over peers around stages), in-place AllGather, ReduceScatter and
AllToAll. The engine counters say which arm ran:
an SDMA copy counts in `sdma`, a vector-core copy in `mte_out`, each of the world's n-element
blocks once per rank."""

from pathlib import Path

import pytest
import runkit

from stratac.tools.run import runner

FILE = Path(__file__).resolve().parent / "constructs.strata"
AUTO_MIN = 256 << 10   # dsl/README.md: `auto` sends each core's piece of a stage to SDMA from 256 KiB up
# A stage's bytes are split evenly over the cores; with as many cores as ranks each core takes one
# whole n-element copy of the push, so a piece is a copy: f32 counts just below the threshold and at it
BELOW, AT = AUTO_MIN // 4 - 8, AUTO_MIN // 4


def _run(world, cases):
    out = runkit.run(FILE, world, cases, iters=1, cores=world)
    assert out.failures == [] and out.exit_code == 0, out.failures
    wrong = [(r["schedule"], r["rank"], r["count"], r["why"]) for r in out.results if not r["ok"]]
    assert wrong == []
    return out.results


def engine(r) -> str:
    sdma = sum(c["sdma"] for c in r["counters"])
    aiv = sum(c["mte_out"] for c in r["counters"])
    nbytes = r["world"] * r["count"] * 4
    if (sdma, aiv) == (nbytes, 0):
        return "sdma"
    if (sdma, aiv) == (0, nbytes):
        return "aiv"
    return f"sdma {sdma} B, aiv {aiv} B of {nbytes} B"


@pytest.mark.parametrize("world", [4])
def test_constructs_run_correctly_and_take_the_arms_they_say(world):
    cases = [runner.Case(dtype="f32", count=count, op=op, root=root)
             for count, op, root in ((BELOW, "sum", 0), (AT, "max", world - 1), (1001, "min", world // 2))]
    results = _run(world, cases)
    by = {(r["schedule"], r["rank"], r["count"]): r for r in results}
    schedules = ("allgather_auto", "allgather_ordered", "broadcast_oop", "reduce_oop", "allgather_exprs",
                 "reducescatter_called", "reducescatter_ring_called", "allreduce_hierarchical_called",
                 "allgather_peer_stages", "allgather_in_place",
                 "reducescatter_in_place", "alltoall_in_place")
    assert set(by) == {(s, rank, c.count) for s in schedules for rank in range(world) for c in cases}
    for count in (BELOW, AT, 1001):
        want = "sdma" if count * 4 >= AUTO_MIN else "aiv"
        assert [engine(by["allgather_auto", r, count]) for r in range(world)] == [want] * world, count
        # rank 0: rank < 2, rank <= 0; rank 1: rank < 2 only; rank 3: rank > 2; rank 2: n >= 4096
        arms = ["sdma", "aiv", "sdma" if count >= 4096 else "aiv", "aiv"][:world]
        assert [engine(by["allgather_ordered", r, count]) for r in range(world)] == arms, count
        # min(n, max(1024, n / 2)) elements of each peer's block by SDMA (and the own block), the
        # rest, (n - cut if n > cut else 0), by the vector cores
        cut = min(count, max(1024, count // 2))
        for r in range(world):
            ctr = by["allgather_exprs", r, count]["counters"]
            assert (sum(c["sdma"] for c in ctr), sum(c["mte_out"] for c in ctr)) == \
                (4 * (count + (world - 1) * cut), 4 * (world - 1) * (count - cut)), (r, count)
