"""Scenarios of stratac.Buffer (the DeepEP-style MoE API), one process per rank:
`python buffer_ranks.py SCENARIO[,SCENARIO...] RANK WORLD STORE` (several share the processes and
the communicator). Prints `PASS <scenario>` after each; a failed expectation raises (non-zero exit).

Every rank builds every rank's inputs from seeds, so it can compute, without communication, what
each rank must receive, its bytes and its combined tokens: the independent reference."""

import math
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: expect.py
from expect import check, expect_error  # noqa: E402

import stratac
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.host.moe import Buffer, CallStats

H, T, E, K = 32, 12, 8, 3        # hidden, max tokens, experts, top-k (f32 rows of 128 bytes)


def routing(world: int, step: int, hidden: int = H):
    """Every rank's tokens, expert ids (distinct per token, some -1, one token routed nowhere) and
    weights, from seeds: the same on every rank."""
    xs, ids, ws = [], [], []
    for r in range(world):
        g = torch.Generator().manual_seed(100 * step + r)
        n = T - (r + step) % 4
        xs.append(torch.randn(n, hidden, generator=g))
        i = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)]).int()
        i[1::5, 0] = -1
        if n > 2:
            i[2] = -1                                    # routed nowhere: combines to 0
        ids.append(i.long() if r % 2 else i)             # int32 and int64 both taken
        ws.append(torch.rand(n, K, generator=g))
    return xs, ids, ws


