"""What `stratac run` feeds a schedule and what it expects back, by contract, computed with torch.

Inputs are small integers (in [-8, 8]) in the element type, so every reference result is exact in
every dtype up to world 16 and results are compared bit for bit. Buffers the contract writes start
as a sentinel so that an element the schedule forgot to write is caught.
Bandwidth follows nccl-tests: algbw = S / t; busbw = algbw x factor: AllReduce 2(n-1)/n; AllGather,
ReduceScatter and AllToAll (n-1)/n; Broadcast and Reduce 1. S is the whole gathered (AllGather) or
scattered (ReduceScatter) buffer, one rank's send buffer for AllToAll, the buffer otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ir

SENTINEL = -3  # an output element the schedule never wrote keeps it; inputs never sum to it everywhere

K = ir.ContractKind


@dataclass(frozen=True)
class Workload:
    schedule: ir.Schedule
    world: int
    count: int          # the value of the size symbol(s)
    op: str = "sum"     # for a schedule with a redop parameter
    root: int = 0       # for every rank parameter

    @property
    def sizes(self) -> dict[str, int]:
        return {n: self.count for n in self.schedule.sizes}

    @property
    def scalars(self) -> dict[str, object]:
        out: dict[str, object] = {x.name: self.root for x in self.schedule.rank_params}
        if self.schedule.op_param:
            out[self.schedule.op_param.name] = self.op
        return out

    @property
    def reduce_op(self) -> str:
        op = self.schedule.contract.op
        return self.op if isinstance(op, ir.OpParam) else (op.value if op else "sum")

    def numel(self, p: ir.Buffer) -> int:
        return p.size.eval({"world": self.world, **self.sizes})

    @staticmethod
    def main_buffer(s: ir.Schedule) -> ir.Buffer:
        c = s.contract
        return s.param(c.outputs[0] if c.kind is K.ALLGATHER else c.inputs[0])

    @staticmethod
    def count_for_bytes(s: ir.Schedule, world: int, nbytes: int, elem: int) -> int:
        """The size symbol's value that makes S (nccl-tests' size) nbytes."""
        main = Workload.main_buffer(s)
        scale = 1
        if s.sizes:
            k = ir.size_scale(main.size, s.sizes[0])
            scale = k.eval({"world": world}) if k is not None else 1
        return max(1, nbytes // (elem * max(scale, 1)))

    def size_bytes(self, elem: int) -> int:
        return self.numel(self.main_buffer(self.schedule)) * elem

    def busbw_factor(self) -> float:
        n, kind = self.world, self.schedule.contract.kind
        if kind is K.ALLREDUCE:
            return 2 * (n - 1) / n
        if kind in (K.BROADCAST, K.REDUCE):
            return 1.0
        return (n - 1) / n

    def input(self, name: str, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + sum(map(ord, name)))
        p = self.schedule.param(name)
        return torch.randint(-8, 9, (self.numel(p),), generator=g).to(dtype)

    def fill(self, tensors: dict[str, torch.Tensor], rank: int, seed: int) -> None:
        c = self.schedule.contract
        for p in self.schedule.tensors:
            t = tensors[p.name]
            if p.name in c.inputs:
                t.copy_(self.input(p.name, rank, seed, t.dtype))
            else:
                t.fill_(SENTINEL)

    def _reduce(self, name: str, seed: int, part: slice = slice(None)) -> torch.Tensor:
        # accumulated rank by rank (not stacked): two buffers of memory instead of world of them,
        # which is what lets `stratac bench` check 256 MiB on 4 ranks; exact either way
        combine = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}[self.reduce_op]
        acc = self.input(name, 0, seed, torch.float64)[part].clone()
        for r in range(1, self.world):
            acc = combine(acc, self.input(name, r, seed, torch.float64)[part], out=acc)
        return acc

    def expected(self, name: str, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The reference value of a parameter after the call, or None if the contract says nothing."""
        c = self.schedule.contract
        x, out = c.inputs[0], c.outputs[0]
        if name != out:
            return self.input(name, rank, seed, dtype) if name in c.inputs else None
        if c.kind is K.ALLREDUCE:
            return self._reduce(x, seed).to(dtype)
        if c.kind is K.ALLGATHER:
            return torch.cat([self.input(x, r, seed, dtype) for r in range(self.world)])
        if c.kind is K.REDUCESCATTER:
            m = self.numel(self.schedule.param(out))
            return self._reduce(x, seed, slice(rank * m, (rank + 1) * m)).to(dtype)
        if c.kind is K.BROADCAST:
            return self.input(x, self.root, seed, dtype)
        if c.kind is K.REDUCE:
            if rank == self.root:
                return self._reduce(x, seed).to(dtype)
            return self.input(x, rank, seed, dtype) if c.in_place else None
        m = self.numel(self.schedule.param(x)) // self.world   # ALLTOALL
        return torch.cat([self.input(x, p, seed, dtype)[rank * m:(rank + 1) * m]
                          for p in range(self.world)])
