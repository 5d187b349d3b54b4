"""Predictions of MoE and AllToAllV schedules: the routing constructs' costs, built from the sample
routing, against hand-computed values on the tiny machine; the prefill schedules against the
staging baseline on the shipped machine file; the --tokens syntax."""

import pytest
from simkit import C0, E1, MOE, ROOT, _moe_cost, example, schedule

from stratac.ir import passes
from stratac.lang import frontend
from stratac.tools.options import parse_counts
from stratac.tools.simulate.machine import Machine
from stratac.tools.simulate.moe import MoeSpec, predict_moe
from stratac.tools.simulate.sample_routing import Routed
from stratac.tools.simulate.stage_cost import SCALAR_ELEMENT_US

# ---- MoE routing on the tiny machine: built from the sample routing, by hand ----
# c0 = SCALAR_CALL_US per routing call, e = SCALAR_ELEMENT_US per id/count/offset (assumptions)

def test_moe_place_to_one_peer_is_rows_over_the_link(tmp_path, tiny):
    # routing `single`: every token picks expert 0, which lives on rank 0; rank 1 sends all its rows
    s = schedule(tmp_path, MOE.format(engine="aiv"))
    T, H, rb = 100, 256, 256 * 2                      # bf16 rows of 512 bytes
    preds = predict_moe(s, tiny, 2, [T], MoeSpec(hidden=H, topk=1, experts=2, routing="single"),
                        "bf16")
    p = preds[0]
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    histogram = C0 + (T + 2) * E1 + 1.0               # core 0 reads 100 ids, writes 2 counts
    counts = 8 / 500 + 5.0 + 1.0 + 3.0                # one i32 count row (8 bytes, not 4: bf16 kernel)
    exscan = C0 + (2 * 2 + 2) * E1 + 1.0              # world x experts counts read, 2 offsets written
    place = T * rb / 500 + 1.0 + 3.0                  # 100 rows over rank 1's link at 0.5 GB/s
    assert T * rb / 2e3 + C0 + 3 * T * E1 < T * rb / 500   # the core (ids, rows) is faster than the link
    agreement = barrier                               # the ranks' agreement on the call, first
    assert p.time_us == pytest.approx(10.0 + agreement + histogram + barrier + counts + barrier + exscan
                                      + place + barrier)
    assert p.breakdown_us["fabric"] == pytest.approx(T * rb / 500)
    assert p.breakdown_us["scalar"] == pytest.approx(2 * C0 + (T + 2 + 6) * E1)
    assert p.bound == "fabric"
    # rank 0 receives every row, rank 1 none: the mean is what a rank receives
    assert p.moe["received_rows"] == T and p.moe["received_rows_max"] == 2 * T
    assert p.size == T * rb
    assert p.algbw == pytest.approx(T * rb / p.time_us / 1e3)


def test_moe_place_on_sdma_posts_one_copy_per_row(tmp_path, tiny):
    s = schedule(tmp_path, MOE.format(engine="sdma"))
    T, rb = 100, 512
    cost = _moe_cost(s, tiny, 2, T, "single", stage=4)
    scan = C0 + (T + T + T) * E1      # count the routed ids, scan to the last one, read 100 offsets
    # one queue: 100 rows at 0.5 GB/s and 100 posts, after the core's scalar work
    assert cost.busy_us[1] == pytest.approx(scan + T * rb / 500 + T * 5.0)
    assert cost.scalar_us[1] == pytest.approx(scan)
    assert cost.category[1] == "sdma"
    assert cost.time_us[1] == pytest.approx(cost.busy_us[1] + 1.0 + 3.0)
    assert cost.time_us[0] == pytest.approx(cost.busy_us[0] + 1.0)   # rank 0's rows stay local


def test_moe_place_splits_the_routed_rows_evenly_over_the_cores(tmp_path, tiny):
    # 7 routed rows on 4 cores: core c takes rows [7c/4, 7(c+1)/4): 1, 2, 2, 2; the last core has
    # scanned all 7 ids twice (count, then up to its last row)
    four = Machine(**{**tiny.__dict__, "vector_cores": 4})
    s = schedule(tmp_path, MOE.format(engine="aiv"))
    rows, scanned = Routed.sample("single", 1, 7, 1, 1).place_split(4)
    assert rows.tolist() == [[1, 2, 2, 2]] and scanned.tolist() == [[8, 10, 12, 14]]
    cost = _moe_cost(s, four, 1, 7, "single", stage=4, cores=4)
    assert cost.busy_us[0] == pytest.approx(C0 + (14 + 2) * E1 + 2 * 512 / 2e3)
    assert cost.category[0] == "aiv"