def expected(world: int, rank: int, xs, ids, live=None):
    """What `rank` must receive (its window, expert after expert, source rank after source rank,
    token order), its rows per local expert, and every rank's rows to each owner. With `live` (one
    bool per rank), masked ranks send nothing and entries of their experts are dropped."""
    local = E // world
    live = live or [True] * world
    mine = range(rank * local, (rank + 1) * local)
    rows, per_expert = [], []
    for e in mine:
        c = 0
        for s in range(world):
            if not (live[s] and live[rank]):
                continue
            for t in range(ids[s].shape[0]):
                if e in ids[s][t].tolist():
                    rows.append(xs[s][t])
                    c += 1
        per_expert.append(c)
    sent = torch.zeros(world, world, dtype=torch.int64)   # sent[s, o]: rows from s to owner o
    for s in range(world):
        for e in ids[s][ids[s] >= 0].tolist():
            if live[s] and live[e // local]:
                sent[s, e // local] += 1
    win = torch.stack(rows) if rows else torch.zeros(0, H)
    return win, per_expert, sent


def want_bytes(world: int, sent, r: int, live_ranks: int | None = None) -> dict:
    row, table = H * 4, ((live_ranks or world) - 1) * E * 4
    out_rows = int(sent[r].sum() - sent[r, r])
    in_rows = int(sent[:, r].sum() - sent[r, r])
    return {"dispatch": (out_rows, in_rows, out_rows * row + table, in_rows * row + table),
            "combine": (in_rows, out_rows, in_rows * row, out_rows * row)}


def check_stats(s: CallStats, kind: str, r: int, seq: int, want: tuple) -> None:
    check(s.kind == kind and s.rank == r and s.seq == seq, f"stats names {s}")
    got = (s.rows_sent, s.rows_received, s.bytes_sent, s.bytes_received)
    check(got == want, f"rank {r} {kind}: rows/bytes {got}, expected {want}")
    check(math.isfinite(s.us) and s.us > 0, f"{kind} time {s.us}")
    # the CPU model's counters of what this rank's cores wrote/read in other ranks' memory
    if kind == "dispatch":
        check(s.measured_remote_write == want[2] and s.measured_remote_read == 0,
              f"rank {r} dispatch measured {s.measured_remote_write}/{s.measured_remote_read}, want {want[2]}")
    else:
        check(s.measured_remote_read == want[3] and s.measured_remote_write == 0,
              f"rank {r} combine measured {s.measured_remote_read}/{s.measured_remote_write}, want {want[3]}")


def numbers(comm, rank, world):
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32)
    local = E // world
    for step in (1, 2):
        xs, ids, ws = routing(world, step)
        x, i, w = xs[rank], ids[rank], ws[rank]
        win, per_expert, sent = expected(world, rank, xs, ids)
        recv_x, counts, handle = buf.dispatch(x, i, w if step == 1 else None)
        check(counts == per_expert, f"rank {rank}: rows per local expert {counts}, expected {per_expert}")
        check(torch.equal(recv_x, win), f"rank {rank}: received rows differ from the routing's")
        check_stats(buf.last_stats()["dispatch"], "dispatch", rank, step, want_bytes(world, sent, rank)["dispatch"])
        # the "experts": row * (e + 1), in place in the window
        row = 0
        for e, c in zip(range(rank * local, (rank + 1) * local), counts):
            recv_x[row:row + c] *= e + 1
            row += c
        if step == 2:
            expect_error(StrataUsageError, "topk_weights is required", buf.combine, recv_x, handle)
        out = buf.combine(recv_x, handle, topk_weights=None if step == 1 else w)
        scale = torch.where(i >= 0, i.long() + 1, torch.zeros_like(i.long())).float()
        ref = (w * scale).unsqueeze(2).mul(x.unsqueeze(1)).sum(dim=1)
        check(out.shape == (x.shape[0], H), f"combined shape {tuple(out.shape)}")
        check(torch.allclose(out, ref, rtol=1e-5, atol=1e-5),
              f"rank {rank}: combined tokens differ (max {float((out - ref).abs().max())})")
        check(not bool(out[2].any()), "a token routed nowhere combines to 0")
        check_stats(buf.last_stats()["combine"], "combine", rank, step, want_bytes(world, sent, rank)["combine"])
        every = buf.stats(all_ranks=True)
        for r in range(world):
            wb = want_bytes(world, sent, r)
            check_stats(every["dispatch"][r], "dispatch", r, step, wb["dispatch"])
            check_stats(every["combine"][r], "combine", r, step, wb["combine"])
        expect_error(StrataUsageError, "already combined", buf.combine, recv_x, handle)
    # a handle is good until the next dispatch
    xs, ids, ws = routing(world, 3)
    _, _, old = buf.dispatch(xs[rank], ids[rank], ws[rank])
    recv_x, _, new = buf.dispatch(xs[rank], ids[rank], ws[rank])
    expect_error(StrataUsageError, "has dispatched since", buf.combine, recv_x, old)
    buf.combine(recv_x.clone(), new)               # y need not be the window itself
    buf.close()


def refusals(comm, rank, world):
    expect_error(StrataUsageError, "multiple of the world size", Buffer, comm, hidden=H, max_tokens=T,
                 num_experts=world + 1, topk=1, dtype=torch.float32)
    expect_error(StrataUsageError, "topk = 9 is more than num_experts = 8", Buffer, comm, hidden=H,
                 max_tokens=T, num_experts=E, topk=9)
    expect_error(StrataUsageError, "dtype must be one of", Buffer, comm, hidden=H, max_tokens=T,
                 num_experts=E, topk=K, dtype=torch.int32)
    expect_error(StrataUsageError, "max_tokens must be a positive int", Buffer, comm, hidden=H,
                 max_tokens=0, num_experts=E, topk=K)
    expect_error(StrataUsageError, "comm must be a Communicator or NpuCommunicator, None or "
                 "a torch.distributed process group, got str", Buffer, "comm", hidden=H, max_tokens=T,
                 num_experts=E, topk=K)
    expect_error(StrataUsageError, "timeout is for the communicator the buffer makes", Buffer, comm,
                 hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32, timeout=5.0)
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32)
    x = torch.randn(4, H)
    ids = torch.zeros(4, K, dtype=torch.int64)
    ids[:, 1], ids[:, 2] = 1, 2
    w = torch.ones(4, K)
    bad = [
        ((x.bfloat16(), ids, w), "x must be torch.float32 (the buffer's dtype), got torch.bfloat16"),
        ((torch.randn(4, H + 1), ids, w), f"x must have shape [tokens, {H}]"),
        ((torch.randn(4 * H), ids, w), "x must have shape"),
        ((torch.randn(T + 1, H), torch.zeros(T + 1, K, dtype=torch.int64), torch.ones(T + 1, K)),
         f"x has {T + 1} tokens, more than max_tokens = {T}"),
        ((torch.empty(4, H, device="meta"), ids, w), "x is on meta, but the buffer's heap is on cpu"),
        ((x.tolist(), ids, w), "x must be a torch.Tensor, got list"),
        ((x, ids[:3], w), f"topk_idx must have shape [4, {K}]"),
        ((x, ids.float(), w), "topk_idx must be int32 or int64, got torch.float32"),
        ((x, torch.where(torch.arange(K) == 1, E, ids), w), f"topk_idx[0, 1] = {E} is not an expert"),
        ((x, torch.where(torch.arange(K) == 2, -2, ids), w), "topk_idx[0, 2] = -2 is not an expert"),
        ((x, ids, w[:, :2]), f"topk_weights must have shape [4, {K}]"),
        ((x, ids, w.int()), "topk_weights must be floating point"),
        ((x, ids, torch.full((4, K), float("nan"))), "topk_weights has a NaN"),
    ]
    for args, text in bad:
        expect_error(StrataUsageError, text, buf.dispatch, *args)
    recv_x, counts, handle = buf.dispatch(x, ids, w)
    expect_error(StrataUsageError, f"y must have shape [{recv_x.shape[0]}, {H}]", buf.combine,
                 torch.zeros(recv_x.shape[0] + 1, H), handle)
    expect_error(StrataUsageError, "handle must be the DispatchHandle", buf.combine, recv_x, (1, 2))
    expect_error(StrataUsageError, "y must be torch.float32", buf.combine, recv_x.half(), handle)
    buf.combine(recv_x, handle)
    buf.close()
    expect_error(StrataUsageError, "the Buffer is closed", buf.dispatch, x, ids, w)


