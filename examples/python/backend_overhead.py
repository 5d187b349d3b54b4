"""Where a small all_reduce's time goes through the torch.distributed backend "stratac", on one rank:

    python examples/python/backend_overhead.py [--elements 1024] [--rounds 4000]

One process (world 1: no peer's spinning cores share the CPUs, so the Python costs show as they
are). Each round calls four variants once, in turn, on one tensor of the group's heap
(stratac.distributed.empty), and times each call; the medians are printed:

    direct           the entry point the backend runs (its Selector over the library's schedules)
    ProcessGroup     the backend's allreduce, called from Python (its mapping, lookup and replay)
    dist.all_reduce  through torch.distributed, as programs call it
    null backend     dist.all_reduce on a Python process group that does nothing: torch's own
                     dispatch to any Python backend

docs/bench.md, "The torch.distributed backend", has a run.
"""

import argparse
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

import stratac.distributed as sd


class NullGroup(dist.ProcessGroup):
    """A Python process group whose all_reduce returns a completed Work at once."""

    def __init__(self):
        super().__init__(0, 1)
        self._done = sd.Work([], "nothing")
        self._name = ""

    def getBackendName(self):  # noqa: N802 (torch's name)
        return "null"

    def setGroupName(self, name):  # noqa: N802
        self._name = name

    def getGroupName(self):  # noqa: N802
        return self._name

    @property
    def group_name(self):
        return self._name

    def allreduce(self, tensors, opts=None):
        return self._done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1024, help="float32 elements (1024: 4 KiB)")
    ap.add_argument("--rounds", type=int, default=4000)
    args = ap.parse_args()
    dist.Backend.register_backend("null", lambda opts, backend_options=None: NullGroup(), extended_api=True,
                                  devices=["cpu"])
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("stratac", init_method=f"file://{d}/store", rank=0, world_size=1)
        null = dist.new_group([0], backend="null")
        pg = dist.distributed_c10d._get_default_group()
        z = sd.empty(args.elements)
        z.fill_(1)
        direct = pg._group.selector(sd.collectives.ir.ContractKind.ALLREDUCE)
        opts = c10d.AllreduceOptions()
        opts.asyncOp = False
        variants = {"direct": lambda: direct(z, op="sum"), "ProcessGroup": lambda: pg.allreduce([z], opts),
                    "dist.all_reduce": lambda: dist.all_reduce(z), "null backend": lambda: dist.all_reduce(z, group=null)}
        times = {k: [] for k in variants}
        clock = time.perf_counter
        for _ in range(args.rounds):
            for name, call in variants.items():
                t0 = clock()
                call()
                times[name].append(clock() - t0)
        if not bool((z == 1).all()):
            raise SystemExit("backend_overhead: the all_reduce of one rank changed its tensor")
        base = statistics.median(times["direct"]) * 1e6
        print(f"all_reduce of {args.elements * 4} bytes, world 1, {args.rounds} rounds, medians:")
        for name, ts in times.items():
            us = statistics.median(ts) * 1e6
            print(f"  {name:16s} {us:8.2f} us   {'' if name in ('direct', 'null backend') else f'+{us - base:.2f} us'}")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
