"""A tiny MoE layer on stratac's DeepEP-style Buffer, under torchrun on the CPU build:

    torchrun --nproc-per-node 4 examples/python/moe_layer.py [--tokens 64 --hidden 128 ...]

The layer: a router (a linear layer, top-k of its logits, softmax over the k), experts that are
two torch matmuls each (silu(x @ w1[e]) @ w2[e]), the experts split evenly over the ranks. Every
rank routes its own tokens (ranks have different numbers of tokens), dispatches them with
`buf.dispatch`, runs its local experts on the rows it received, and gets its tokens back with
`buf.combine`. The same layer is then computed in this process without any communication (every
expert applied to this rank's own tokens) and compared. Rank 0 prints every rank's time and bytes
of each call. Prints `moe_layer: OK` and exits 0 when every rank matches, non-zero otherwise.
"""

import argparse
import sys

import torch
import torch.distributed as dist

import stratac

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}   # relative, of max |ref|


def make_layer(hidden: int, ffn: int, experts: int, seed: int):
    """The layer's weights, the same on every rank (one seed): router [hidden, experts], and per
    expert w1 [hidden, ffn], w2 [ffn, hidden]."""
    g = torch.Generator().manual_seed(seed)
    router = torch.randn(hidden, experts, generator=g) / hidden ** 0.5
    w1 = torch.randn(experts, hidden, ffn, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, ffn, hidden, generator=g) / ffn ** 0.5
    return router, w1, w2


def route(x: torch.Tensor, router: torch.Tensor, topk: int):
    """Top-k experts of each token and their weights (softmax over the k chosen logits)."""
    logits = x.float() @ router
    vals, idx = logits.topk(topk, dim=1)
    return idx, torch.softmax(vals, dim=1)


def expert(rows: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert on a batch of rows, computed in f32."""
    return torch.nn.functional.silu(rows.float() @ w1) @ w2


def reference(x, router, w1, w2, topk: int) -> torch.Tensor:
    """The layer without communication: every token through its top-k experts, weighted, summed
    (the expert outputs rounded to the token dtype, as they travel back in it)."""
    idx, weights = route(x, router, topk)
    out = torch.zeros(x.shape[0], x.shape[1])
    for k in range(topk):
        for e in idx[:, k].unique().tolist():
            sel = idx[:, k] == e
            y = expert(x[sel], w1[e], w2[e]).to(x.dtype).float()
            out[sel] += weights[sel, k:k + 1] * y
    return out.to(x.dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64, help="most tokens a rank routes per step")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=64)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--steps", type=int, default=2, help="layer calls (the buffer is reused)")
    ap.add_argument("--max-recv", type=int, default=None,
                    help="rows a rank may receive (default 2 x tokens x topk, twice a uniform share)")
    ap.add_argument("--low-latency", action="store_true",
                    help="the decode schedules (recv_x per local expert and source rank, as DeepEP's "
                         "low-latency mode)")
    ap.add_argument("--break-rank", type=int, default=None,
                    help="scale this rank's expert outputs by 1.1, to see a mismatch reported")
    ap.add_argument("--trace", default=None, help="write a Perfetto trace of the calls to this file")
    args = ap.parse_args(argv)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dtype = DTYPES[args.dtype]
    router, w1, w2 = make_layer(args.hidden, args.ffn, args.experts, seed=7)
    trace_dir = f"{args.trace}.d" if args.trace else None
    buf = stratac.Buffer(None, hidden=args.hidden, max_tokens=args.tokens, num_experts=args.experts,
                         topk=args.topk, dtype=dtype, low_latency_mode=args.low_latency,
                         max_recv=None if args.low_latency else args.max_recv or 2 * args.tokens * args.topk,
                         trace=trace_dir)
    local = buf.local_experts          # the experts whose weights this rank uses
    failures = 0
    for step in range(args.steps):
        n = args.tokens - (rank + step) % 3          # ranks route different numbers of tokens
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(n, args.hidden, generator=g).to(dtype)

        topk_idx, topk_weights = route(x, router, args.topk)
        recv_x, per_expert, handle = buf.dispatch(x, topk_idx, topk_weights)
        for li, e in enumerate(local):
            if args.low_latency:                     # [local expert, source rank x max_tokens, hidden]
                blocks = [recv_x[li, s * args.tokens:][:c]
                          for s, c in enumerate(handle.recv_rows_per_expert_and_rank[li])]
            else:                                    # local expert l's rows follow those of 0..l-1
                start = sum(per_expert[:li])
                blocks = [recv_x[start:start + per_expert[li]]]
            for rows in blocks:
                y = expert(rows, w1[e], w2[e])
                if rank == args.break_rank:
                    y = y * 1.1
                rows.copy_(y.to(dtype))              # the output in place of the input
        out = buf.combine(recv_x, handle)

        ref = reference(x, router, w1, w2, args.topk)
        err = float((out.float() - ref.float()).abs().max()) if n else 0.0
        scale = max(float(ref.float().abs().max()), 1e-6) if n else 1.0
        if err > TOLERANCE[dtype] * scale:
            failures += 1
            print(f"rank {rank} step {step}: mismatch against the single-process reference: "
                  f"max error {err:.3g} (max |ref| {scale:.3g})", file=sys.stderr)
        stats = buf.stats(all_ranks=True)
        if rank == 0:
            for kind in ("dispatch", "combine"):
                per = stats[kind]
                slow = max(per, key=lambda s: s.us)
                print(f"step {step} {kind}: " + ", ".join(
                    f"rank {s.rank} {s.us:.0f} us, sent {s.bytes_sent} B, received {s.bytes_received} B"
                    for s in per) + f"; slowest rank {slow.rank}")
    if args.trace:
        buf.write_trace(args.trace)
        if rank == 0:
            print(f"trace: {args.trace}")
    buf.close()
    total = torch.tensor([failures])
    dist.all_reduce(total)
    if rank == 0:
        print("moe_layer: OK" if int(total) == 0 else f"moe_layer: {int(total)} mismatches")
    dist.destroy_process_group()
    return int(int(total) != 0)


if __name__ == "__main__":
    raise SystemExit(main())
