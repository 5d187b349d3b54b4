"""What `stratac run` feeds a schedule and what it expects back, by contract, computed with torch.

Inputs are small integers (in [-8, 8]) in the element type, so every reference result is exact in
every dtype up to world 16 and results are compared bit for bit. Buffers the contract writes start
as a sentinel so that an element the schedule forgot to write is caught.
Bandwidth follows nccl-tests: algbw = S / t; busbw = algbw x factor (AllReduce 2(n-1)/n, AllGather
(n-1)/n with S the whole gathered buffer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ir

SENTINEL = -3  # a value no reference result of these inputs can take by accident everywhere


@dataclass(frozen=True)
class Workload:
    schedule: ir.Schedule
    world: int
    count: int          # the size symbol's value (elements per rank of the input)

    @property
    def sizes(self) -> dict[str, int]:
        return {n: self.count for n in self.schedule.sizes}

    def numel(self, p: ir.Buffer) -> int:
        return p.size.eval({"world": self.world, **self.sizes})

    @staticmethod
    def count_for_bytes(s: ir.Schedule, world: int, nbytes: int, elem: int) -> int:
        """n such that S (nccl-tests' size) is nbytes."""
        if s.contract.kind is ir.ContractKind.ALLGATHER:
            return max(1, nbytes // (elem * world))
        return max(1, nbytes // elem)

    def size_bytes(self, elem: int) -> int:
        if self.schedule.contract.kind is ir.ContractKind.ALLGATHER:
            return self.count * self.world * elem
        return self.count * elem

    def busbw_factor(self) -> float:
        n = self.world
        if self.schedule.contract.kind is ir.ContractKind.ALLREDUCE:
            return 2 * (n - 1) / n
        return (n - 1) / n

    def input(self, name: str, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + sum(map(ord, name)))
        p = self.schedule.param(name)
        return torch.randint(-8, 9, (self.numel(p),), generator=g).to(dtype)

    def fill(self, tensors: dict[str, torch.Tensor], rank: int, seed: int) -> None:
        c = self.schedule.contract
        for p in self.schedule.params:
            t = tensors[p.name]
            if p.name in c.inputs:
                t.copy_(self.input(p.name, rank, seed, t.dtype))
            else:
                t.fill_(SENTINEL)

    def expected(self, name: str, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The reference value of a parameter after the call, or None if the contract says nothing."""
        c = self.schedule.contract
        if c.kind is ir.ContractKind.ALLREDUCE:
            if name != c.inputs[0]:
                return None
            stack = torch.stack([self.input(name, r, seed, torch.float64) for r in range(self.world)])
            red = {ir.ReduceOp.SUM: stack.sum(0), ir.ReduceOp.MAX: stack.max(0).values,
                   ir.ReduceOp.MIN: stack.min(0).values}[c.op]
            return red.to(dtype)
        if name == c.outputs[0]:
            return torch.cat([self.input(c.inputs[0], r, seed, dtype) for r in range(self.world)])
        if name in c.inputs:
            return self.input(name, rank, seed, dtype)
        return None
