"""`stratac simulate` on the quantised dispatch (examples/moe_prefill_int8.strata): its rows are
int8 whatever --dtype says, each carries a 32-byte row of f32 scales (8 columns: window rows other
ranks write are whole 32-byte blocks, docs/npu.md "Peer window rows"), so a rank receives
hidden + 32 bytes per row where the bf16 dispatch receives 2 * hidden, and the place of the scales
moves 32-byte rows."""

from simkit import ROOT

from stratac.lang import frontend
from stratac.tools.simulate.moe import MoeSpec, predict_moe


def _dispatch(name):
    return frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))[0]


def test_int8_dispatch_receives_hidden_plus_32_bytes_per_row(cm384):
    world, tokens, hidden = 4, 128, 1024
    spec = MoeSpec(hidden=hidden, topk=4, experts=16, routing="uniform")
    cache = {}
    bf16 = predict_moe(_dispatch("moe_prefill_bounded"), cm384, world, [tokens], spec, "bf16", cache=cache)[0]
    int8 = predict_moe(_dispatch("moe_prefill_int8"), cm384, world, [tokens], spec, "bf16", cache=cache)[0]
    rows = bf16.moe["received_rows"]
    assert int8.moe["received_rows"] == rows
    assert (int8.dtype, bf16.dtype) == ("i8", "bf16")
    assert bf16.size == round(rows * 2 * hidden)
    assert int8.size == round(rows * (hidden + 32))
    assert 0.515 < int8.size / bf16.size < 0.516


def test_rows_and_scales_in_one_pass_are_predicted_faster_than_two(cm384):
    """The joined place (passes.join_places) scans the ids once for rows and scales: the same bytes
    as two passes, less scalar work on every core, so a shorter dispatch; the combine is the same."""
    from stratac.ir import passes
    world, tokens = 64, 256
    spec = MoeSpec(hidden=7168, topk=8, experts=256, routing="uniform")
    cache = {}
    one, two = (predict_moe(_dispatch("moe_prefill_int8"), cm384, world, [tokens], spec, "bf16", cache=cache,
                            options=passes.Options(join_places=j))[0] for j in (True, False))
    assert one.size == two.size and one.moe["received_rows"] == two.moe["received_rows"]
    assert one.time_us < two.time_us, (one.time_us, two.time_us)