def overflow(comm, rank, world):
    """A routing that sends rank 0 more than max_recv rows: every rank raises, naming the rows and
    the bound, and rank 0's window is untouched; the next call that fits runs."""
    bound = 2 * T
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32, max_recv=bound)
    local = E // world
    x = torch.randn(T, H)
    ids = torch.stack([torch.randperm(local)[:min(K, local)] for _ in range(T)])  # rank 0's experts
    ids = torch.cat([ids, torch.full((T, K - ids.shape[1]), -1)], dim=1) if ids.shape[1] < K else ids
    rows0 = world * int((ids >= 0).sum())
    check(rows0 > bound, "the routing overflows")
    buf._win.fill_(7.0)                            # what the window holds before: must stay
    comm.barrier()
    expect_error(StrataRuntimeError, f"the routing sends {rows0} rows to rank 0, more than the {bound} rows",
                 buf.dispatch, x, ids, torch.ones(T, K))
    check(bool((buf._win == 7.0).all()), f"rank {rank}: the window was written by a refused dispatch")
    ids = torch.full((T, K), -1)
    ids[:, 0] = (torch.arange(T) + rank) % E       # spread: at most T * world / world... rows each
    recv_x, counts, handle = buf.dispatch(x, ids, torch.ones(T, K))
    check(sum(counts) == recv_x.shape[0] <= bound, "the call after an overflow runs")
    out = buf.combine(recv_x, handle)
    check(torch.allclose(out, x), "combine after an overflow")
    buf.close()


