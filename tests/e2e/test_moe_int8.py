"""The quantised MoE dispatch (examples/moe_prefill_int8.strata, moe_decode_int8.strata) on the CPU build: int8 rows and
their f32 per-token scales dispatched together, dequantised in the expert step, combined in the
activation dtype with f32 accumulation.

The run tool checks every rank's counts, int8 window, scale window, the expert step's output and y
against its torch reference (stratac.tools.run.workload.MoeWorkload, `*_quantized`) bit for bit;
here that reference is itself checked against one written in this file from the definitions alone
(quantise per token: scale = max |x| / 127, round half to even, clamp to [-127, 127]; the packed
layout; dequantise in f32, times e + 1, rounded to bf16; y accumulated in f32 in k order, rounded
once), and the bytes the dispatch moves are compared with the bf16 dispatch of the same routing."""

import re
from pathlib import Path

import numpy as np
import pytest
import runkit
import torch

from stratac.lang.frontend import load_source, schedules
from stratac.tools.run import runner
from stratac.tools.run.workload import MoeWorkload
from stratac.verify.routing import expert_ids

ROOT = Path(__file__).resolve().parents[2]
INT8 = ROOT / "examples" / "moe_prefill_int8.strata"
DECODE_INT8 = ROOT / "examples" / "moe_decode_int8.strata"
BOUNDED = ROOT / "examples" / "moe_prefill_bounded.strata"


_run = runkit.run


@pytest.mark.parametrize("path", [INT8, DECODE_INT8], ids=["prefill", "decode"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_int8_dispatch_and_bf16_combine_are_bit_exact(world, path):
    cases = [runner.Case("bf16", tokens=37, hidden=96, topk=3, routing="skewed"),   # 12-column blocks
             runner.Case("bf16", tokens=29, hidden=64, topk=2, routing="sparse"),
             runner.Case("f32", tokens=1, hidden=32, topk=2, routing="empty")]
    out = _run(path, world, cases)
    assert out.failures == [] and out.exit_code == 0
    assert len(out.results) == world * len(cases) * 2
    assert [(r["schedule"], r["rank"], r["why"]) for r in out.results if not r["ok"]] == []
    assert {r["moe"]["payload"] for r in out.results} == {"i8"}


def _reference(world, tokens, hidden, topk, experts, routing, seed, rank):
    """From the definitions alone: (int8 window, scale window, rows defined, y) of `rank`."""
    def tokens_of(s):   # the run tool's activations: normal values in bf16, seeded per rank
        g = torch.Generator().manual_seed(seed * 1_000_003 + s * 7919 + 3)
        return torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)

    per = hidden // 8             # xs, ws: [rows, 8], one scale per block of hidden / 8 columns

    def quantise(x):
        xf = x.float().reshape(tokens, 8, per)
        amax = xf.abs().amax(dim=2, keepdim=True)
        scale = torch.where(amax > 0, amax / 127, torch.tensor(1.0))
        q = torch.clamp(torch.round(xf / scale), -127, 127).to(torch.int8)   # half to even
        return q.reshape(tokens, hidden), scale.reshape(tokens, 8)

    def dequantise(q, scale):
        return (q.float().reshape(-1, 8, per) * scale.reshape(-1, 8, 1)).reshape(-1, hidden)

    ids = [expert_ids(routing, s, tokens, topk, experts, seed) for s in range(world)]
    qs = [quantise(tokens_of(s)) for s in range(world)]
    local = experts // world
    rows = world * tokens * topk
    wq = torch.zeros(rows, hidden, dtype=torch.int8)
    ws = torch.zeros(rows, 8)
    expert_of_row = {}
    row = 0
    for e in range(rank * local, (rank + 1) * local):   # packed: local experts, then source ranks
        for s in range(world):
            for t in np.nonzero((ids[s] == e).any(axis=1))[0]:
                wq[row], ws[row] = qs[s][0][t], qs[s][1][t]
                expert_of_row[row] = e
                row += 1
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + 2)
    weights = torch.randint(0, 17, (tokens, topk), generator=g).float() / 16
    q, scale = qs[rank]
    y = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for k in range(topk):
            e = int(ids[rank][t, k])
            if e >= 0:
                out = (dequantise(q[t], scale[t])[0] * (e + 1)).to(torch.bfloat16)   # the expert stand-in
                y[t] = y[t] + out.float() * weights[t, k]
    return wq, ws, row, y.to(torch.bfloat16)


@pytest.mark.parametrize("world,routing", [(2, "skewed"), (3, "sparse"), (4, "uniform")])
def test_the_run_tools_reference_is_the_definition(world, routing):
    """The run tool's torch reference (which the device results are compared against, bit for bit)
    equals the one above, written from the definitions without stratac's code."""
    tokens, hidden, topk, experts, seed = 13, 64, 3, 4 * world, 5
    s = schedules(load_source(str(INT8)))
    wl = MoeWorkload.make(s[0], s[1], world, tokens, hidden, topk, experts, routing)
    assert wl.quantized and wl.scale_cols() == 8
    for rank in range(world):
        wq, ws, n, y = _reference(world, tokens, hidden, topk, experts, routing, seed, rank)
        got_q, got_s, mask = wl.window_quantized(rank, seed, torch.bfloat16, wq.shape[0])
        assert int(mask.sum()) == n and bool(mask[:n].all())
        assert torch.equal(got_q[:n], wq[:n]) and torch.equal(got_s[:n], ws[:n])
        assert torch.equal(wl.combined_quantized(rank, seed, torch.bfloat16), y)
        # the quantisation is not trivial: rows use the int8 range, values are rounded
        assert int(wq[:n].abs().max()) == 127 if n else True


