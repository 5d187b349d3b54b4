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

from stratac import ir

SENTINEL = -3  # an output element the schedule never wrote keeps it; inputs never sum to it everywhere

K = ir.ContractKind


@dataclass(frozen=True)
class Workload:
    schedule: ir.Schedule
    world: int
    count: int          # the value of the size symbol(s)
    op: str = "sum"     # for a schedule with a redop parameter
    root: int = 0       # for every rank parameter
    params: tuple[tuple[str, int], ...] = ()   # the divisor parameters by name (`--param NAME=D`)
    elem: int | None = None   # the element size in bytes, which a scratch's size may name (sizeof(T))

    @property
    def sizes(self) -> dict[str, int]:
        return {n: self.count for n in self.schedule.sizes}

    @property
    def scalars(self) -> dict[str, object]:
        given = dict(self.params)
        out: dict[str, object] = {x.name: self.root if x.kind is ir.ScalarKind.RANK else given[x.name]
                                  for x in self.schedule.int_params}
        if self.schedule.op_param:
            out[self.schedule.op_param.name] = self.op
        return out

    @property
    def reduce_op(self) -> str:
        op = self.schedule.contract.op
        return self.op if isinstance(op, ir.OpParam) else (op.value if op else "sum")

    def numel(self, p: ir.Buffer) -> int:
        """Elements of a tensor or scratch buffer (a scratch's size may name a divisor parameter,
        or sizeof(T): then `elem` must be given)."""
        elem = ir.elem_env(self.schedule, self.elem) if self.elem is not None else {}
        return p.size.eval({"world": self.world, **self.sizes, **dict(self.params), **elem})

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

    def defined(self, name: str, rank: int) -> slice:
        """The part of a parameter the contract defines after the call: all of it, but for an
        in-place ReduceScatter's x, block `rank` alone (the other blocks are the schedule's)."""
        c = self.schedule.contract
        if c.kind is K.REDUCESCATTER and c.in_place and name == c.inputs[0]:
            m = self.numel(self.schedule.param(name)) // self.world
            return slice(rank * m, (rank + 1) * m)
        return slice(None)

    def expected(self, name: str, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The reference value of a parameter after the call (of its `defined` part), or None if
        the contract says nothing."""
        c = self.schedule.contract
        x, out = c.inputs[0], c.outputs[0]
        if name != out:
            return self.input(name, rank, seed, dtype) if name in c.inputs else None
        if c.kind is K.ALLREDUCE:
            return self._reduce(x, seed).to(dtype)
        if c.kind is K.ALLGATHER and c.in_place:   # block p: rank p's own block p
            m = self.numel(self.schedule.param(x)) // self.world
            return torch.cat([self.input(x, r, seed, dtype)[r * m:(r + 1) * m] for r in range(self.world)])
        if c.kind is K.ALLGATHER:
            return torch.cat([self.input(x, r, seed, dtype) for r in range(self.world)])
        if c.kind is K.REDUCESCATTER:
            m = self.numel(self.schedule.param(out)) // (self.world if c.in_place else 1)
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


# ---- MoE dispatch and combine ----

class PairingError(ValueError):
    """A file's MoE schedules cannot be paired up (the message says which and why)."""


def moe_pairs(scheds: list[ir.Schedule]) -> list:
    """The schedules in file order, each MoE dispatch paired with the next combine of the same
    layout, (dispatch, combine); an AllToAllV as (it, None); every other schedule as it is. This is
    how `stratac run` and `stratac bench` run a file."""
    out: list = []
    pending = None
    for s in scheds:
        c = s.contract
        if c.kind is K.ALLTOALLV:
            out.append((s, None))
        elif c.kind.dispatch:
            if pending is not None:
                raise PairingError(f"{pending.name}: a moe_dispatch needs its moe_combine after it in the "
                                   f"file, before the next dispatch ({s.name})")
            pending = s
        elif c.kind is K.MOE_COMBINE:
            if pending is None or _layout(pending.contract) != _layout(c):
                raise PairingError(f"{s.name}: a moe_combine runs after the moe_dispatch of the same "
                                   "layout (packed, per_expert or with a capacity) that precedes it in "
                                   "the file")
            out.append((pending, s))
            pending = None
        else:
            out.append(s)
    if pending is not None:
        raise PairingError(f"{pending.name}: a moe_dispatch needs a moe_combine after it in the file "
                           "(to run dispatch, the expert step and combine)")
    return out


def _layout(c: ir.Contract) -> str:
    return "slots" if c.capacity else "per_expert" if c.region else "packed"


MOE_DEFAULTS = {"tokens": 64, "hidden": 512, "topk": 4, "experts_per_rank": 4}


def divisor_problem(schedules, world: int, params: dict[str, int] | None, command: str) -> str | None:
    """What is wrong with the divisor parameters given (`--param NAME=D`) for these schedules at
    this world, or None: each schedule's must be given and divide the world, and every one given
    must be some schedule's. `command` is the tool, for the message of one that takes none
    (None: `stratac run`, which takes them)."""
    params = params or {}
    every = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
    wanted = {x.name for s in schedules for x in s.int_params if x.kind is ir.ScalarKind.DIVISOR}
    for s in schedules:
        for x in s.int_params:
            if x.kind is not ir.ScalarKind.DIVISOR:
                continue
            if command is not None:
                return (f"{s.name} takes a divisor parameter ({x.name}), which `stratac {command}` "
                        f"cannot give yet: run it with `stratac run --param {x.name}=D`")
            if x.name not in params:
                return (f"{s.name} takes a divisor parameter: give --param {x.name}=D, D a divisor of "
                        f"the world {world} ({every})")
    for name, v in params.items():
        if name not in wanted:
            return f"--param {name}: no schedule of the file takes a divisor parameter {name}"
        if not (v >= 1 and world % v == 0):
            return f"--param {name}={v} does not divide the world {world} (its divisors: {every})"
    return None


def layout_options_problem(schedules, max_recv: int | None, capacity: int | None) -> str | None:
    """What is wrong with giving --max-recv or --capacity to these schedules, or None: each sizes
    one kind of window, and a file none of whose schedules has that window is refused (the option
    would be ignored). --max-recv: a packed window whose rows are a size of their own (a bound), or
    the rows of each expert's region (per_expert(ROWS));
    --capacity: a slotted layout (a contract with a capacity)."""
    from stratac.verify import moe_roles
    moe = [s for s in schedules if s.contract.kind.moe]
    names = ", ".join(s.name for s in schedules) or "no schedule"
    if max_recv is not None and not any("bound" in moe_roles(s) for s in moe):
        return (f"--max-recv {max_recv} applies to a MoE dispatch/combine whose packed window's rows "
                "are a size of their own (e.g. examples/moe_prefill_bounded.strata) or that has a region "
                "per expert (per_expert(ROWS), e.g. examples/moe_prefill_experts.strata), and none of "
                f"this file's schedules ({names}) has one"
                + ("; a slotted layout takes --capacity" if any(s.contract.capacity for s in moe) else "")
                + ": drop --max-recv")
    if capacity is not None and not any(s.contract.capacity for s in moe):
        return (f"--capacity {capacity} applies to a MoE dispatch/combine with slots per (expert, "
                "source rank) (a contract with a capacity, e.g. examples/moe_decode.strata), and none "
                f"of this file's schedules ({names}) has one"
                + ("; a bounded packed window takes --max-recv" if any("bound" in moe_roles(s)
                                                                       for s in moe) else "")
                + ": drop --capacity")
    return None


def moe_options_problem(world: int, topk: int | None, experts: int | None,
                        routing: str = "uniform") -> str | None:
    """What is wrong with a run's MoE options (None meaning MOE_DEFAULTS), or None."""
    from stratac.verify.routing import ROUTINGS
    experts = experts or MOE_DEFAULTS["experts_per_rank"] * world
    topk = topk or MOE_DEFAULTS["topk"]
    if experts % world:
        return (f"--experts {experts} is not a multiple of the world size ({world}): every rank owns "
                "experts / world experts")
    if topk > experts:
        return f"--topk {topk} exceeds --experts {experts}"
    if routing not in ROUTINGS:
        return f"unknown routing {routing!r}; known: {', '.join(ROUTINGS)}"
    return None


@dataclass(frozen=True)
class MoeWorkload:
    """A dispatch/combine pair at concrete sizes and one routing. Every rank can rebuild every
    rank's inputs from the seed, so the references need no communication.

    Tokens are small integers and weights multiples of 1/16, so the stand-in expert step (row of
    expert e times e + 1, in the token dtype) and the weighted sums are exact in float32 and the
    results compare bit for bit in every dtype."""

    dispatch: ir.Schedule
    combine: ir.Schedule | None     # None: a dispatch alone (AllToAllV)
    world: int
    tokens: int
    hidden: int
    topk: int
    experts: int
    routing: str = "uniform"
    max_recv: int | None = None    # a bounded window's rows (its own size symbol); None: any routing
    slots: int | None = None       # a slotted layout's capacity (--capacity); None: tokens

    @staticmethod
    def make(dispatch: ir.Schedule, combine: ir.Schedule | None, world: int, tokens=None, hidden=None,
             topk=None, experts=None, routing: str = "uniform", max_recv=None,
             capacity=None) -> "MoeWorkload":
        """The workload of a run's options, None meaning MOE_DEFAULTS; AllToAllV routes each row to
        one rank (topk 1, one "expert" per rank)."""
        v = dispatch.contract.kind is K.ALLTOALLV
        return MoeWorkload(dispatch, combine, world, tokens or MOE_DEFAULTS["tokens"],
                           hidden or MOE_DEFAULTS["hidden"], 1 if v else topk or MOE_DEFAULTS["topk"],
                           world if v else experts or MOE_DEFAULTS["experts_per_rank"] * world, routing,
                           max_recv, capacity)

    @property
    def capacity(self) -> int:
        """Slots per (expert, source rank) of a slotted layout: --capacity, else `tokens` (a token
        never picks an expert twice, so `tokens` slots hold any routing)."""
        return self.slots if self.slots is not None else max(1, self.tokens)

    @property
    def slotted(self) -> bool:
        return self.dispatch.contract.capacity is not None

    @property
    def region(self) -> int | None:
        """The rows of each local expert's region of the window (per_expert(R)): --max-recv, else
        world x tokens (a token picks an expert at most once, so that holds any routing); None
        for a window without regions."""
        if self.dispatch.contract.region is None:
            return None
        return self.max_recv or self.world * self.tokens

    def _first(self, l: int, s: int, row: int) -> int:
        """The first row of source s's rows for local expert l, `row` rows having gone before."""
        if self.slotted:
            return (l * self.world + s) * self.capacity
        if self.region is not None:
            return l * self.region + row
        return row

    def sizes(self, s: ir.Schedule) -> dict[str, int]:
        from stratac.verify import moe_roles
        roles = {sym: role for role, sym in moe_roles(s).items()}
        value = {"tokens": self.tokens, "topk": self.topk, "hidden": self.hidden,
                 "experts": self.experts, "capacity": self.capacity}
        anyrouting = self.world * self.tokens * self.topk   # rows any routing fits in a packed window
        value["bound"] = self.region or self.max_recv or anyrouting
        return {sym: value.get(roles.get(sym, ""), anyrouting) for sym in s.sizes}

    def shape(self, s: ir.Schedule, p: ir.Buffer) -> list[int]:
        env = {"world": self.world, **self.sizes(s)}
        return [d.eval(env) for d in p.dims]

    def ids(self, rank: int, seed: int) -> torch.Tensor:
        from stratac.verify.routing import expert_ids
        return torch.from_numpy(expert_ids(self.routing, rank, self.tokens, self.topk, self.experts, seed))

    def x(self, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + 1)
        return torch.randint(-8, 9, (self.tokens, self.hidden), generator=g).to(dtype)

    def weights(self, rank: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + 2)
        return torch.randint(0, 17, (self.tokens, self.topk), generator=g).float() / 16

    def counts(self, seed: int) -> torch.Tensor:
        """[world, experts]: row s = how many of rank s's entries pick each expert."""
        rows = []
        for s in range(self.world):
            i = self.ids(s, seed).reshape(-1).long()
            rows.append(torch.bincount(i[i >= 0], minlength=self.experts))
        return torch.stack(rows).to(torch.int32)

    def window(self, rank: int, seed: int, dtype: torch.dtype, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The window of `rank` after dispatch and which of its rows the layout defines (mask),
        built by walking the experts this rank owns, source rank by source rank."""
        local = self.experts // self.world
        win = torch.zeros(rows, self.hidden, dtype=dtype)
        mask = torch.zeros(rows, dtype=torch.bool)
        row = 0
        inputs = [(self.ids(s, seed), self.x(s, seed, dtype)) for s in range(self.world)]
        for l in range(local):
            e = rank * local + l
            row = 0 if self.region is not None else row   # a region's rows count from its start
            for s, (ids, x) in enumerate(inputs):
                start = self._first(l, s, row)
                hits = [int(t) for t, _ in (ids == e).nonzero().tolist()]
                for j, t in enumerate(hits):
                    win[start + j] = x[t]
                    mask[start + j] = True
                row += len(hits)
        return win, mask

    def expert_rows(self, rank: int, counts: torch.Tensor) -> list[tuple[int, int, int]]:
        """(global expert, first row, rows) of every block of this rank's window, from the counts."""
        local = self.experts // self.world
        out, row = [], 0
        for l in range(local):
            e = rank * local + l
            row = 0 if self.region is not None else row   # a region's rows count from its start
            for s in range(self.world):
                n = int(counts[s, e])
                start = self._first(l, s, row)
                out.append((e, start, n))
                row += n
        return out

    def expert_step(self, win: torch.Tensor, rank: int, counts: torch.Tensor) -> None:
        """The stand-in for the experts: each row of expert e is multiplied by e + 1, in place."""
        for e, start, n in self.expert_rows(rank, counts):
            if n:
                win[start:start + n] *= e + 1

    def combined(self, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        """y = sum over k of weights[t, k] * (expert ids[t, k] applied to x[t])."""
        ids, x, w = self.ids(rank, seed), self.x(rank, seed, dtype), self.weights(rank, seed)
        y = torch.zeros(self.tokens, self.hidden, dtype=torch.float64)
        for t in range(self.tokens):
            for k in range(self.topk):
                e = int(ids[t, k])
                if e >= 0:
                    y[t] += float(w[t, k]) * (x[t] * (e + 1)).to(torch.float64)
        return y.to(dtype)

    # ---- a quantised dispatch (examples/moe_prefill_int8.strata): int8 rows and their f32 scales

    @property
    def quantized(self) -> bool:
        """The dispatch moves int8 rows with rows that travel beside them (their scales)."""
        c = self.dispatch.contract
        return bool(c.side) and self.dispatch.param(c.inputs[0]).dtype is ir.DType.I8

    def scale_cols(self) -> int:
        """Scales per token (1: per token; more: per block of the row)."""
        xs = self.dispatch.param(self.dispatch.contract.side[0][0])
        return self.shape(self.dispatch, xs)[1]

    def activations(self, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        """A quantised run's tokens before quantisation: normal values in the activation dtype."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + 3)
        return torch.randn(self.tokens, self.hidden, generator=g).to(dtype)

    def quantize(self, rank: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 rows, f32 scales [tokens, blocks]): per block of hidden / blocks columns (the last
        block takes the rest), each block as the Buffer quantises a token (quantize_per_token: scale
        = max |x| / 127, 1 for an all-zero block, q = x / scale rounded half to even, clamped to
        [-127, 127])."""
        from stratac.host.moe import quantize_per_token  # host.moe loads cffi: only when quantising
        x = self.activations(rank, seed, dtype)
        q = torch.empty(self.tokens, self.hidden, dtype=torch.int8)
        s = torch.empty(self.tokens, self.scale_cols(), dtype=torch.float32)
        for b, (lo, hi) in enumerate(self.scale_blocks()):
            q[:, lo:hi], sc = quantize_per_token(x[:, lo:hi])
            s[:, b] = sc[:, 0]
        return q, s

    def scale_blocks(self) -> list[tuple[int, int]]:
        blocks = self.scale_cols()
        per = -(-self.hidden // blocks)
        return [(min(b * per, self.hidden), min((b + 1) * per, self.hidden)) for b in range(blocks)]

    def dequantized(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Rows q * scale in f32 (each block by its scale)."""
        out = q.float()
        for b, (lo, hi) in enumerate(self.scale_blocks()):
            out[:, lo:hi] *= s[:, b:b + 1]
        return out

    def expert_step_quantized(self, wq: torch.Tensor, ws: torch.Tensor, out: torch.Tensor, rank: int,
                              counts: torch.Tensor) -> None:
        """The stand-in for the experts on a quantised window: each row of expert e dequantised in
        f32, times e + 1 (in f32), written in the activation dtype into the combine's window."""
        for e, start, n in self.expert_rows(rank, counts):
            if n:
                rows = slice(start, start + n)
                out[rows] = (self.dequantized(wq[rows], ws[rows]) * (e + 1)).to(out.dtype)

    def window_quantized(self, rank: int, seed: int, dtype: torch.dtype,
                         rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(int8 window, scale window, mask of the rows the layout defines) after dispatch."""
        local = self.experts // self.world
        wq = torch.zeros(rows, self.hidden, dtype=torch.int8)
        ws = torch.zeros(rows, self.scale_cols(), dtype=torch.float32)
        mask = torch.zeros(rows, dtype=torch.bool)
        row = 0
        inputs = [(self.ids(s, seed), *self.quantize(s, seed, dtype)) for s in range(self.world)]
        for l in range(local):
            e = rank * local + l
            row = 0 if self.region is not None else row   # a region's rows count from its start
            for s, (ids, q, sc) in enumerate(inputs):
                start = self._first(l, s, row)
                hits = [int(t) for t, _ in (ids == e).nonzero().tolist()]
                for j, t in enumerate(hits):
                    wq[start + j], ws[start + j], mask[start + j] = q[t], sc[t], True
                row += len(hits)
        return wq, ws, mask

    def combined_quantized(self, rank: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
        """y[t] = sum over k, in f32 in k order from 0, of weights[t, k] * the expert output of
        entry (t, k) (the dequantised row times e + 1, rounded to the activation dtype), rounded
        once to the activation dtype: the combine's accumulation."""
        ids, w = self.ids(rank, seed), self.weights(rank, seed)
        q, s = self.quantize(rank, seed, dtype)
        deq = self.dequantized(q, s)
        acc = torch.zeros(self.tokens, self.hidden, dtype=torch.float32)
        for t in range(self.tokens):
            for k in range(self.topk):
                e = int(ids[t, k])
                if e >= 0:
                    acc[t] = acc[t] + (deq[t] * (e + 1)).to(dtype).float() * w[t, k]
        return acc.to(dtype)

    def row_bytes(self, dtype: ir.DType) -> int:
        """Bytes a dispatch moves per routed row: hidden x the token size, plus the scales."""
        if self.quantized:
            return self.hidden * ir.DType.I8.nbytes + self.scale_cols() * ir.DType.F32.nbytes
        return self.hidden * dtype.nbytes

    def received_rows(self, seed: int) -> int:
        """Rows all ranks receive together (DeepEP counts dispatch bytes as the rows received)."""
        return int(self.counts(seed).sum())