def low_latency(comm, rank, world):
    """Low-latency mode (the decode schedules): recv_x is [local experts, world * max_tokens,
    hidden], rank s's rows for local expert l at [l, s * max_tokens:]; rows, counts, combined tokens
    and bytes against every rank's routing, as in numbers."""
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32,
                 low_latency_mode=True)
    local = E // world
    for step in (1, 2, 3):
        xs, ids, ws = routing(world, step)
        x, i, w = xs[rank], ids[rank], ws[rank]
        _, per_expert, sent = expected(world, rank, xs, ids)
        recv_x, counts, handle = buf.dispatch(x, i, w)
        check(tuple(recv_x.shape) == (local, world * T, H), f"low-latency recv_x {tuple(recv_x.shape)}")
        check(counts == per_expert, f"rank {rank}: rows per local expert {counts}, expected {per_expert}")
        for li, e in enumerate(range(rank * local, (rank + 1) * local)):
            for src in range(world):
                rows = [xs[src][t] for t in range(ids[src].shape[0]) if e in ids[src][t].tolist()]
                c = handle.recv_rows_per_expert_and_rank[li][src]
                check(c == len(rows), f"rank {rank}: {c} rows of expert {e} from rank {src}, expected {len(rows)}")
                if rows:
                    check(torch.equal(recv_x[li, src * T:src * T + c], torch.stack(rows)),
                          f"rank {rank}: expert {e}'s rows from rank {src} differ")
            recv_x[li] *= e + 1
        check_stats(buf.last_stats()["dispatch"], "dispatch", rank, step, want_bytes(world, sent, rank)["dispatch"])
        expect_error(StrataUsageError, f"y must have shape [{local}, {world * T}, {H}]", buf.combine,
                     recv_x[0], handle)
        out = buf.combine(recv_x, handle)
        scale = torch.where(i >= 0, i.long() + 1, torch.zeros_like(i.long())).float()
        ref = (w * scale).unsqueeze(2).mul(x.unsqueeze(1)).sum(dim=1)
        check(torch.allclose(out, ref, rtol=1e-5, atol=1e-5),
              f"rank {rank} step {step}: combined tokens differ (max {float((out - ref).abs().max())})")
        check_stats(buf.last_stats()["combine"], "combine", rank, step, want_bytes(world, sent, rank)["combine"])
    expect_error(StrataUsageError, "max_recv is for the packed (prefill) window", Buffer, comm, hidden=H,
                 max_tokens=T, num_experts=E, topk=K, low_latency_mode=True, max_recv=10)
    buf.close()


