"""MoE dispatch/combine and AllToAllV on the CPU build: real rank processes, every routing, every
token dtype, one token, float rows that are not a multiple of 32 bytes (the int8 examples:
test_moe_int8.py); dispatch, the stand-in expert step and combine each checked against torch
(stratac.tools.run.workload.MoeWorkload) bit for bit."""

from pathlib import Path

import pytest
import runkit
from routing_meta import routing_dma

from stratac import ir
from stratac.lang.frontend import load_source, schedules
from stratac.tools.run import runner
from stratac.verify.routing import ROUTINGS

ALL = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.strata"))
# the int8 examples run in test_moe_int8.py, at hidden sizes whose int8 rows are whole 32-byte
# blocks (a call refuses the odd ones below: docs/npu.md, "Peer window rows")
MOE = [p for p in ALL if any(s.contract.kind.moe for s in schedules(load_source(str(p))))
       and not any(b.dtype is ir.DType.I8 for s in schedules(load_source(str(p))) for b in s.params)]


_run = runkit.run

CASES = [
    runner.Case("f32", tokens=37, hidden=33, topk=2, routing="uniform"),
    runner.Case("bf16", tokens=37, hidden=33, topk=3, routing="skewed"),
    runner.Case("f16", tokens=37, hidden=65, topk=2, routing="single"),
    runner.Case("bf16", tokens=1, hidden=33, topk=2, routing="empty"),
    runner.Case("f32", tokens=29, hidden=7, topk=4, routing="sparse"),
]
assert {c.routing for c in CASES} == set(ROUTINGS)


@pytest.fixture(scope="module")
def moe_examples():
    return list(MOE)   # one job, each file its own module


def _schedules_per_case():
    return sum(len(schedules(load_source(str(p)))) for p in MOE)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_moe_example_runs_correctly(moe_examples, world):
    out = _run(moe_examples, world, CASES)
    assert out.failures == []
    assert len(out.results) == world * len(CASES) * _schedules_per_case()
    wrong = [(r["schedule"], r["rank"], r["dtype"], r["moe"]["routing"], r["why"])
             for r in out.results if not r["ok"]]
    assert wrong == []
    assert out.exit_code == 0


def test_dispatch_moves_each_routed_row_once_and_balances_the_cores(root):
    """Prefill dispatch under skewed routing: the vector cores carry every routed row exactly once
    plus the count rows (read into UB and written out; nothing by SDMA), and the cores share the
    rows evenly (the partition is by rows, not by expert or peer): max/mean per-core bytes at most
    1.1."""
    world, tokens, hidden, topk, cores = 2, 400, 64, 4, 8
    case = runner.Case("f32", tokens=tokens, hidden=hidden, topk=topk, routing="skewed")
    out = runner.run(runner.RunSpec(file=str(root / "examples" / "moe_prefill.strata"), world=world,
                                    cases=[case], iters=1, warmup=0, cores=cores, timeout=60),
                     echo=lambda line: None)
    assert out.exit_code == 0, out.failures
    from stratac.verify.routing import expert_ids
    experts = 4 * world
    for r in out.results:
        if r["moe"]["phase"] != "dispatch":
            continue
        ids = expert_ids("skewed", r["rank"], tokens, topk, experts, 0)
        routed = int((ids >= 0).sum())
        ctr = r["counters"]
        moved = routed * hidden * 4 + (world - 1) * experts * 4   # the rows and the count rows
        meta = routing_dma(ids, experts, world, cores)            # the routing metadata, per core
        assert sum(c["mte_out"] for c in ctr) == moved + sum(m[1] for m in meta)
        assert sum(c["mte_in"] for c in ctr) == moved + sum(m[0] for m in meta)
        assert sum(c["sdma"] + c["sdma_posts"] for c in ctr) == 0
        per_core = [c["mte_out"] - m[1] for c, m in zip(ctr, meta)]
        assert max(per_core) / (sum(per_core) / len(per_core)) <= 1.1


