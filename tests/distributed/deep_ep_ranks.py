"""The DeepEP drop-in (stratac.deep_ep) checked the way DeepEP's own tests check DeepEP, one process
per rank: `python deep_ep_ranks.py MODE RANK WORLD STORE [DTYPE]`, MODE normal or low_latency.
Written from the description of tests/test_intranode.py and tests/test_low_latency.py (their
checks, not their code). Prints `PASS MODE`; a failed expectation raises.

Routing: |randn| + 1 scores over the experts, with a skew (a few experts favoured) and empty
experts (a few never chosen), top-k of them; low-latency mode also sets some (token, k) entries to
-1. The reference counts are this rank's, all-reduced over the group, as DeepEP's tests build them.
"""

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: expect.py
from expect import Failed, check, expect_error  # noqa: E402

from stratac import deep_ep  # noqa: E402  (the one line a DeepEP script changes)
from stratac.host.errors import StrataUsageError  # noqa: E402


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepEP's similarity measure: 1 - 2 sum(xy) / sum(x^2 + y^2), both shifted by 1, in double."""
    x, y = x.double() + 1, y.double() + 1
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def routing(rank: int, tokens: int, experts: int, topk: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    scores = torch.randn(tokens, experts, generator=g).abs() + 1
    scores[:, :2] *= 3                          # skew: experts 0 and 1 are popular
    scores[:, experts - 2:] = 0                 # the last two experts get nothing
    return scores.topk(topk, dim=-1, sorted=False).indices


def normal(rank, world, dtype):
    tokens, hidden, experts, topk = 96, 128, 4 * world, min(4, 2 * world)
    local = experts // world
    payload = torch.int8 if dtype == "int8" else None
    buf = deep_ep.Buffer(dist.group.WORLD, int(1e8), 0, explicitly_destroy=True, payload=payload)
    for seed in range(2):
        topk_idx = routing(rank, tokens, experts, topk, seed)
        rank_idx = topk_idx // local
        in_rank_ref = torch.zeros(tokens, world, dtype=torch.bool)
        for r in range(world):
            in_rank_ref[:, r] = (rank_idx == r).any(dim=1)
        per_rank_ref = in_rank_ref.sum(0).int()
        per_expert_ref = torch.bincount(topk_idx.view(-1), minlength=experts).int()
        global_per_rank, global_per_expert = per_rank_ref.clone(), per_expert_ref.clone()
        dist.all_reduce(global_per_rank)
        dist.all_reduce(global_per_expert)

        per_rank, per_rdma, per_expert, in_rank, event = buf.get_dispatch_layout(topk_idx, experts)
        check(torch.equal(per_rank, per_rank_ref) and per_rdma is None and torch.equal(per_expert, per_expert_ref)
              and torch.equal(in_rank, in_rank_ref), "layout")
        event.current_stream_wait()

        x = torch.full((tokens, hidden), float(rank), dtype=torch.bfloat16)
        weights = torch.full((tokens, topk), float(rank))           # rank-valued weights
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            x, topk_idx=topk_idx, topk_weights=weights, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, expert_alignment=1)
        if payload is not None:
            q, scales = recv_x
            recv_x = (q.float() * scales).to(torch.bfloat16)
        check(recv_x.shape[0] == int(global_per_rank[rank]), ("rows", recv_x.shape, global_per_rank))
        check(counts == global_per_expert.view(world, -1)[rank].tolist(), ("per expert", counts))
        prefix = handle[0]
        for i in range(world):                  # the block from rank i holds rank i's rows
            lo = int(prefix[i - 1][rank]) if i else 0
            block = recv_x[lo:int(prefix[i][rank])]
            check(bool((block.float() == i).all()), ("block of rank", i))
            check(bool((recv_w[lo:int(prefix[i][rank])].amax(dim=1) == i).all() or block.shape[0] == 0),
                  ("weights of rank", i))
        check(bool(((recv_idx == -1) | ((recv_idx >= 0) & (recv_idx < local))).all()), "local ids")
        for e in range(local):
            check(int((recv_idx == e).sum()) == counts[e], ("count of expert", e))
        check(bool((recv_w[recv_idx < 0] == 0).all()), "weights 0 where not local")
        # cached dispatch: the same blocks from the handle
        again = buf.dispatch(x, handle=handle)
        check(again[1:5] == (None, None, None, None), "cached dispatch returns no layout")
        got = again[0] if payload is None else (again[0][0].float() * again[0][1]).to(torch.bfloat16)
        check(torch.equal(got, recv_x), "cached dispatch")
        # aligned counts
        if seed == 1:
            aligned = buf.dispatch(x, topk_idx=topk_idx, topk_weights=weights, num_tokens_per_expert=per_expert,
                                   expert_alignment=8)[3]
            check(aligned == [-(-c // 8) * 8 for c in counts], ("alignment", aligned, counts))
            recv_x2, _, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=topk_idx, topk_weights=weights,
                                                            num_tokens_per_expert=per_expert)
        combined, combined_w, _ = buf.combine(recv_x if payload is None else recv_x.clone(), handle,
                                              topk_weights=recv_w)
        sent = in_rank_ref.sum(1, keepdim=True).float()
        check(calc_diff(combined.float() / sent.clamp(min=1), x.float()) < 5e-6, "combine: sum of the copies")
        # each slot's weight lives on one rank: the sum over ranks gives it back
        check(calc_diff(combined_w, weights) < 1e-9, ("combined weights", combined_w[:2], weights[:2]))
        expect_error(StrataUsageError, "already combined", buf.combine, recv_x, handle)
        # the handle again: a cached dispatch, then a weighted combine of it works as the first did
        again = buf.dispatch(x, handle=handle)[0]
        again = again if payload is None else (again[0].float() * again[1]).to(torch.bfloat16)
        combined2, combined_w2, _ = buf.combine(again, handle, topk_weights=recv_w)
        check(torch.equal(combined2, combined) and torch.equal(combined_w2, combined_w), "cached, then combined")
    # num_worst_tokens: every output has that many rows, ids -1 past the received ones, the list
    # empty; the first rows are the normal result, and the padded rows combine as the unpadded
    worst = tokens * world
    recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
        x, topk_idx=topk_idx, topk_weights=weights, num_tokens_per_expert=per_expert, num_worst_tokens=worst)
    got = recv_x if payload is None else recv_x[0]
    check(got.shape[0] == worst and recv_idx.shape[0] == worst and recv_w.shape[0] == worst and counts == [],
          ("worst", got.shape, counts))
    real = int(global_per_rank[rank])
    check(bool((recv_idx[real:] == -1).all()) and len(handle[3]) == worst, "padding")
    y = recv_x if payload is None else (recv_x[0].float() * recv_x[1]).to(torch.bfloat16)
    combined, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w)
    check(calc_diff(combined.float() / in_rank_ref.sum(1, keepdim=True).float().clamp(min=1), x.float()) < 5e-6,
          "worst combine")
    # bad input, refused on every rank before anything is sent
    ids = routing(rank, tokens, experts, topk, 9)
    _, _, pe, _, _ = buf.get_dispatch_layout(ids, experts)
    expect_error(StrataUsageError, "topk_idx must be torch.int64", buf.dispatch, x, topk_idx=ids.float(),
                 num_tokens_per_expert=pe)
    expect_error(StrataUsageError, f"topk_idx has {tokens} rows, x has 3 tokens", buf.dispatch, x[:3], topk_idx=ids,
                 num_tokens_per_expert=pe)
    bad = ids.clone()
    bad[5, 1] = experts
    expect_error(StrataUsageError, f"topk_idx[5, 1] = {experts} is not an expert", buf.dispatch, x, topk_idx=bad,
                 num_tokens_per_expert=pe)
    expect_error(StrataUsageError, f"num_experts = {experts + 1} is not divisible", buf.get_dispatch_layout, ids,
                 experts + 1)
    nan = torch.ones(tokens, topk)
    nan[3, 0] = float("nan")
    expect_error(StrataUsageError, "topk_weights[3, 0] = nan", buf.dispatch, x, topk_idx=ids, topk_weights=nan,
                 num_tokens_per_expert=pe)
    other = deep_ep.Buffer(dist.group.WORLD, int(1e8), 0, explicitly_destroy=True)
    expect_error(StrataUsageError, "not one this buffer's dispatch returned", other.combine, x, handle)
    expect_error(StrataUsageError, "stratac has no fp8", buf.dispatch, (x, x), topk_idx=ids, num_tokens_per_expert=pe)
    other.destroy()
    buf.destroy()