def masked(comm, rank, world):
    """The last rank masked (it creates the buffer, then sits the calls out): the others dispatch and
    combine with active = every rank but it. Received rows, rows per expert, combined tokens and
    bytes (routing and the model's counters) against the reference with the masked rank's experts
    dropped; the masked rank's window is untouched; get_dispatch_layout drops them too; combine
    refuses a different mask; a bad mask is refused before anything is sent. Run it last: the
    masked rank does not rejoin (its stamps stay behind the others')."""
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.float32)
    local, gone = E // world, world - 1
    live = [r != gone for r in range(world)]
    # first a call of every rank: the count tables then hold the last rank's row of that call,
    # which the masked calls must ignore
    xs, ids, ws = routing(world, 4)
    recv_x, _, handle = buf.dispatch(xs[rank], ids[rank], ws[rank])
    buf.combine(recv_x, handle)
    check(bool(buf._counts[gone].any()), "the unmasked call left the last rank's counts")
    if rank == gone:
        buf._win.fill_(7.0)
        buf._counts.fill_(5)
        comm.barrier()                                 # (1) the live ranks call
        comm.barrier()                                 # (2) they are done
        check(bool((buf._win == 7.0).all()), "the masked rank's window was written")
        check(bool((buf._counts == 5).all()), "the masked rank's count table was written")
        buf.close()
        return
    comm.barrier()                                     # (1)
    x0, i0 = torch.randn(2, H), torch.zeros(2, K, dtype=torch.int64)
    expect_error(StrataUsageError, f"active must have one entry per rank ({world}), got {world - 1}",
                 buf.dispatch, x0, i0, active=live[:-1])
    expect_error(StrataUsageError, f"active[{rank}] is false on rank {rank} itself", buf.dispatch, x0, i0,
                 active=[r != rank for r in range(world)])
    expect_error(StrataUsageError, "active must be a bool or integer tensor", buf.dispatch, x0, i0,
                 active=torch.ones(world))
    for step in (1, 2):
        xs, ids, ws = routing(world, step)
        x, i, w = xs[rank], ids[rank], ws[rank]
        win, per_expert, sent = expected(world, rank, xs, ids, live)
        kept = (i >= 0) & torch.tensor(live)[i.long().clamp(min=0) // local]
        per_rank, per_e, in_rank = buf.get_dispatch_layout(i, active=torch.tensor(live))
        want_e = torch.bincount(i[kept].long(), minlength=E)
        check(torch.equal(per_e.long(), want_e), f"layout per expert {per_e.tolist()}, want {want_e.tolist()}")
        check(int(per_rank[gone]) == 0 and not bool(in_rank[:, gone].any()), "layout counts a masked rank")
        recv_x, counts, handle = buf.dispatch(x, i, w, active=live if step == 1 else torch.tensor(live).int())
        check(handle.active == live, f"handle mask {handle.active}")
        check(counts == per_expert, f"rank {rank}: rows per local expert {counts}, expected {per_expert}")
        check(torch.equal(recv_x, win), f"rank {rank}: received rows differ from the masked routing's")
        nlive = sum(live)
        check_stats(buf.last_stats()["dispatch"], "dispatch", rank, step + 1,
                    want_bytes(world, sent, rank, nlive)["dispatch"])
        row = 0
        for e, c in zip(range(rank * local, (rank + 1) * local), counts):
            recv_x[row:row + c] *= e + 1
            row += c
        expect_error(StrataUsageError, "differs from the dispatch's mask", buf.combine, recv_x, handle,
                     active=[True] * world)
        out = buf.combine(recv_x, handle, active=live if step == 1 else None)   # None: the handle's
        scale = torch.where(kept, i.long() + 1, torch.zeros_like(i.long())).float()
        ref = (w * scale).unsqueeze(2).mul(x.unsqueeze(1)).sum(dim=1)
        check(torch.allclose(out, ref, rtol=1e-5, atol=1e-5),
              f"rank {rank}: masked combine differs (max {float((out - ref).abs().max())})")
        check_stats(buf.last_stats()["combine"], "combine", rank, step + 1,
                    want_bytes(world, sent, rank, nlive)["combine"])
    comm.barrier()                                     # (2)
    buf.close()


def quant(x):
    """The reference quantisation, per token: scale = max |x| / 127 (1 for a zero row), round half
    to even, clamp to +-127."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True)
    sc = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(xf / sc).clamp(-127, 127).to(torch.int8), sc


def int8_combined(q, sc, ids, w):
    """The combine of the int8 scenarios, by hand: expert e's output for token t is its dequantised
    row times e + 1, in bf16; out[t] = sum over k of w[t, k] times that, in f32, then bf16."""
    acc = torch.zeros(q.shape[0], q.shape[1])
    for t in range(q.shape[0]):
        for k in range(K):
            e = int(ids[t, k])
            if e >= 0:
                acc[t] = acc[t] + (q[t].float() * sc[t] * (e + 1)).bfloat16().float() * w[t, k]
    return acc.bfloat16()


def int8(comm, rank, world):
    """payload=torch.int8: bf16 tokens quantised per token (scale = max |x| / 127, 1 for a zero row,
    round half to even, clamp to +-127), dispatched as int8 rows with f32 scales, the experts
    dequantise, combine in bf16 with f32 accumulation: received rows and scales, rows per expert,
    combined tokens bit for bit against a torch reference written here, and bytes (hidden rounded up
    to 32, plus 32 bytes of scale row, per dispatched row: the windows' rows are padded to whole
    32-byte blocks) against the model's counters; at hidden 32 and at 40 (rows padded to 64, the
    caller still sees [rows, 40] and [rows, 1])."""
    expect_error(StrataUsageError, "payload must be None", Buffer, comm, hidden=H, max_tokens=T, num_experts=E,
                 topk=K, payload=torch.float16)
    for hid in (H, 40):
        row_b = -(-hid // 32) * 32 + 32            # bytes per dispatched row
        buf = Buffer(comm, hidden=hid, max_tokens=T, num_experts=E, topk=K, dtype=torch.bfloat16,
                     payload=torch.int8, max_recv=world * T * K)
        local = E // world

        for step in (5, 6):
            xs, ids, ws = routing(world, step, hid)
            xs = [x.bfloat16() for x in xs]
            xs[0][3] = 0                                 # an all-zero row: scale 1
            qs = [quant(x) for x in xs]
            x, i, w = xs[rank], ids[rank], ws[rank]
            wq, per_expert, sent = expected(world, rank, [q for q, _ in qs], ids)
            wsc, _, _ = expected(world, rank, [sc for _, sc in qs], ids)
            (rq, rs), counts, handle = buf.dispatch(x, i, w)
            check(counts == per_expert,
                  f"rank {rank}: int8 rows per local expert {counts}, expected {per_expert}")
            check(rq.dtype == torch.int8 and rs.dtype == torch.float32 and rs.shape == (sum(counts), 1),
                  f"int8 recv {rq.dtype} {rs.dtype} {tuple(rs.shape)}")
            check(torch.equal(rq, wq.reshape(rq.shape)), f"rank {rank}: received int8 rows differ")
            check(torch.equal(rs, wsc.reshape(rs.shape)), f"rank {rank}: received scales differ")
            d = buf.last_stats()["dispatch"]
            out_rows = int(sent[rank].sum() - sent[rank, rank])
            in_rows = int(sent[:, rank].sum() - sent[rank, rank])
            table = (world - 1) * E * 4
            want = (out_rows, in_rows, out_rows * row_b + table, in_rows * row_b + table)
            check((d.rows_sent, d.rows_received, d.bytes_sent, d.bytes_received) == want,
                  f"int8 dispatch {d}, {want}")
            check(d.measured_remote_write == d.bytes_sent,
                  f"int8 dispatch measured {d.measured_remote_write}")
            y = torch.empty(rq.shape[0], hid, dtype=torch.bfloat16)
            row = 0
            for e, c in zip(range(rank * local, (rank + 1) * local), counts):
                y[row:row + c] = (rq[row:row + c].float() * rs[row:row + c] * (e + 1)).bfloat16()
                row += c
            out = buf.combine(y, handle)
            ref = int8_combined(*qs[rank], i, w)
            check(out.dtype == torch.bfloat16 and torch.equal(out, ref),
                  f"rank {rank}: int8 combine differs from the torch reference bit for bit "
                  f"(max {float((out.float() - ref.float()).abs().max())})")
            c = buf.last_stats()["combine"]
            check(c.bytes_received == out_rows * hid * 2 and c.measured_remote_read == c.bytes_received,
                  f"int8 combine bytes {c}")
        buf.close()
    # low-latency mode (examples/moe_decode_int8.strata): rank s's int8 rows and scales for local
    # expert l at [l, s * T:][:c], in its token order; the combine as above, bit for bit
    buf = Buffer(comm, hidden=H, max_tokens=T, num_experts=E, topk=K, dtype=torch.bfloat16,
                 payload=torch.int8, low_latency_mode=True)
    local = E // world
    xs, ids, ws = routing(world, 7, H)
    xs = [x.bfloat16() for x in xs]
    qs = [quant(x) for x in xs]
    x, i, w = xs[rank], ids[rank], ws[rank]
    (rq, rs), counts, handle = buf.dispatch(x, i, w)
    check(rq.shape == (local, world * T, H) and rs.shape == (local, world * T, 1), f"ll int8 {rq.shape} {rs.shape}")
    y = torch.zeros(local, world * T, H, dtype=torch.bfloat16)
    for l_, e in enumerate(range(rank * local, (rank + 1) * local)):
        for s in range(world):
            t = torch.nonzero(ids[s] == e)[:, 0]     # s's entries for e, in (token, k) order
            c = len(t)
            check(handle.recv_rows_per_expert_and_rank[l_][s] == c, f"ll int8 rows of {s} for {e}")
            check(torch.equal(rq[l_, s * T:s * T + c], qs[s][0][t]) and
                  torch.equal(rs[l_, s * T:s * T + c], qs[s][1][t]), f"rank {rank}: ll int8 rows of {s} for {e}")
            y[l_, s * T:s * T + c] = (rq[l_, s * T:s * T + c].float() * rs[l_, s * T:s * T + c] * (e + 1)).bfloat16()
    out = buf.combine(y, handle)
    check(torch.equal(out, int8_combined(*qs[rank], i, w)),
          f"rank {rank}: ll int8 combine differs from the torch reference")
    buf.close()


SCENARIOS = {f.__name__: f for f in (numbers, refusals, overflow, low_latency, int8, masked)}


def main(scenario, rank, world, store_path):
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    comm = stratac.Communicator.from_process_group(heap_bytes=8 << 20)
    for name in scenario.split(","):
        SCENARIOS[name](comm, rank, world)
        print(f"PASS {name}", flush=True)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