def test_moe_gather_by_hand(tiny):
    s = passes.pipeline(frontend.schedules(frontend.load_source(
        ROOT / "examples" / "moe_prefill.strata"))[1], passes.Options())
    T, H, rb = 100, 256, 512
    p = predict_moe(s, tiny, 2, [T], MoeSpec(hidden=H, topk=1, experts=2, routing="single"),
                    "bf16")[0]
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    exscan = C0 + 6 * E1 + 1.0
    # rank 1 reads its 100 rows from rank 0 over its link (102.4 us); its core: 100 rows in (25.6 us),
    # 100 token rows out (12.8 us), f32 vector passes: 3 per entry, 2 per token (500 x 1 KiB / 8 GB/s)
    core = (100 * 3 + 100 * 2) * H * 4 / 8e3 + C0 + (T + 2 * T) * E1
    assert core < T * rb / 500
    gather = T * rb / 500 + 1.0 + 3.0
    assert p.time_us == pytest.approx(10.0 + exscan + barrier + gather + barrier)
    assert p.bound == "fabric"


def test_moe_typed_count_rows_move_as_their_own_bytes(tmp_path, tiny):
    # the count row is 2 i32 = 8 bytes whatever the token dtype (strata::Ratio)
    s = schedule(tmp_path, MOE.format(engine="aiv"))
    for elem in (2, 4):
        cost = _moe_cost(s, tiny, 2, 4, "uniform", stage=2, elem=elem)
        assert cost.busy_us[0] == pytest.approx(8 / 500 + 5.0)


# ---- against the real machine file ----


def test_moe_staging_baseline_is_predicted_slower(cm384):
    world, tokens = 16, [64, 1024]
    prefill = [predict_moe(s, cm384, world, tokens) for s in
               frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_prefill.strata"))]
    staged = [predict_moe(s, cm384, world, tokens) for s in
              frontend.schedules(frontend.load_source(ROOT / "examples" / "moe_staging_baseline.strata"))]
    for a, b in zip(prefill[0], staged[0]):                   # dispatch
        assert a.count == b.count and a.size == b.size and a.dtype == "bf16"
        assert b.time_us > a.time_us
        # `win = recv` copies the whole window (world * tokens * topk rows): read and written in HBM
        window = world * a.count * 8 * 7168 * 2
        assert b.time_us - a.time_us >= 2 * window / (cm384.hbm_gbps * 1e3)
        assert b.moe["heap_bytes"] > a.moe["heap_bytes"]
    for a, b in zip(prefill[1], staged[1]):                   # the same combine
        assert b.time_us == pytest.approx(a.time_us)
    big = prefill[0][-1]                                      # 1024 tokens: the links set the pace
    assert big.bound == "fabric"
    assert big.moe["received_rows"] == pytest.approx(1024 * 8)   # uniform: topk rows per token
    assert big.algbw < cm384.fabric_gbps * world / (world - 1)


def test_moe_large_world_stays_cheap(cm384):
    s = example("moe_prefill")
    p = predict_moe(s, cm384, 384, [16])[0]
    assert p.moe["experts"] == 8 * 384 and p.time_us > 0
    # exscan reads the world x experts count table on one core: quadratic in the world at 8 experts
    # per rank, and the largest share of the call here
    assert p.bound == "scalar"
    assert p.breakdown_us["scalar"] >= 384 * 3072 * SCALAR_ELEMENT_US


def test_token_sweeps_read_like_the_bench():
    """simulate --tokens takes bench's syntax (stratac.tools.options): one reader for both."""
    assert parse_counts("16:4096") == [16 << i for i in range(9)]
    assert parse_counts("1,8:32:4") == [1, 8, 32]
    assert parse_counts("4K") == [4096]
    with pytest.raises(ValueError, match="not a token count"):
        parse_counts("4.5")
