"""`stratac simulate` on the quantised dispatch (examples/moe_prefill_int8.strata): its rows are
int8 whatever --dtype says, each carries a 4-byte f32 scale, so a rank receives hidden + 4 bytes per
row where the bf16 dispatch receives 2 * hidden, and the place of the scales moves 4-byte rows."""

from simkit import ROOT

from stratac.lang import frontend
from stratac.tools.simulate.moe import MoeSpec, predict_moe


def _dispatch(name):
    return frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))[0]


def test_int8_dispatch_receives_hidden_plus_four_bytes_per_row(cm384):
    world, tokens, hidden = 4, 128, 1024
    spec = MoeSpec(hidden=hidden, topk=4, experts=16, routing="uniform")
    cache = {}
    bf16 = predict_moe(_dispatch("moe_prefill_bounded"), cm384, world, [tokens], spec, "bf16", cache=cache)[0]
    int8 = predict_moe(_dispatch("moe_prefill_int8"), cm384, world, [tokens], spec, "bf16", cache=cache)[0]
    rows = bf16.moe["received_rows"]
    assert int8.moe["received_rows"] == rows
    assert (int8.dtype, bf16.dtype) == ("i8", "bf16")
    assert bf16.size == round(rows * 2 * hidden)
    assert int8.size == round(rows * (hidden + 4))
    assert 0.5 < int8.size / bf16.size < 0.51
