"""The heap side of a backend call: the caller's tensors on the group's symmetric heap.

In: a call's tensors (the caller's: on the group's heap or anywhere) and the group's staging area.
Out: the heap tensors a kernel runs on (the caller's own when they lie on the heap, else views of
the staging area), the copies into them and out of them, and the counts of what the backend did
(STATS). A `Call` records them; a `Plan` replays them for every later call of the same tensors'
layouts (stratac.distributed.collectives, Group.run). `Unsupported` is how a mapping says no
schedule takes a call (the backend then falls back).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, field

import torch

STAGING_ALIGN = 512                 # abi.HEAP_ALIGN: every staged tensor starts on a heap block


class Unsupported(Exception):
    """No stratac schedule takes this call (the message says why); the backend falls back."""


@dataclass
class Stats:
    """What the backend did, per op ("all_reduce", ...) and dtype, since the process started."""
    kernels: Counter = field(default_factory=Counter)      # op -> calls run by a stratac kernel
    zero_copy: Counter = field(default_factory=Counter)    # op -> of those, with no staging copy
    staged_bytes: Counter = field(default_factory=Counter)  # op -> bytes copied in and out
    fallback: Counter = field(default_factory=Counter)     # (op, dtype, reason) -> calls run by gloo

    def as_dict(self) -> dict:
        return {"kernels": dict(self.kernels), "zero_copy": dict(self.zero_copy),
                "staged_bytes": dict(self.staged_bytes),
                "fallback": {f"{op} {dtype}: {why}": n for (op, dtype, why), n in self.fallback.items()}}


STATS = Stats()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def esize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous heap tensor, as uint8 (a view)."""
    return t.reshape(-1).view(torch.uint8)


class Plan:
    """A call's heap side, recorded: copies into the heap, the launch, copies out. A copy between
    contiguous memory is a memmove of addresses (one thread: torch's copy_ would wake its OpenMP
    pool, which spins on the CPUs the model's cores run on); any other is a copy_ of the tensors,
    and then the plan holds the caller's tensors and is not kept."""

    def __init__(self, op: str, ins: list, outs: list, launch, staged: int, storages: tuple, comm):
        self.op, self.ins, self.outs, self.launch, self.staged = op, ins, outs, launch, staged
        self.storages, self._live = storages, comm._live
        self.cacheable = all(isinstance(c[0], int) for c in (*ins, *outs))

    def live(self) -> bool:
        """The heap tensors of the caller that the launch uses are still allocated (comm.free)."""
        return all(cd in self._live for cd in self.storages)

    def replay(self) -> None:
        for dst, src, n in self.ins:
            ctypes.memmove(dst, src, n) if isinstance(dst, int) else dst.copy_(src)
        self.launch()
        self.finish()

    def finish(self) -> None:
        """The copies out, once the launch has returned, and the call counted."""
        for dst, src, n in self.outs:
            ctypes.memmove(dst, src, n) if isinstance(dst, int) else dst.copy_(src)
        STATS.kernels[self.op] += 1
        if self.staged:
            STATS.staged_bytes[self.op] += self.staged
        else:
            STATS.zero_copy[self.op] += 1


class Call:
    """The heap tensors of one call (group: a collectives.Group: its heap, staging area and comm): the caller's own when they lie on the group's heap, else
    views of the staging area (carved in order, each on a heap block), with the copies in and out
    counted. Recording (eager=False): the copies are kept for a _Plan. Eager: copies in run at
    once; results are copied out when the call's kernels have returned (the `with` block)."""

    def __init__(self, group, op: str, eager: bool):
        self.group, self.op, self.eager = group, op, eager
        self._at = 0
        self._ins: list = []
        self._outs: list = []
        self._storages: list = []
        self._staged = 0

    # ---- eager use: `with group.call(op) as c:`
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.plan(lambda: None).finish()
        return False

    def plan(self, launch) -> Plan:
        return Plan(self.op, self._ins, self._outs, launch, self._staged, tuple(self._storages),
                     self.group.comm)

    def count(self, nbytes: int) -> None:
        self._staged += nbytes

    def _copy(self, into: list, dst: torch.Tensor, src: torch.Tensor) -> None:
        """dst <- src, both of src's dtype and shape; recorded, or run now (eager, copies in)."""
        n = tensor_bytes(src)
        self._staged += n
        if self.eager and into is self._ins:
            dst.copy_(src)
        elif dst.is_cpu and src.is_cpu and dst.is_contiguous() and src.is_contiguous():
            into.append((dst.data_ptr(), src.data_ptr(), n))
        else:
            into.append((dst, src, n))

    def scratch(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """numel elements of the staging area, on a heap block of their own."""
        nbytes = numel * esize(dtype)
        arena = self.group.staging()
        lo = self._at
        self._at = lo + (nbytes + STAGING_ALIGN - 1) // STAGING_ALIGN * STAGING_ALIGN
        if self._at > arena.numel():
            raise Unsupported(f"the call needs {self._at} bytes of staging, more than the group's "
                              f"{arena.numel()} (STRATAC_HEAP_BYTES / 2; or allocate the tensors with "
                              "stratac.distributed.empty)")
        return arena[lo:lo + nbytes].view(dtype)

    def _zero_copy(self, t: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor | None:
        """t itself, seen as numel of dtype, when it lies on the group's heap and needs no padding."""
        if self.group.owns(t) and t.is_contiguous() and numel * esize(dtype) == tensor_bytes(t):
            self._storages.append(t.untyped_storage()._cdata)
            flat = t.reshape(-1)
            return flat.view(dtype) if dtype != t.dtype else flat
        return None

    def input(self, t: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor:
        x = self._zero_copy(t, dtype, numel)
        if x is None:
            x = self.scratch(numel, dtype)
            self._copy(self._ins, _bytes_of(x)[:tensor_bytes(t)].view(t.dtype).view(t.shape), t)
        return x

    def output(self, t: torch.Tensor, dtype: torch.dtype, numel: int) -> torch.Tensor:
        x = self._zero_copy(t, dtype, numel)
        if x is None:
            x = self.scratch(numel, dtype)
            self._copy(self._outs, t, _bytes_of(x)[:tensor_bytes(t)].view(t.dtype).view(t.shape))
        return x

    def inout(self, t: torch.Tensor, dtype: torch.dtype, numel: int, back: bool = True) -> torch.Tensor:
        x = self._zero_copy(t, dtype, numel)
        if x is None:
            x = self.input(t, dtype, numel)
            if back:
                self._copy(self._outs, t, _bytes_of(x)[:tensor_bytes(t)].view(t.dtype).view(t.shape))
        return x

    def input_blocks(self, blocks: list[torch.Tensor], dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The blocks one after another, numel elements of dtype each (a block padded up to it)."""
        x = self.scratch(numel * len(blocks), dtype)
        rows = _bytes_of(x).view(len(blocks), -1)
        for r, b in enumerate(blocks):
            self._copy(self._ins, rows[r, :tensor_bytes(b)].view(b.dtype).view(b.shape), b)
        return x

    def output_blocks(self, blocks: list[torch.Tensor], dtype: torch.dtype, numel: int) -> torch.Tensor:
        x = self.scratch(numel * len(blocks), dtype)
        rows = _bytes_of(x).view(len(blocks), -1)
        for r, b in enumerate(blocks):
            self._copy(self._outs, b, rows[r, :tensor_bytes(b)].view(b.dtype).view(b.shape))
        return x
