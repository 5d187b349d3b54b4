"""AllReduce, AllGather and MoE dispatch/combine from PyTorch, on the CPU build, under torchrun:

    torchrun --nproc-per-node 4 examples/python/torchrun_allreduce_moe.py

Every rank allocates its tensors on the symmetric heap (registration on allocation), runs stratac
schedules on them and checks each result against torch.distributed (gloo): all_reduce and
all_gather for the collectives; for MoE, a plain PyTorch dispatch/combine built on all_to_all of
the routed rows. Exits non-zero on any mismatch.
"""

from pathlib import Path

import torch
import torch.distributed as dist

import stratac

EXAMPLES = Path(__file__).resolve().parent.parent


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = stratac.Communicator.from_process_group(heap_bytes=64 << 20)
    twoshot = comm.load(EXAMPLES / "allreduce_twoshot.strata")
    gather = comm.load(EXAMPLES / "allgather_push.strata")
    failures = 0

    torch.manual_seed(1234 + rank)
    for n, dtype, op in [(1 << 20, torch.float32, "sum"), (4099, torch.bfloat16, "max"),
                         (1, torch.int32, "min")]:
        data = torch.randint(-100, 100, (n,)).to(dtype)
        x = comm.empty(n, dtype=dtype)            # on the heap: peers read and write it directly
        x.copy_(data)
        twoshot.allreduce_twoshot(x, op=op)
        ref = data.clone()
        dist.all_reduce(ref, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                                 "min": dist.ReduceOp.MIN}[op])
        if not torch.equal(x, ref):
            failures += 1
            print(f"rank {rank}: allreduce_twoshot({op}, {dtype}, n={n}) differs from gloo")
        comm.free(x)

    x = comm.empty(1000, dtype=torch.float32)
    out = comm.empty(1000 * world, dtype=torch.float32)
    x.copy_(torch.arange(1000, dtype=torch.float32) + 1000 * rank)
    gather.allgather_push(x, out)
    ref = [torch.empty(1000) for _ in range(world)]
    dist.all_gather(ref, x.clone())
    if not torch.equal(out, torch.cat(ref)):
        failures += 1
        print(f"rank {rank}: allgather_push differs from gloo")

    failures += moe(comm, rank, world)

    comm.close()
    total = torch.tensor([failures])
    dist.all_reduce(total)
    if rank == 0:
        print("torchrun_allreduce_moe: OK" if int(total) == 0 else
              f"torchrun_allreduce_moe: {int(total)} failures")
    dist.destroy_process_group()
    return int(total != 0)


def moe(comm, rank: int, world: int) -> int:
    """MoE prefill dispatch, an expert step, combine; against the same computed with all_to_all."""
    tokens, hidden, topk, experts = 96, 256, 4, 4 * world
    local = experts // world
    prefill = comm.load(EXAMPLES / "moe_prefill.strata")
    torch.manual_seed(99 + rank)
    x = comm.empty(tokens, hidden, dtype=torch.bfloat16)
    x.copy_(torch.randn(tokens, hidden).to(torch.bfloat16))
    ids = comm.empty(tokens, topk, dtype=torch.int32)             # top-k expert ids, -1 = none
    ids.copy_(torch.stack([torch.randperm(experts)[:topk] for _ in range(tokens)]).int())
    ids[::7, -1] = -1
    weights = comm.empty(tokens, topk, dtype=torch.float32)
    weights.copy_(torch.softmax(torch.randn(tokens, topk), dim=1))
    counts = comm.zeros(world, experts, dtype=torch.int32)        # the count table, every rank's row
    win = comm.zeros(world * tokens * topk, hidden, dtype=torch.bfloat16)   # my experts' window
    y = comm.empty(tokens, hidden, dtype=torch.bfloat16)
    scale = torch.arange(1, experts + 1, dtype=torch.bfloat16)   # the "experts": row * (e + 1)

    comm.barrier()
    prefill.moe_prefill_dispatch(x, ids, counts, win)
    row = 0                                                        # expert step on my window
    for e in range(rank * local, (rank + 1) * local):
        n = int(counts[:, e].sum())
        win[row:row + n] *= scale[e]
        row += n
    prefill.moe_prefill_combine(win, ids, weights, counts, y)

    # plain PyTorch: send each routed row to its expert's rank with all_to_all, apply the expert
    # there, send the outputs back the same way, weight and sum
    valid = (ids >= 0).nonzero().tolist()
    dest = [int(ids[t, k]) // local for t, k in valid]
    order = sorted(range(len(valid)), key=lambda i: dest[i])
    send_rows = torch.stack([x[valid[i][0]] for i in order]) if order else torch.zeros(0, hidden)
    send_eids = torch.tensor([int(ids[valid[i][0], valid[i][1]]) for i in order], dtype=torch.int64)
    send_n = torch.bincount(torch.tensor(dest, dtype=torch.int64), minlength=world)
    recv_n = torch.empty_like(send_n)
    dist.all_to_all_single(recv_n, send_n)
    recv_rows = torch.empty(int(recv_n.sum()), hidden, dtype=torch.bfloat16)
    recv_eids = torch.empty(int(recv_n.sum()), dtype=torch.int64)
    dist.all_to_all_single(recv_rows, send_rows.contiguous(), recv_n.tolist(), send_n.tolist())
    dist.all_to_all_single(recv_eids, send_eids, recv_n.tolist(), send_n.tolist())
    out_rows = recv_rows * scale[recv_eids].unsqueeze(1)
    back = torch.empty_like(send_rows)
    dist.all_to_all_single(back, out_rows, send_n.tolist(), recv_n.tolist())
    ref = torch.zeros(tokens, hidden)
    for j, i in enumerate(order):
        t, k = valid[i]
        ref[t] += weights[t, k] * back[j].float()
    if not torch.allclose(y.float(), ref.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2):
        print(f"rank {rank}: MoE dispatch/combine differs from the all_to_all reference "
              f"(max error {float((y.float() - ref).abs().max()):.3g})")
        return 1
    for t in (y, win, counts, weights, ids, x):
        comm.free(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
