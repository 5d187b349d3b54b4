"""The torch.distributed backend "stratac": a ProcessGroup whose collectives run proven kernels.

In: what torch.distributed hands a backend (its Python ProcessGroup methods: allreduce([t], opts),
allgather([[outs]], [t], opts), ...). Out: a Work, completed, whose future holds the output
tensors. The mapping onto schedules is stratac.distributed.collectives; what no schedule takes
(another ReduceOp or dtype, send/recv, gather/scatter, ...) runs on a gloo process group made
beside it from the same store, counted per op and dtype (stats), or refused by name with
STRATAC_FALLBACK=error.

A pure-Python backend subclasses dist.ProcessGroup (torch's C++ Backend class has no Python
constructor); torch uses the object the creator returns as the group itself.

Calls are synchronous on the CPU target: a kernel launch returns when the call is done on this
rank, so every Work is completed when it is returned (docs/api.md, "torch.distributed backend").
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from stratac.distributed.collectives import Group
from stratac.distributed.staging import STATS, Unsupported
from stratac.host.errors import StrataUsageError

NAME = "stratac"


class Work(dist.Work):
    """A completed call: wait() returns True at once; get_future() holds the output tensors."""

    def __init__(self, result: list[torch.Tensor], what: str, tracked: "set | None" = None):
        super().__init__()
        self._result = result
        self._what = what
        self._future = torch.futures.Future()
        self._future.set_result(result)
        self._tracked = tracked       # async works: forgotten once waited on (ProcessGroup.shutdown)
        if tracked is not None:
            tracked.add(self)

    def _waited(self) -> None:
        if self._tracked is not None:
            self._tracked.discard(self)
            self._tracked = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._waited()
        return True

    def get_future(self) -> torch.futures.Future:
        self._waited()
        return self._future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self):
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        pass


def _fallback_mode() -> str:
    mode = os.environ.get("STRATAC_FALLBACK", "gloo")
    if mode not in ("gloo", "error"):
        raise StrataUsageError(f"STRATAC_FALLBACK must be gloo or error, got {mode!r}")
    return mode


def _dtype_of(args) -> str:
    """The dtype a fallback is counted under: the first tensor's among the arguments."""
    stack = list(args)
    while stack:
        a = stack.pop(0)
        if isinstance(a, torch.Tensor):
            return str(a.dtype).replace("torch.", "")
        if isinstance(a, (list, tuple)):
            stack[:0] = list(a)
    return "-"