def low_latency(rank, world, dtype):
    tokens, hidden, experts, topk, m = 24, 128, 4 * world, min(4, 2 * world), 32
    local = experts // world
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(m, hidden, world, experts)
    payload = torch.int8 if dtype == "int8" else None
    buf = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=local,
                         explicitly_destroy=True, payload=payload)

    def tokens_of(s: int) -> torch.Tensor:
        x = torch.full((tokens, hidden), float(s - 128), dtype=torch.bfloat16)
        x[:, -1] = torch.arange(tokens, dtype=torch.bfloat16)      # the token's index, exact in bf16
        return x

    def quantised(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank s's tokens as int8 rows and f32 per-token scales, computed here (not by stratac):
        scale = max |x| / 127, q = round(x / scale) clamped to [-127, 127]."""
        xf = tokens_of(s).float()
        scale = xf.abs().amax(dim=1, keepdim=True) / 127
        return torch.round(xf / scale).clamp(-127, 127).to(torch.int8), scale

    for it, use_hook in enumerate((False, True)):
        x = tokens_of(rank)
        g = torch.Generator().manual_seed(50 + it * 10 + rank)
        topk_idx = routing(rank, tokens, experts, topk, 7 + it)
        for _ in range(5):                                         # some entries select nothing
            topk_idx[torch.randint(tokens, (1,), generator=g), torch.randint(topk, (1,), generator=g)] = -1
        weights = torch.randn(tokens, topk, generator=g).abs()
        everyone = [torch.empty_like(topk_idx) for _ in range(world)]
        dist.all_gather(everyone, topk_idx)
        stats = torch.zeros(local, dtype=torch.int32)
        recv_x, recv_count, handle, event, hook = buf.low_latency_dispatch(
            x, topk_idx, m, experts, cumulative_local_expert_recv_stats=stats, use_fp8=False,
            async_finish=not use_hook, return_recv_hook=use_hook)
        if use_hook:
            expect_error(StrataUsageError, "recv hook of low_latency_dispatch was never called",
                         buf.low_latency_dispatch, x, topk_idx, m, experts, use_fp8=False)
            hook()
        else:
            event.current_stream_wait()
        if payload is not None:     # int8 rows and their scales, bit for bit the sources' quantisation
            q, scales = recv_x
            check(q.dtype == torch.int8 and scales.shape == (local, world * m, 1), (q.dtype, scales.shape))
            src_info, layout = handle[0], handle[1]
            for e in range(local):
                for j in range(world):
                    begin, count = int(layout[e, j]) >> 32, int(layout[e, j]) & 0xFFFFFFFF
                    wq, ws = quantised(j)
                    t = src_info[e, begin:begin + count].long()
                    check(torch.equal(q[e, begin:begin + count], wq[t]), ("int8 rows", e, j))
                    check(torch.equal(scales[e, begin:begin + count], ws[t]), ("scales", e, j))
            recv_x = (q.float() * scales).to(torch.bfloat16)        # the expert step's input
            x = (quantised(rank)[0].float() * quantised(rank)[1]).to(torch.bfloat16)   # what was sent
        check(recv_x.shape == (local, world * m, hidden), recv_x.shape)
        src_info, layout, m_, hidden_, experts_ = handle
        check((m_, hidden_, experts_) == (m, hidden, experts), "handle sizes")
        for e in range(local):
            expert = rank * local + e
            n = int(recv_count[e])
            want = sum(int((ids == expert).sum()) for ids in everyone)
            check(n == want == int(stats[e]) == int((layout[e] & 0xFFFFFFFF).sum()), ("count", e, n, want))
            rows = recv_x[e, :n]
            check(bool((rows[:, :-1] == rows[:, :1]).all()), "rows constant but the index column")
            if payload is None:     # (int8: the rows were compared with their sources above)
                check(torch.equal(rows[:, -1].long(), src_info[e, :n].long() % tokens), "index column = src_info")
            for j in range(world):
                begin, count = int(layout[e, j]) >> 32, int(layout[e, j]) & 0xFFFFFFFF
                check(count == int((everyone[j] == expert).sum()), ("range count", e, j))
                check(bool((recv_x[e, begin:begin + count, 0] == float(tokens_of(j)[0, 0])).all()),
                      ("range rows", e, j))
        out = torch.empty(tokens, hidden, dtype=torch.bfloat16)
        combined, _, chook = buf.low_latency_combine(recv_x, topk_idx, weights, handle, out=out,
                                                     return_recv_hook=use_hook)
        if chook is not None:
            chook()
        check(combined is out, "written into out")
        want = x.float() * weights.masked_fill(topk_idx == -1, 0).sum(dim=1, keepdim=True)
        check(calc_diff(combined.float(), want) < 1e-5 and not bool(combined.isnan().any()), "weighted combine")
    expect_error(StrataUsageError, f"x has {m + 1} tokens, more than num_max_dispatch_tokens_per_rank = {m}",
                 buf.low_latency_dispatch, torch.zeros(m + 1, hidden, dtype=torch.bfloat16),
                 torch.zeros(m + 1, topk, dtype=torch.int64), m, experts, use_fp8=False)
    expect_error(StrataUsageError, "use_fp8=True: stratac has no fp8", buf.low_latency_dispatch, x, topk_idx, m,
                 experts)
    expect_error(StrataUsageError, "already combined", buf.low_latency_combine, recv_x, topk_idx, weights, handle)
    buf.destroy()


def main(mode, rank, world, store_path, dtype="bf16"):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        {"normal": normal, "low_latency": low_latency}[mode](rank, world, dtype)
    except Failed:
        raise
    dist.barrier()
    dist.destroy_process_group()
    print(f"PASS {mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
