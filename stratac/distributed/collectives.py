"""torch.distributed's collectives as stratac schedules: one group's side of the backend.

In: a torch.distributed group's store, rank, size and timeout; each collective as torch hands it to
a backend (tensor lists, a ReduceOp, a root, split sizes). Out: the result written into the
caller's tensors by a proven stratac kernel, or `Unsupported` with the reason, which the backend
(stratac.distributed.backend) turns into its gloo fallback or, with STRATAC_FALLBACK=error, an
error naming the op and dtype.

Each torch collective maps onto one contract of the schedule library (LIBRARY: example schedules
shipped in the wheel, or the user's, stratac.distributed.use):

    all_reduce                     allreduce (SUM, MAX, MIN; AVG = SUM, then / world)
    broadcast, reduce              broadcast, reduce (root = the group rank)
    all_gather[_into_tensor]       allgather
    reduce_scatter[_tensor]        reducescatter
    all_to_all_single, all_to_all  alltoall (equal splits), alltoallv (any splits)
    barrier                        allreduce of one int32

Tensors that are not on the group's symmetric heap are copied into a staging area on it (one per
group, carved per call) and the results copied back; every such copy is counted (stats). A
tensor made by stratac.distributed.empty on this group is passed as it is (zero-copy).

Copy-only collectives (broadcast, all_gather, all_to_all) move any dtype: the kernel sees the
bytes as int32 (or float16 when the byte count is only even), which a copy does not interpret.
Reductions run on the element types the kernels compute in (float32, float16, bfloat16, int32).

The decision to run a kernel or not depends only on what every rank of a correct program passes
alike (op, dtype, shapes), so that all ranks take the same path.
"""

from __future__ import annotations

import math
import os

import torch

from stratac import ir
from stratac.distributed.staging import STAGING_ALIGN, STATS, Call, Plan, Unsupported, esize, tensor_bytes
from stratac.host.comm import Communicator
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.host.select import Selector, load_table
from stratac.resources import resource_path

# The schedules each contract runs, from the example schedules the wheel ships (stratac/examples).
LIBRARY = {
    ir.ContractKind.ALLREDUCE: ("allreduce_twoshot.strata", "allreduce_oneshot.strata"),
    ir.ContractKind.BROADCAST: ("broadcast.strata",),
    ir.ContractKind.REDUCE: ("reduce.strata",),
    ir.ContractKind.ALLGATHER: ("allgather_push.strata",),
    ir.ContractKind.REDUCESCATTER: ("reducescatter.strata",),
    ir.ContractKind.ALLTOALL: ("alltoall.strata",),
    ir.ContractKind.ALLTOALLV: ("alltoallv.strata",),
}
COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
DEFAULT_HEAP_BYTES = 256 << 20      # per rank and group; STRATAC_HEAP_BYTES overrides


USER_SOURCES: list = []     # stratac.distributed.use(...): schedules put in front of LIBRARY


