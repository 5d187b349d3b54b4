"""AllReduce and friends from PyTorch, on the CPU build, under torchrun:

    torchrun --nproc-per-node 4 examples/python/allreduce_torchrun.py

Every rank allocates its tensors on the symmetric heap (registration on allocation), runs stratac
schedules on them and checks each result against torch.distributed's own all_reduce/all_gather
(gloo). Exits non-zero on any mismatch.
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

    comm.close()
    total = torch.tensor([failures])
    dist.all_reduce(total)
    if rank == 0:
        print("allreduce_torchrun: OK" if int(total) == 0 else f"allreduce_torchrun: {int(total)} failures")
    dist.destroy_process_group()
    return int(total != 0)


if __name__ == "__main__":
    raise SystemExit(main())