def test_staging_baseline_shows_its_copies(root):
    """The buffer-centric dispatch copies the tokens into a send buffer and the whole receive
    buffer out again through the vector cores, on top of what the zero-copy dispatch moves through
    them (its count rows and routed rows, the same in both)."""
    world, tokens, hidden, topk = 2, 16, 32, 2
    case = runner.Case("f32", tokens=tokens, hidden=hidden, topk=topk, routing="uniform")
    recs = {}
    from stratac.verify.routing import expert_ids
    meta = sum(a + b for a, b in routing_dma(expert_ids("uniform", 0, tokens, topk, 4 * world, 0), 4 * world,
                                              world, 4))
    for name in ("moe_prefill", "moe_staging_baseline"):
        out = runner.run(runner.RunSpec(file=str(root / "examples" / f"{name}.strata"), world=world,
                                        cases=[case], iters=1, warmup=0, cores=4, timeout=60),
                         echo=lambda line: None)
        assert out.exit_code == 0, out.failures
        recs[name] = next(r for r in out.results if r["rank"] == 0 and r["moe"]["phase"] == "dispatch")
    aiv = {k: sum(c["mte_in"] + c["mte_out"] for c in r["counters"]) for k, r in recs.items()}
    experts = 4 * world       # the runner's default: 4 experts per rank
    assert recs["moe_prefill"]["moe"]["experts"] == experts
    routed = int((expert_ids("uniform", 0, tokens, topk, experts, 0) >= 0).sum())
    assert aiv["moe_prefill"] == 2 * (routed * hidden * 4 + (world - 1) * experts * 4) + meta
    x_bytes, window_bytes = tokens * hidden * 4, world * tokens * topk * hidden * 4
    assert aiv["moe_staging_baseline"] - aiv["moe_prefill"] == 2 * x_bytes + 2 * window_bytes
    # two more buffers on the heap: the send and receive buffers
    extra = recs["moe_staging_baseline"]["heap_user_bytes"] - recs["moe_prefill"]["heap_user_bytes"]
    assert extra >= x_bytes + window_bytes


@pytest.mark.slow
def test_every_moe_example_world_8(moe_examples):
    out = _run(moe_examples, 8, [CASES[1], CASES[4]])
    assert out.exit_code == 0, out.failures
    assert all(r["ok"] for r in out.results)


def test_place_on_sdma_quiets_within_the_queue_depth():
    """A place on SDMA (tests/e2e/moe_place_sdma.strata) posts one SQE per routed row: 400 tokens x
    top-4 over 4 cores is about 400 rows per core at each of 2 ranks, more than the model's SDMA queue
    depth (256 SQEs between quiets). The Mover quiets every kSdmaSqeLimit (192) SQEs, so the run is
    right (checked against torch) and every row went by SDMA, one SQE each; with the limit raised
    past the depth the model refuses the post (tests/mutants.py: sdma-sqe-limit-past-depth)."""
    world, tokens, hidden, topk = 2, 400, 64, 4   # _run launches 4 cores
    case = runner.Case("f32", tokens=tokens, hidden=hidden, topk=topk, routing="uniform")
    out = _run(Path(__file__).resolve().parent / "moe_place_sdma.strata", world, [case])
    assert out.failures == [] and out.exit_code == 0
    assert [r["why"] for r in out.results if not r["ok"]] == []
    from stratac.verify.routing import expert_ids
    experts = 4 * world
    seen = 0
    for r in out.results:
        if r["moe"]["phase"] != "dispatch":
            continue
        seen += 1
        routed = int((expert_ids("uniform", r["rank"], tokens, topk, experts, 0) >= 0).sum())
        ctr = r["counters"]
        assert sum(c["sdma"] for c in ctr) == routed * hidden * 4
        assert sum(c["sdma_posts"] for c in ctr) == sum(c["sdma_sqes"] for c in ctr) == routed
        assert max(c["sdma_sqes"] for c in ctr) > 256   # past the depth without the quiets
    assert seen == world