def test_int8_dispatch_moves_about_half_the_bytes_of_bf16():
    """The same routing dispatched as bf16 rows (moe_prefill_bounded) and as int8 rows with an f32
    scale row each (moe_prefill_int8): the vector cores write hidden + 32 bytes per routed row (the
    scale row is padded to one 32-byte block, docs/npu.md "Peer window rows") instead of 2 * hidden,
    the rest (counts, offsets, the status line) being the same; at hidden 512 that is 0.531 of the
    bf16 payload."""
    world, tokens, hidden, topk, cores = 2, 64, 512, 4, 4
    case = runner.Case("bf16", tokens=tokens, hidden=hidden, topk=topk, routing="skewed")
    written = {}
    for path in (BOUNDED, INT8):
        out = _run(path, world, [case], cores=cores)
        assert out.exit_code == 0 and all(r["ok"] for r in out.results), out.failures
        for r in out.results:
            if r["moe"]["phase"] == "dispatch":
                written[(path.stem, r["rank"])] = (sum(c["mte_out"] for c in r["counters"]),
                                                   r["moe"]["row_bytes"], r["size"])
    for rank in range(world):
        routed = int((expert_ids("skewed", rank, tokens, topk, 4 * world, 0) >= 0).sum())
        bf16, int8 = written[("moe_prefill_bounded", rank)], written[("moe_prefill_int8", rank)]
        assert (bf16[1], int8[1]) == (2 * hidden, hidden + 32)
        assert bf16[0] - int8[0] == routed * (2 * hidden - (hidden + 32))
        assert int8[2] / bf16[2] == pytest.approx((hidden + 32) / (2 * hidden))   # received bytes
        payload = routed * (hidden + 32), routed * 2 * hidden
        assert 0.53 < payload[0] / payload[1] < 0.532


def test_an_int8_activation_dtype_is_refused():
    case = runner.Case("i8", tokens=4, hidden=32, topk=2)
    with pytest.raises(Exception, match="moves float tokens"):
        _run(INT8, 1, [case])


def test_per_block_scales_land_beside_their_rows():
    """Sixteen scales per token (tests/e2e/moe_int8_blocks.strata: xs, ws of [rows, 16], 64-byte
    scale rows), blocks of 6 of 96 columns: windows, scales and y bit for bit at world 3."""
    cases = [runner.Case("bf16", tokens=37, hidden=96, topk=3, routing="skewed")]
    out = _run(Path(__file__).resolve().parent / "moe_int8_blocks.strata", 3, cases)
    assert out.failures == [] and out.exit_code == 0
    assert [(r["schedule"], r["rank"], r["why"]) for r in out.results if not r["ok"]] == []
    assert {r["moe"]["row_bytes"] for r in out.results} == {96 + 16 * 4}


def test_the_python_call_refuses_wrong_payloads_and_places_rows_with_their_scales():
    """One rank, from Python: a bf16 payload, scales of the wrong shape and a scale window of other
    rows than the int8 window are refused before launch, naming the parameter; a right call puts
    each token's row and its scale in the same window row (experts 0 and 1, tokens in order)."""
    from stratac.host import comm as C
    from stratac.host.errors import StrataUsageError
    c = C.Communicator(0, 1, segment=C._segment_name(), create=True, heap_bytes=8 << 20, timeout=10)
    C.unlink_segment(c.segment)
    try:
        m = c.load(str(INT8))
        T, H, K, E, R = 5, 64, 2, 4, 10
        xq, xs = c.zeros(T, H, dtype=torch.int8), c.zeros(T, 8, dtype=torch.float32)
        ids, counts = c.zeros(T, K, dtype=torch.int32), c.zeros(1, E, dtype=torch.int32)
        wq, ws = c.zeros(R, H, dtype=torch.int8), c.zeros(R, 8, dtype=torch.float32)
        ids[:, 1] = 1
        xq.copy_(torch.arange(T * H).reshape(T, H) % 100)
        xs.copy_(torch.arange(T * 8).reshape(T, 8) + 0.5)
        bad = [("xq must be int8", (c.zeros(T, H, dtype=torch.bfloat16), xs, ids, counts, wq, ws)),
               ("xs must have shape [tokens, 8] = [5, 8], got [5]",
                (xq, c.zeros(T, dtype=torch.float32), ids, counts, wq, ws)),
               ("xs must have shape [tokens, 8] = [5, 8], got [5, 2]",
                (xq, c.zeros(T, 2, dtype=torch.float32), ids, counts, wq, ws)),
               ("ws must have shape [max_recv, 8] = [10, 8], got [11, 8]",
                (xq, xs, ids, counts, wq, c.zeros(R + 1, 8, dtype=torch.float32))),
               # int8 rows of 40 bytes: several ranks would write one 32-byte block of a window
               ("moe_prefill_int8_dispatch: on rank 0, parameter wq's rows (hidden = 40) are 40 bytes: "
                "place writes them from several ranks into one 32-byte block of a peer's window",
                (c.zeros(T, 40, dtype=torch.int8), xs, ids, counts, c.zeros(R, 40, dtype=torch.int8), ws)),
               ("pad the rows to 64 columns (hidden = 64)",
                (c.zeros(T, 33, dtype=torch.int8), xs, ids, counts, c.zeros(R, 33, dtype=torch.int8), ws))]
        for text, args in bad:
            with pytest.raises(StrataUsageError, match=re.escape(text)):
                m.moe_prefill_int8_dispatch(*args)
        assert int(wq.abs().sum()) == 0
        m.moe_prefill_int8_dispatch(xq, xs, ids, counts, wq, ws)
        order = list(range(T)) * 2          # expert 0's rows (every token), then expert 1's
        assert torch.equal(wq, xq[order]) and torch.equal(ws, xs[order])
        assert counts.tolist() == [[T, T, 0, 0]]
    finally:
        c.close(collective=False)