_OP_NAMES = {getattr(torch.distributed.ReduceOp, name): name
             for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM")}


_SUM = torch.distributed.ReduceOp.SUM


def op_name(op) -> str:
    """A torch ReduceOp's name (SUM, AVG, ...; PREMUL_SUM for the scaled sums). SUM first: a
    comparison costs less than the enum a lookup makes."""
    if op == _SUM:
        return "SUM"
    return _OP_NAMES.get(getattr(op, "op", op), "PREMUL_SUM")


def moved(dtype: torch.dtype, nbytes: int) -> tuple[torch.dtype, int]:
    """How a copy-only kernel moves nbytes of dtype: (element type, elements). A type the kernels
    know moves as itself; any other as int32 words, padded up to a whole word (the padding is
    moved and never copied back)."""
    if dtype in COMPUTE_DTYPES:
        return dtype, nbytes // esize(dtype)
    return torch.int32, (nbytes + 3) // 4


class Group:
    """One torch.distributed group's stratac side. The communicator (a pool of the CPU model
    with the group's heap) is made at the group's first kernel call: collective, like every call."""

    def __init__(self, store, rank: int, world: int, timeout: float, name: str, target: str = "cpu",
                 heap_bytes: int | None = None):
        self.store, self.rank, self.world, self.timeout, self.name = store, rank, world, timeout, name
        self.target = target
        self.heap_bytes = int(heap_bytes or os.environ.get("STRATAC_HEAP_BYTES", DEFAULT_HEAP_BYTES))
        self._comm: Communicator | None = None
        self._broken: str | None = None   # why the heap could not be set up (then no call runs)
        self._selectors: dict[ir.ContractKind, Selector] = {}
        self._arena: torch.Tensor | None = None
        self._plans: dict[tuple, Plan] = {}

    # ---- the communicator, its schedules and its staging area
    @property
    def comm(self) -> Communicator:
        if self._comm is None:
            if self._broken is not None:
                raise StrataRuntimeError(f"process group {self.name!r}: its symmetric heap could not be set up "
                                         f"at its first call ({self._broken}); no call can run on it: destroy it")
            try:
                if self.target == "npu":   # SHMEM for Ascend: the heap is device memory (docs/npu.md)
                    from stratac.host.npu_comm import NpuCommunicator
                    self._comm = NpuCommunicator.from_store(self.rank, self.world, self.store,
                                                            heap_bytes=self.heap_bytes, timeout=self.timeout)
                else:
                    self._comm = Communicator.from_store(self.rank, self.world, self.store,
                                                         heap_bytes=self.heap_bytes, timeout=self.timeout,
                                                         prefix="stratac")
            except StrataRuntimeError as exc:
                self._broken = str(exc)
                raise
            # the staging area, on every rank at once: heap allocations are collective, and one made
            # only on the ranks that stage would put every later allocation at other offsets
            self._arena = self._comm.empty(self.heap_bytes // 2, dtype=torch.uint8)
        return self._comm

    def owns(self, t: torch.Tensor) -> bool:
        """Whether t lies on this group's heap (a tensor of stratac.distributed.empty)."""
        c = self._comm
        return c is not None and getattr(c, "_open", False) and 0 <= t.data_ptr() - c._base < c.heap_bytes

    def selector(self, kind: ir.ContractKind):
        """The entry point of a contract: a Selector (by size and world), or for AllToAllV its schedule."""
        sel = self._selectors.get(kind)
        if sel is None:
            comm = self.comm
            fns = []
            for source in USER_SOURCES:       # the user's schedules of this contract come first
                mod = comm.load(source)
                fns += [fn for fn in mod.schedules.values() if fn.ir.contract.kind is kind]
            if not fns:
                for file in LIBRARY[kind]:
                    mod = comm.load(resource_path("examples", file))
                    fns += [fn for fn in mod.schedules.values() if fn.ir.contract.kind is kind]
            if not fns:
                raise StrataUsageError(f"no schedule of the library implements {kind.value}")
            # AllToAllV takes run-time counts, not a size to pick by: its first schedule runs
            sel = self._selectors[kind] = fns[0] if kind.moe else Selector(mod, kind, fns, load_table(None))
        return sel

    def staging(self) -> torch.Tensor:
        self.comm   # made with the communicator
        return self._arena

    def check_staging(self, tensors) -> None:
        """Unsupported, before any kernel runs, if one of a list's tensors would not fit the
        staging area (a list call falls back whole: none of it may have run on a kernel)."""
        room = self.heap_bytes // 2
        for t in tensors:
            if not self.owns(t) and tensor_bytes(t) + STAGING_ALIGN > room:
                raise Unsupported(f"a tensor of {tensor_bytes(t)} bytes needs more than the group's {room} bytes "
                                  "of staging (STRATAC_HEAP_BYTES / 2; or allocate it with stratac.distributed.empty)")

    def close(self) -> None:
        if self._comm is not None and self._comm._open:
            self._comm.close(collective=False)
        self._comm = None
        self._selectors.clear()
        self._plans.clear()
        self._arena = None

    # ---- one call's tensors on the heap
    def call(self, op: str) -> "Call":
        """The heap side of a call whose steps depend on what the ranks exchange (AllToAllV): its
        copies run as they are asked for."""
        return Call(self, op, eager=True)

    @staticmethod
    def signature(op: str, scalars: tuple, tensors) -> tuple:
        """What a recorded call depends on: the op, its scalars, each tensor's address and layout."""
        return (op, scalars, *[(t.data_ptr(), t.dtype, t.shape, t.stride()) for t in tensors])

    def run(self, op: str, tensors: tuple, scalars: tuple, build) -> None:
        """A call whose heap side depends only on its tensors' layouts and scalars: build(c)
        carves and records it once (c: a recording staging.Call) and returns the kernel launch; every
        later call of that signature replays the copies and the launch (Plan)."""
        key = self.signature(op, scalars, tensors)
        plan = self._plans.get(key)
        if plan is None or not plan.live():
            c = Call(self, op, eager=False)
            plan = c.plan(build(c))
            if plan.cacheable:
                if len(self._plans) >= 256:
                    self._plans.clear()
                self._plans[key] = plan
        plan.replay()

    # ---- the collectives; each returns the tensors torch's future holds
    def all_reduce(self, tensors: list[torch.Tensor], op) -> list[torch.Tensor]:
        name = op_name(op)
        if len(tensors) == 1:     # the hot path (DDP's buckets, every all_reduce): a recorded call
            plan = self._plans.get(self.signature("all_reduce", (name,), tensors))
            if plan is not None and plan.live():
                plan.replay()
                return tensors
        if name not in ("SUM", "AVG", "MAX", "MIN"):
            raise Unsupported(f"ReduceOp.{name}: no schedule reduces with it")
        for t in tensors:
            if t.dtype not in COMPUTE_DTYPES:
                raise Unsupported("the kernels reduce float32, float16, bfloat16 and int32 only")
            if name == "AVG" and not t.is_floating_point():
                raise Unsupported("ReduceOp.AVG of an integer type")
        self.check_staging(tensors)
        sel = self.selector(ir.ContractKind.ALLREDUCE)
        kernel_op = "sum" if name == "AVG" else name.lower()
        for t in tensors:
            def build(c, t=t):
                x = c.inout(t, t.dtype, t.numel())
                if name != "AVG":
                    return lambda: sel(x, op=kernel_op)
                return lambda: (sel(x, op=kernel_op), x.div_(self.world))
            self.run("all_reduce", (t,), (name,), build)
        return tensors

    def barrier(self) -> None:
        sel = self.selector(ir.ContractKind.ALLREDUCE)

        def build(c):
            x = c.scratch(1, torch.int32)
            return lambda: sel(x, op="sum")
        self.run("barrier", (), (), build)

    def broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        self.check_staging(tensors)
        sel = self.selector(ir.ContractKind.BROADCAST)
        for t in tensors:
            def build(c, t=t):
                x = c.inout(t, *moved(t.dtype, tensor_bytes(t)))
                return lambda: sel(x, root=root)
            self.run("broadcast", (t,), (root,), build)
        return tensors

    def reduce(self, tensors: list[torch.Tensor], root: int, op) -> list[torch.Tensor]:
        name = op_name(op)
        if name not in ("SUM", "MAX", "MIN"):
            raise Unsupported(f"ReduceOp.{name}: no reduce schedule reduces with it")
        if any(t.dtype not in COMPUTE_DTYPES for t in tensors):
            raise Unsupported("the kernels reduce float32, float16, bfloat16 and int32 only")
        self.check_staging(tensors)
        sel = self.selector(ir.ContractKind.REDUCE)
        for t in tensors:
            def build(c, t=t):
                x = c.inout(t, t.dtype, t.numel(), back=self.rank == root)
                return lambda: sel(x, op=name.lower(), root=root)
            self.run("reduce", (t,), (name, root), build)
        return tensors

    def all_gather(self, outputs: list[torch.Tensor], t: torch.Tensor, what: str) -> None:
        """outputs: the world's blocks, in rank order (views of one tensor or a list)."""
        self._check_blocks(outputs, t, what, "output")
        sel = self.selector(ir.ContractKind.ALLGATHER)

        def build(c):
            dt, n = moved(t.dtype, tensor_bytes(t))
            x = c.input(t, dt, n)
            out = c.output_blocks(outputs, dt, n)
            return lambda: sel(x, out)
        self.run("all_gather", (t, *outputs), (), build)

    def reduce_scatter(self, out: torch.Tensor, inputs: list[torch.Tensor], op, what: str) -> None:
        name = op_name(op)
        if name not in ("SUM", "AVG", "MAX", "MIN"):
            raise Unsupported(f"ReduceOp.{name}: no schedule reduces with it")
        if out.dtype not in COMPUTE_DTYPES:
            raise Unsupported("the kernels reduce float32, float16, bfloat16 and int32 only")
        if name == "AVG" and not out.is_floating_point():
            raise Unsupported("ReduceOp.AVG of an integer type")
        self._check_blocks(inputs, out, what, "input")
        sel = self.selector(ir.ContractKind.REDUCESCATTER)
        kernel_op = "sum" if name == "AVG" else name.lower()

        def build(c):
            x = c.input_blocks(inputs, out.dtype, out.numel())
            y = c.output(out, out.dtype, out.numel())
            if name != "AVG":
                return lambda: sel(x, y, op=kernel_op)
            return lambda: (sel(x, y, op=kernel_op), y.div_(self.world))
        self.run("reduce_scatter", (out, *inputs), (name,), build)

    def all_to_all(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], what: str) -> None:
        """inputs[p] goes to rank p; outputs[s] comes from rank s: alltoallv, one element a row. The
        list form always takes alltoallv: its blocks may differ between ranks (legally), and a rank
        must not pick the equal-block schedule while a peer picks the other."""
        if len(inputs) != self.world or len(outputs) != self.world:
            raise StrataUsageError(f"{what}: the input and output lists must have one tensor per rank of the "
                                   f"group ({self.world}), got {len(inputs)} and {len(outputs)}")
        dtypes = {t.dtype for t in (*inputs, *outputs)}
        if len(dtypes) != 1:
            raise StrataUsageError(f"{what}: every tensor must have one dtype, got "
                                   f"{', '.join(sorted(map(str, dtypes)))}")
        self._all_to_all_v([t.reshape(-1, 1) for t in inputs], [t.numel() for t in inputs],
                           [t.numel() for t in outputs], outputs, 1, what)

    def _all_to_all_equal(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
        """Blocks of one size on every rank (all_to_all_single's equal split): the alltoall schedule."""
        sel = self.selector(ir.ContractKind.ALLTOALL)

        def build(c):
            dt, n = moved(inputs[0].dtype, tensor_bytes(inputs[0]))
            x = c.input_blocks(inputs, dt, n)
            out = c.output_blocks(outputs, dt, n)
            return lambda: sel(x, out)
        self.run("all_to_all", (*inputs, *outputs), (), build)

    def all_to_all_single(self, out: torch.Tensor, t: torch.Tensor, out_splits: list[int],
                          in_splits: list[int], what: str) -> None:
        """Without split sizes, or with sizes that are all equal (torch's equal split, given either
        way), the alltoall schedule; with any other sizes, alltoallv. (A rank that gives unequal
        sizes while a peer splits equally makes another call than that peer: both are refused by
        the ranks' agreement check, naming the two calls.)"""
        if out.dtype != t.dtype:
            raise StrataUsageError(f"{what}: output is {out.dtype} and input {t.dtype}: they must match")
        rows = t.shape[0] if t.dim() else 1
        equal = [rows // self.world] * self.world
        if (not in_splits or list(in_splits) == equal) and (not out_splits or list(out_splits) == equal):
            if t.numel() % self.world or out.numel() != t.numel() or rows % self.world:
                raise StrataUsageError(
                    f"{what}: with equal splits the input's {rows} rows must divide into {self.world} blocks and the "
                    f"output must hold as many elements as the input ({t.numel()}), got {out.numel()}")
            if t.numel() == 0:
                return
            if not out.is_contiguous():
                raise StrataUsageError(f"{what}: the output must be contiguous")
            n = t.numel() // self.world
            flat_in, flat_out = t.reshape(-1), out.view(-1)
            self._all_to_all_equal([flat_out[p * n:(p + 1) * n] for p in range(self.world)],
                                   [flat_in[p * n:(p + 1) * n] for p in range(self.world)])
            return
        rows_in, rows_out = (t.shape[0] if t.dim() else 1), (out.shape[0] if out.dim() else 1)
        in_splits = list(in_splits) or [rows_in // self.world] * self.world
        out_splits = list(out_splits) or [rows_out // self.world] * self.world
        for name, splits, rows in (("input_split_sizes", in_splits, rows_in),
                                   ("output_split_sizes", out_splits, rows_out)):
            if len(splits) != self.world or sum(splits) != rows or min(splits) < 0:
                raise StrataUsageError(f"{what}: {name} {splits} must have {self.world} entries (one per rank) "
                                       f"that add up to the tensor's {rows} rows")
        hidden, out_hidden = math.prod(t.shape[1:]), math.prod(out.shape[1:])   # 1 for a 1-D tensor
        if out_hidden != hidden:
            raise StrataUsageError(f"{what}: the output's rows hold {out_hidden} elements and the input's "
                                   f"{hidden}: they must match")
        self._all_to_all_v([t.reshape(rows_in, hidden)], in_splits, out_splits, [out], hidden, what)

    def _all_to_all_v(self, inputs: list[torch.Tensor], in_splits: list[int], out_splits: list[int],
                      outputs: list[torch.Tensor], hidden: int, what: str) -> None:
        """The rows of `inputs` ([k, hidden] each, concatenated) go to rank p per in_splits; the rows
        that arrive, from rank 0 first, fill `outputs` in order: out_splits[s] of them from rank s.
        The ranks' row counts are exchanged first (an allgather of one int32): a call's sizes are
        the same on every rank, so the rows are padded to the largest count's power of two."""
        dtype = inputs[0].dtype
        row_bytes = hidden * esize(dtype)
        if row_bytes == 0:
            return
        rows = sum(in_splits)
        dt, cols = moved(dtype, row_bytes)
        if dt is torch.int32:   # alltoallv's rows are tokens (a float type); place copies them as bytes
            dt = torch.float32
        with self.call("all_to_all") as c:   # eager: the rows depend on what the ranks exchange
            mine = c.scratch(1, torch.int32)
            everyone = c.scratch(self.world, torch.int32)
            mine.fill_(rows)
            self.selector(ir.ContractKind.ALLGATHER)(mine, everyone)
            # rows padded to a power of two: fewer distinct instances to prove, at most twice the rows
            cap = 1 << max(0, int(everyone.max()) - 1).bit_length()
            x = c.scratch(cap * cols, dt)
            xrows, at = x.view(torch.uint8).view(cap, -1)[:, :row_bytes], 0
            for t in inputs:
                k = t.shape[0]
                xrows[at:at + k].view(dtype).view(t.shape).copy_(t)
                at += k
            c.count(at * row_bytes)
            dest = c.scratch(cap, torch.int32)
            dest.fill_(-1)
            at = 0
            for p, k in enumerate(in_splits):
                dest[at:at + k] = p
                at += k
            counts = c.scratch(self.world * self.world, torch.int32).view(self.world, self.world)
            out = c.scratch(self.world * cap * cols, dt)
            self.selector(ir.ContractKind.ALLTOALLV)(x.view(cap, cols), dest, counts,
                                                     out.view(self.world * cap, cols))
            got = counts[:, self.rank].tolist()
            if got != list(out_splits):
                raise StrataUsageError(f"{what}: rank {self.rank} expected {list(out_splits)} rows from the ranks "
                                       f"(its output split sizes) but they sent {got} (their input split sizes)")
            orows, at = out.view(torch.uint8).view(self.world * cap, -1)[:, :row_bytes], 0
            for o in outputs:
                k = o.numel() // hidden
                o.copy_(orows[at:at + k].view(dtype).view(o.shape))
                at += k
            c.count(at * row_bytes)

    def _check_blocks(self, blocks: list[torch.Tensor], t: torch.Tensor, what: str, which: str) -> None:
        if len(blocks) != self.world:
            raise StrataUsageError(f"{what}: the {which} list has {len(blocks)} tensors; the group has "
                                   f"{self.world} ranks")
        for r, b in enumerate(blocks):
            if b.dtype != t.dtype or b.numel() != t.numel():
                raise StrataUsageError(f"{what}: {which} block {r} is {b.dtype} of {b.numel()} elements; "
                                       f"every block must be {t.dtype} of {t.numel()} elements like the "
                                       f"{'input' if which == 'output' else 'output'}")