class ProcessGroup(dist.ProcessGroup):
    """One torch.distributed group of backend stratac (made by torch through `create`)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_id: str = "",
                 options: "Options | None" = None):
        super().__init__(rank, size)
        options = options or Options()
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        self._group = Group(dist.PrefixStore("stratac/", store), rank, size, seconds, group_id,
                            target=options.target, heap_bytes=options.heap_bytes)
        self._gloo = self._make_gloo(store, rank, size, timeout)
        self._async: set = set()
        self._done = Work([], "a synchronous call")   # what every synchronous call returns
        self._group_name = str(group_id)
        self._group_desc = "undefined"

    @staticmethod
    def _make_gloo(store, rank, size, timeout) -> dist.ProcessGroup:
        """The fallback: a gloo process group over the same members, with keys of its own."""
        pg = dist.ProcessGroup(rank, size)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("stratac-gloo/", store), rank, size, timeout)
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        return pg

    # ---- what torch asks of a group
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def shutdown(self) -> None:
        """destroy_process_group: releases the group's heap. Async works never waited on are named
        (on this target their results are complete; on the NPU they would not be)."""
        if self._async:
            names = sorted(w._what for w in self._async)
            self._async.clear()
            warnings.warn(f"stratac: rank {self.rank()}: the process group was destroyed with {len(names)} "
                          f"async_op work(s) never waited on: {', '.join(names)}. Their results are complete "
                          "on the CPU target; on an NPU they would still be in flight: call work.wait()",
                          RuntimeWarning, stacklevel=2)
        self._group.close()
        self._gloo.shutdown()

    # ---- the calls
    def _run(self, op: str, opts, args: tuple, run, result) -> Work:
        """Runs `run()` (a stratac kernel) or, when no schedule takes the call, torch's own method
        `op` of the gloo group with the same arguments."""
        try:
            run()
        except Unsupported as why:
            return self._fall_back(op, args, str(why))
        return self._work(op, opts, result)

    def _work(self, op: str, opts, result) -> Work:
        """The call's Work. torch waits on a synchronous call's Work and drops it (opts.asyncOp is
        False only there), so those share one; an async call's (DDP's too) has its own future."""
        if not opts.asyncOp:
            return self._done
        return Work(result(), f"{op} #{sum(STATS.kernels.values())}", self._async)

    def _fall_back(self, op: str, args: tuple, why: str):
        dtype = _dtype_of(args)
        if _fallback_mode() == "error":
            raise StrataUsageError(f"stratac backend: {op} of {dtype} has no stratac schedule ({why}) and "
                                   "STRATAC_FALLBACK=error forbids the gloo fallback") from None
        STATS.fallback[(op, dtype, why)] += 1
        return getattr(self._gloo, op)(*args)

    def allreduce(self, tensors, opts=None):
        # the hot path of DDP and of every all_reduce: no closures, one try
        opts = opts or c10d.AllreduceOptions()
        try:
            self._group.all_reduce(tensors, opts.reduceOp)
        except Unsupported as why:
            return self._fall_back("allreduce", (tensors, opts), str(why))
        return self._done if not opts.asyncOp else self._work("allreduce", opts, lambda: tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or c10d.AllreduceCoalescedOptions()
        return self._run("allreduce_coalesced", opts, (tensors, opts),
                         lambda: self._group.all_reduce(tensors, opts.reduceOp), lambda: tensors)

    def broadcast(self, tensors, opts=None):
        opts = opts or c10d.BroadcastOptions()
        return self._run("broadcast", opts, (tensors, opts),
                         lambda: self._group.broadcast(tensors, opts.rootRank), lambda: tensors)

    def reduce(self, tensors, opts=None):
        opts = opts or c10d.ReduceOptions()
        return self._run("reduce", opts, (tensors, opts),
                         lambda: self._group.reduce(tensors, opts.rootRank, opts.reduceOp), lambda: tensors)

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts or c10d.AllgatherOptions()

        def run():
            if len(output_lists) != len(inputs):
                raise StrataUsageError(f"all_gather: {len(output_lists)} output lists for {len(inputs)} inputs")
            for outs, t in zip(output_lists, inputs):
                self._group.all_gather(list(outs), t, "all_gather")
        return self._run("allgather", opts, (output_lists, inputs, opts), run,
                         lambda: [t for outs in output_lists for t in outs])

    def _gather_into(self, out: torch.Tensor, t: torch.Tensor) -> None:
        """all_gather_into_tensor: rank r's t into block r of out."""
        self._check_holds(out, t, "all_gather_into_tensor", "output", "input")
        n, flat = t.numel(), out.view(-1)
        self._group.all_gather([flat[r * n:(r + 1) * n] for r in range(self.size())], t, "all_gather_into_tensor")

    def _scatter_from(self, out: torch.Tensor, t: torch.Tensor, op) -> None:
        """reduce_scatter_tensor: block r of the reduction of every rank's t into rank r's out."""
        self._check_holds(t, out, "reduce_scatter_tensor", "input", "output")
        n, flat = out.numel(), t.reshape(-1)
        self._group.reduce_scatter(out, [flat[r * n:(r + 1) * n] for r in range(self.size())], op,
                                   "reduce_scatter_tensor")

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's name)
        opts = opts or c10d.AllgatherOptions()
        return self._run("all_gather_single", opts, (output, input, opts),
                         lambda: self._gather_into(output, input), lambda: [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or c10d.AllgatherOptions()
        return self._run("allgather_into_tensor_coalesced", opts, (outputs, inputs, opts),
                         lambda: [self._gather_into(o, t) for o, t in zip(outputs, inputs, strict=True)],
                         lambda: list(outputs))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        return self._run("reduce_scatter", opts, (outputs, input_lists, opts),
                         lambda: [self._group.reduce_scatter(out, list(ins), opts.reduceOp, "reduce_scatter")
                                  for out, ins in zip(outputs, input_lists, strict=True)],
                         lambda: list(outputs))

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        opts = opts or c10d.ReduceScatterOptions()
        return self._run("reduce_scatter_single", opts, (output, input, opts),
                         lambda: self._scatter_from(output, input, opts.reduceOp), lambda: [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        return self._run("reduce_scatter_tensor_coalesced", opts, (outputs, inputs, opts),
                         lambda: [self._scatter_from(o, t, opts.reduceOp) for o, t in zip(outputs, inputs, strict=True)],
                         lambda: list(outputs))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        opts = opts or c10d.AllToAllOptions()
        return self._run("all_to_all_single", opts, (output, input, output_split_sizes, input_split_sizes, opts),
                         lambda: self._group.all_to_all_single(output, input, list(output_split_sizes),
                                                               list(input_split_sizes), "all_to_all_single"),
                         lambda: [output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        opts = opts or c10d.AllToAllOptions()
        return self._run("alltoall", opts, (outputs, inputs, opts),
                         lambda: self._group.all_to_all(list(outputs), list(inputs), "all_to_all"),
                         lambda: list(outputs))

    def barrier(self, opts=None):
        opts = opts or c10d.BarrierOptions()
        return self._run("barrier", opts, (opts,), self._group.barrier, lambda: [])

    def _check_holds(self, big: torch.Tensor, small: torch.Tensor, what: str, bname: str, sname: str) -> None:
        if big.dtype != small.dtype:
            raise StrataUsageError(f"{what}: the {bname} is {big.dtype} and the {sname} {small.dtype}: they must "
                                   "match")
        if big.numel() != self.size() * small.numel():
            raise StrataUsageError(f"{what}: the {bname} has {big.numel()} elements; it must hold world x "
                                   f"{sname} = {self.size()} x {small.numel()} = {self.size() * small.numel()}")
        if not big.is_contiguous():
            raise StrataUsageError(f"{what}: the {bname} must be contiguous")


# what stratac has no schedule for: gloo's, counted (or refused with STRATAC_FALLBACK=error)
GLOO_ONLY = ("send", "recv", "recv_anysource", "gather", "scatter", "allgather_coalesced", "monitored_barrier")


def _gloo_only(op: str):
    def method(self, *args):
        return self._fall_back(op, args, "not a collective stratac has")
    method.__name__ = method.__qualname__ = op
    return method


for _op in GLOO_ONLY:
    setattr(ProcessGroup, _op, _gloo_only(_op))


@dataclass(frozen=True)
class Options:
    """The backend's options, given as init_process_group(..., pg_options=Options(...)) or
    new_group(..., pg_options=...). target: "cpu" (the CPU model) or "npu" (SHMEM for Ascend on
    the NPU, through NpuCommunicator: refused at once, naming what is missing, where CANN, SHMEM,
    torch_npu or an NPU is not there). heap_bytes: the group's symmetric heap per rank (default
    STRATAC_HEAP_BYTES, else 256 MiB); half of it is the staging area."""
    target: str = "cpu"
    heap_bytes: int | None = None

    def __post_init__(self):
        if self.target not in ("cpu", "npu"):
            raise StrataUsageError(f"stratac backend: target must be 'cpu' or 'npu', got {self.target!r}")
        if self.heap_bytes is not None and (not isinstance(self.heap_bytes, int) or self.heap_bytes < 1 << 20):
            raise StrataUsageError(f"stratac backend: heap_bytes must be an int of at least 1 MiB, got "
                                   f"{self.heap_bytes!r}")


def create(dist_opts, backend_options=None) -> ProcessGroup:
    """torch's creator hook (register_backend(..., extended_api=True)): called on every member of
    a new group, with the group's own store, rank, size and timeout, and pg_options."""
    if backend_options is not None and not isinstance(backend_options, Options):
        raise StrataUsageError(f"stratac backend: pg_options must be stratac.distributed.Options, got "
                               f"{type(backend_options).__name__}")
    options = backend_options or Options()
    if options.target == "npu":
        from stratac.targets.npu import require_npu
        require_npu()      # every rank alike, before any collective: what is missing, by name
    return ProcessGroup(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
                        str(dist_opts.group_id), options)


def register() -> None:
    """Registers the backend with torch.distributed (once per process): for CPU tensors, and for
    NPU tensors where torch_npu is installed (its device type exists only then)."""
    if NAME.upper() in dist.Backend._plugins or NAME in getattr(dist.Backend, "backend_list", ()):
        return
    from stratac.targets.npu import torch_npu_installed
    devices = ["cpu", "npu"] if torch_npu_installed() else ["cpu"]
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=devices)

