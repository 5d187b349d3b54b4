"""What an SDMA copy costs in the model: its core's descriptor work per 1 MiB SQE and per quiet, the
split of a post into SQEs and of a long piece into posts of at most 192 SQEs, and `auto` deciding
per core piece, as Mover does (runtime/device/strata_device.h). Hand-computed on the tiny machine;
the constants are checked against the device header and the CPU model."""

import re

import pytest
from simkit import C0, E1, MOE, PUSH, ROOT, _moe_cost, schedule

from stratac.ir import passes
from stratac.tools.simulate.machine import Machine
from stratac.tools.simulate.moe import MoeSpec, predict_moe
from stratac.tools.simulate.predict import predict_count
from stratac.tools.simulate.stage_cost import SDMA_SQE_LIMIT, stage_cost
from stratac.tools.simulate.template import lengths, template

MIB = 1 << 20


def test_constants_match_the_kernel_and_the_cpu_model(cm384):
    dev = (ROOT / "runtime" / "device" / "strata_device.h").read_text()
    assert int(re.search(r"kSdmaSqeLimit = (\d+);", dev).group(1)) == SDMA_SQE_LIMIT
    assert re.search(r"kSdmaSqeBytes = 1 << 20;", dev) and cm384.sqe_bytes == MIB
    model = (ROOT / "runtime" / "cpu" / "src" / "model_internal.h").read_text()
    assert float(re.search(r"kSdmaSqeCostUs = ([0-9.]+);", model).group(1)) == cm384.sqe_issue_us


def test_tiny_posts_pay_their_core_per_sqe(tmp_path, tiny):
    # place on SDMA, routing `single` at world 2: rank 1 posts its 100 rows of 512 B to rank 0, one
    # SDMA post (one SQE) each. At 20 us per SQE the core's descriptor work, not the queue or the
    # link, sets the time: 100 SQEs + 1 quiet at the end of the stage.
    m = Machine(**{**tiny.__dict__, "sqe_issue_us": 20.0})
    s = schedule(tmp_path, MOE.format(engine="sdma"))
    T, rb = 100, 512
    p = predict_moe(s, m, 2, [T], MoeSpec(hidden=256, topk=1, experts=2, routing="single"), "bf16")[0]
    barrier = 2 * 1.0 + 2 * 0.5 + 3.0
    histogram = C0 + (T + 2) * E1 + 1.0
    # the count row (8 bytes) is one post: 1 SQE + 1 quiet on its core (40 us) > queue (8/500 + 5)
    counts = 2 * 20.0 + 1.0 + 3.0
    exscan = C0 + 6 * E1 + 1.0
    scan = C0 + 3 * T * E1
    issue = (T + 1) * 20.0
    assert issue > T * rb / 500 + T * 5.0 > T * rb / 500      # core > queue > link
    place = scan + issue + 1.0 + 3.0
    agreement = barrier                               # the ranks' agreement on the call, first
    assert p.time_us == pytest.approx(10.0 + agreement + histogram + barrier + counts + barrier + exscan
                                      + place + barrier)
    assert p.bound == "sdma"
    assert p.breakdown_us["sdma"] == pytest.approx(2 * 20.0 + issue)
    assert p.breakdown_us.get("aiv", 0.0) == 0.0


def test_a_quiet_every_192_sqes(tmp_path, tiny):
    # 400 one-SQE posts on one core: quiets before posts 193 and 385, and at the end of the stage
    m = Machine(**{**tiny.__dict__, "sqe_issue_us": 20.0})
    s = schedule(tmp_path, MOE.format(engine="sdma"))
    T = 400
    cost = _moe_cost(s, m, 2, T, "single", stage=4)
    scan = C0 + 3 * T * E1
    assert cost.busy_us[1] == pytest.approx(scan + (T + 3) * 20.0)
    assert cost.issue_us[1] == pytest.approx((T + 3) * 20.0)
    assert cost.category[1] == "sdma"


def _fast_queue(tiny: Machine, cores: int = 1) -> Machine:
    """Queues, HBM and links so fast that the posting core sets the time of an SDMA copy."""
    return Machine(**{**tiny.__dict__, "queue_gbps": 1e9, "post_us": 0.0, "hbm_gbps": 1e9,
                      "fabric_gbps": 1e9, "vector_cores": cores, "queues": cores})


@pytest.mark.parametrize("nbytes, sqes, quiets", [
    (32, 1, 1),                          # one SQE, however small
    (MIB, 1, 1),
    (3 * MIB + 32, 4, 1),                # 1 MiB SQEs: 3 full + 32 bytes
    (192 * MIB, 192, 1),                 # exactly the limit: one post, no quiet before the end
    (200 * MIB + 4096, 201, 2),          # posts of 192 MiB (192 SQEs) and 8 MiB + 4 KiB (9): the second
                                         # would hold 201 > 192, so a quiet comes first
])
def test_one_piece_is_split_into_sqes_and_posts(tmp_path, tiny, nbytes, sqes, quiets):
    m = _fast_queue(tiny)
    s = schedule(tmp_path, PUSH.format(engine="sdma"))
    count = nbytes // 4
    t = template(s, 1, {"n": count})
    cost = stage_cost(t, next(iter(t.stages)), lengths(t, {"n": count}), 4, m, 1)
    assert cost.issue_us[0] == pytest.approx((sqes + quiets) * 2.0)
    assert cost.busy_us[0] == pytest.approx((sqes + quiets) * 2.0, rel=1e-6)
    assert cost.category[0] == "sdma"


def test_auto_decides_per_core_piece(tmp_path, tiny):
    # world 1, two cores: a copy of 1.5 x the threshold gives each core 0.75 x: both stay on the
    # vector cores (as Mover::Copy decides per call); at 2 x each core's piece reaches the threshold
    two = Machine(**{**tiny.__dict__, "vector_cores": 2, "queues": 2})
    auto, aiv, sdma = (schedule(tmp_path, PUSH.format(engine=e), f"{e}.strata") for e in ("auto", "aiv", "sdma"))
    threshold = passes.SDMA_THRESHOLD // 4            # elements
    for count, same, other in ((threshold * 3 // 2, aiv, sdma), (threshold * 2, sdma, aiv)):
        got = predict_count(auto, two, world=1, count=count)[0]
        assert got == pytest.approx(predict_count(same, two, world=1, count=count)[0])
        assert got != pytest.approx(predict_count(other, two, world=1, count=count)[0])
