"""The Python API: a communicator that owns the symmetric heap, allocates torch tensors on it
(registration on allocation) and runs compiled schedules on them.

CPU target: the heap is the CPU model's shared-memory pool (runtime/cpu); ranks are processes
bootstrapped through torch.distributed.

    import torch.distributed as dist, stratac
    dist.init_process_group("gloo")
    comm = stratac.Communicator.from_process_group(heap_bytes=256 << 20)
    mod = comm.load("examples/allreduce_twoshot.strata")
    x = comm.empty(1 << 20, dtype=torch.float32)   # on the symmetric heap
    x.copy_(data); mod.allreduce_twoshot(x)        # x now holds the sum over ranks
    comm.close()
"""

from __future__ import annotations

import atexit
import inspect
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import cffi
import torch

from stratac import codegen, ir, verify
from stratac.codegen import abi
from stratac.diagnostics import Source, StrataError
from stratac.ir import passes
from stratac.lang import frontend
from stratac.targets import cpu as build

DEFAULT_HEAP_BYTES = 256 << 20
SYNC_SLOTS = 4096                      # int32 flag slots after the world barrier slots
DEFAULT_TIMEOUT = 60.0

_TORCH_DTYPES = {d: getattr(torch, d.torch_name) for d in ir.DType}
ROUTE_MAX_EXPERTS = 8192   # strata::kMaxExperts (runtime/device/strata_device.h)
ROUTE_MAX_TOPK = 64        # strata::Router::kMaxTopk


def _segment_name() -> str:
    """Unguessable, and private to the user (the model creates it with mode 0600)."""
    return f"/stratac-{os.getuid()}-{secrets.token_hex(12)}"


def unlink_segment(name: str) -> None:
    """Removes a segment's name (Linux keeps POSIX shared memory in /dev/shm); mappings stay valid."""
    try:
        os.unlink(os.path.join("/dev/shm", name.lstrip("/")))
    except FileNotFoundError:
        pass


def store_barrier(store, world: int, timeout: float, prefix: str, rank: int | None = None, check=None):
    """A barrier over a torch.distributed Store: one counter key per round (and, given this rank, a
    key per rank, so that a timeout names the ranks that never came). `check(where)`, called every
    ~50 ms while waiting, may raise to end the wait early (a failed or dead peer)."""
    rounds = [0]

    def barrier() -> None:
        rounds[0] += 1
        key = f"{prefix}/barrier/{rounds[0]}"
        if rank is not None:
            store.set(f"{key}/{rank}", b"1")
        store.add(key, 1)
        deadline = time.monotonic() + timeout
        polls = 0
        while int(store.add(key, 0)) < world:
            if time.monotonic() > deadline:
                who = f"rank {rank}: " if rank is not None else ""
                late = ""
                if rank is not None:
                    missing = [str(r) for r in range(world) if not store.check([f"{key}/{r}"])]
                    late = f"; not arrived: {', '.join(missing) or '(none)'}"
                raise StrataRuntimeError(f"{who}store barrier {rounds[0]} timed out after {timeout} s: "
                                         f"{int(store.add(key, 0))} of {world} ranks arrived{late}")
            polls += 1
            if check is not None and polls % 50 == 0:
                check(f"store barrier {rounds[0]}")
            time.sleep(0.001)

    return barrier


class StrataRuntimeError(RuntimeError):
    """A launch failed: a rule of the machine was broken, a wait timed out, a peer died."""


class StrataUsageError(ValueError):
    """A call was made with arguments the schedule cannot take (named in the message)."""


_runtime_ffi: cffi.FFI | None = None
_runtime_lib = None


def _runtime():
    global _runtime_ffi, _runtime_lib
    if _runtime_lib is None:
        ffi = cffi.FFI()
        ffi.cdef(abi.RUNTIME_CDEF)
        path = build.runtime_library()
        _runtime_lib = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
        _runtime_ffi = ffi
    return _runtime_ffi, _runtime_lib


def _last_error(lib, ffi) -> str:
    p = lib.strata_cpu_last_error()
    return ffi.string(p).decode(errors="replace") if p != ffi.NULL else "unknown error"


def _check_pool(lib, rank: int, where: str) -> None:
    """Raises if the pool was aborted by a failing rank or a peer's process died (no-op before the
    heap is mapped)."""
    ffi = _runtime_ffi
    if lib.strata_cpu_aborted():
        msg = ffi.string(lib.strata_cpu_abort_message()).decode(errors="replace")
        raise StrataRuntimeError(f"rank {rank}: {where}: the job is aborted: {msg}")
    if lib.strata_cpu_dead_rank() >= 0:
        raise StrataRuntimeError(f"rank {rank}: {where}: {_last_error(lib, ffi)}")


class Communicator:
    """One rank's view of the symmetric heap. Create it on every rank, in the same order."""

    def __init__(self, rank: int, world: int, *, segment: str, create: bool,
                 heap_bytes: int = DEFAULT_HEAP_BYTES, timeout: float = DEFAULT_TIMEOUT,
                 barrier=None):
        if not 0 <= rank < world:
            raise StrataUsageError(f"rank {rank} is outside world size {world}")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise StrataUsageError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.rank, self.world = rank, world
        self.segment = segment
        heap_bytes = (int(heap_bytes) + 4095) // 4096 * 4096   # the model maps whole pages
        self.heap_bytes = heap_bytes
        self._barrier = barrier or (lambda: None)
        self._ffi, self._lib = _runtime()
        rc = self._lib.strata_cpu_init(rank, world, segment.encode(), heap_bytes, int(create))
        if rc != 0:
            raise StrataRuntimeError(f"cannot map the symmetric heap: {_last_error(self._lib, self._ffi)}")
        self._open = True
        # a process that exits without close() has left the pool: its peers must not take it for dead
        atexit.register(self._leave)
        self._lib.strata_cpu_set_timeout(float(timeout))
        self.timeout = timeout
        base = self._lib.strata_cpu_heap_base()
        self._base = int(self._ffi.cast("uintptr_t", base))
        self._buffer = self._ffi.buffer(base, heap_bytes)
        self._heap = torch.frombuffer(self._buffer, dtype=torch.uint8)
        self._sync = self._alloc((world + SYNC_SLOTS) * 4, zero=True)
        self._epoch = 0
        self._modules: list[Module] = []

    # ---- construction from a torch.distributed job
    @classmethod
    def from_process_group(cls, heap_bytes: int = DEFAULT_HEAP_BYTES, timeout: float = DEFAULT_TIMEOUT,
                           segment: str | None = None) -> "Communicator":
        import torch.distributed as dist
        if not dist.is_initialized():
            raise StrataUsageError("torch.distributed is not initialised: call "
                                   "dist.init_process_group('gloo') first (or use torchrun)")
        rank, world = dist.get_rank(), dist.get_world_size()
        name = [segment or _segment_name()]
        dist.broadcast_object_list(name, src=0)
        return cls._bootstrap(rank, world, name[0], heap_bytes, timeout, dist.barrier)

    @classmethod
    def from_store(cls, rank: int, world: int, store, heap_bytes: int = DEFAULT_HEAP_BYTES,
                   timeout: float = DEFAULT_TIMEOUT, prefix: str = "stratac") -> "Communicator":
        """Bootstrap from a torch.distributed Store (TCPStore, FileStore, ...) without a process
        group: rank 0 names the segment in the store, the others read it."""
        if rank == 0:
            store.set(f"{prefix}/segment", _segment_name())
        name = store.get(f"{prefix}/segment").decode()
        _, lib = _runtime()

        def check(where: str) -> None:   # once the heap is mapped: a failed or dead peer ends the wait
            _check_pool(lib, rank, where)

        return cls._bootstrap(rank, world, name, heap_bytes, timeout,
                              store_barrier(store, world, timeout, prefix, rank=rank, check=check))

    @classmethod
    def _bootstrap(cls, rank, world, name, heap_bytes, timeout, barrier) -> "Communicator":
        # rank 0 creates the segment; the others map it once it exists; once every rank has mapped
        # it, its name is removed, so no segment can outlive the job however it ends
        if rank == 0:
            comm = cls(rank, world, segment=name, create=True, heap_bytes=heap_bytes,
                       timeout=timeout, barrier=barrier)
            barrier()
        else:
            barrier()
            comm = cls(rank, world, segment=name, create=False, heap_bytes=heap_bytes,
                       timeout=timeout, barrier=barrier)
        barrier()
        if rank == 0:
            unlink_segment(name)
        return comm

    # ---- heap
    def _alloc(self, nbytes: int, zero: bool = False) -> int:
        self._check_open()
        ptr = self._lib.aclshmem_calloc(1, nbytes) if zero else self._lib.aclshmem_malloc(nbytes)
        if ptr == self._ffi.NULL:
            raise StrataRuntimeError(f"symmetric heap exhausted: {_last_error(self._lib, self._ffi)} "
                                     f"(heap of {self.heap_bytes} bytes per rank; create the "
                                     "communicator with a larger heap_bytes)")
        return int(self._ffi.cast("uintptr_t", ptr)) - self._base

    def empty(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor on the symmetric heap. Every rank must allocate the same shapes in the same
        order (the heap is symmetric: equal calls give equal offsets on every rank)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        numel = 1
        for d in shape:
            numel *= int(d)
        elem = torch.empty(0, dtype=dtype).element_size()
        off = self._alloc(max(numel * elem, 1))
        return self._heap[off:off + numel * elem].view(dtype).view(*shape)

    def zeros(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        t = self.empty(*shape, dtype=dtype)
        t.zero_()
        return t

    def free(self, t: torch.Tensor) -> None:
        """Returns a heap tensor's memory. Collective, like allocation: same order on every rank."""
        self._check_open()
        self.offset_of(t, "tensor")
        self._lib.aclshmem_free(self._ffi.cast("void*", t.data_ptr()))

    def offset_of(self, t: torch.Tensor, what: str) -> int:
        if not isinstance(t, torch.Tensor):
            raise StrataUsageError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise StrataUsageError(f"{what} is on {t.device}; the CPU target runs on CPU tensors "
                                   "allocated with comm.empty(...)")
        off = t.data_ptr() - self._base
        if not 0 <= off < self.heap_bytes or off + t.numel() * t.element_size() > self.heap_bytes:
            raise StrataUsageError(f"{what} is not on the symmetric heap: allocate it with "
                                   "comm.empty(shape, dtype=...) (stratac never copies user tensors)")
        if not t.is_contiguous():
            raise StrataUsageError(f"{what} must be contiguous")
        return off

    @property
    def heap_used(self) -> int:
        return int(self._lib.strata_cpu_heap_used())

    # ---- compiled schedules
    def load(self, path_or_source: str | Path, *, options: passes.Options | None = None,
             name: str = "<source>") -> "Module":
        """Compiles (through the cache) every schedule of a .strata file or source text."""
        self._check_open()
        if isinstance(path_or_source, Path) or (isinstance(path_or_source, str)
                                                and path_or_source.endswith(".strata")
                                                and "\n" not in path_or_source):
            source = frontend.load_source(path_or_source)
        else:
            source = Source(name, str(path_or_source))
        mod = Module(self, compile_source(source, options or passes.Options(), worlds=[self.world]))
        self._modules.append(mod)
        return mod

    def next_epoch(self, stamps: int) -> int:
        epoch = self._epoch
        self._epoch += stamps + 1
        if self._epoch >= 2**31 - 1:
            raise StrataRuntimeError("flag stamps exhausted (2^31 per communicator): create a new one")
        return epoch

    # ---- counters of the CPU model
    def reset_counters(self) -> None:
        self._lib.strata_cpu_reset_counters()

    def counters(self) -> list[dict[str, int]]:
        buf = self._ffi.new("uint64_t[]", abi.MAX_CORES * len(abi.COUNTERS))
        cores = self._lib.strata_cpu_read_counters(buf, abi.MAX_CORES)
        return [{k: int(buf[c * len(abi.COUNTERS) + i]) for i, k in enumerate(abi.COUNTERS)}
                for c in range(cores)]

    def barrier(self) -> None:
        self._barrier()

    def synchronize(self) -> None:
        """Waits until every launched schedule has finished. CPU launches are synchronous, so
        there is nothing to wait for; the NPU twin waits for its stream."""

    def dead_rank(self) -> tuple[int, str] | None:
        """(rank, what happened) for the lowest rank whose process died without leaving the heap
        (killed, crashed), or None. Waits check this themselves; this is for host-side code."""
        self._check_open()
        r = self._lib.strata_cpu_dead_rank()
        return (r, _last_error(self._lib, self._ffi)) if r >= 0 else None

    def _leave(self) -> None:
        if getattr(self, "_open", False):
            self._lib.strata_cpu_leave()

    def _check_open(self) -> None:
        if not getattr(self, "_open", False):
            raise StrataUsageError("the communicator is closed")

    def close(self, unlink: bool = False, collective: bool = True) -> None:
        """Releases the heap and the loaded libraries. Collective: call on every rank (after a
        failure, collective=False skips the barrier; whoever started the job unlinks the segment)."""
        if not getattr(self, "_open", False):
            return
        if collective:
            self._barrier()
        atexit.unregister(self._leave)
        del self._heap
        self._buffer = None
        self._open = False
        for mod in self._modules:
            mod.unload()
        self._modules.clear()
        if unlink:
            unlink_segment(self.segment)
        self._lib.strata_cpu_finalize(0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Compiled:
    schedule: ir.Schedule
    output: codegen.Output
    worlds: tuple[int, ...] = ()       # the world sizes it was verified for


def compile_source(source: Source, options: passes.Options, worlds: list[int]) -> list[Compiled]:
    """Front end, verification at the given world sizes, passes and code generation."""
    out = []
    for s in frontend.schedules(source):
        for res in verify.verify_worlds(s, worlds):
            if not res.ok:
                raise StrataError(res.diagnostics)
        lowered = passes.pipeline(s, options)
        out.append(Compiled(lowered, codegen.generate(lowered), tuple(worlds)))
    return out


def _written_params(s: ir.Schedule) -> set[str]:
    """The parameters a schedule writes (destinations of its moves, and its contract's outputs)."""
    names = {p.name for p in s.params}
    out = {n for n in getattr(s.contract, "outputs", ()) if n in names}

    def walk(ops) -> None:
        for op in ops:
            dst = getattr(op, "dst", None)
            if getattr(dst, "buffer", None) in names:
                out.add(dst.buffer)
            for attr in ("body", "then", "orelse"):
                sub = getattr(op, attr, None)
                if isinstance(sub, (tuple, list)):
                    walk(sub)

    walk(s.body)
    return out


def _check_manifest(s: ir.Schedule, built: build.Built, world: int, worlds: tuple[int, ...]) -> None:
    """The library about to be loaded is the one this schedule was compiled to, for this world."""
    m = built.manifest
    if m.get("schedule") != s.name or m.get("launcher") != abi.launcher_name(s):
        raise StrataUsageError(f"{s.name}: the built library's manifest ({built.directory / 'manifest.json'}) "
                               f"describes {m.get('schedule')!r} with launcher {m.get('launcher')!r}, not this "
                               "schedule: refusing to load it")
    mworlds = m.get("worlds")
    if worlds and world not in worlds or mworlds and world not in mworlds:
        raise StrataUsageError(f"{s.name} was verified for world size(s) "
                               f"{', '.join(map(str, worlds or mworlds))}, but the communicator has world "
                               f"{world}: load it through this communicator (comm.load) so that it is "
                               "verified for its world")


class Module:
    """The schedules of one .strata source, each a callable attribute."""

    def __init__(self, comm: Communicator, compiled: list[Compiled]):
        self.schedules: dict[str, Schedule] = {}
        for c in compiled:
            fn = Schedule(comm, c.schedule, build.build_cpu(c.output), worlds=c.worlds)
            self.schedules[c.schedule.name] = fn
            setattr(self, c.schedule.name, fn)

    def __getitem__(self, name: str) -> "Schedule":
        return self.schedules[name]

    def unload(self) -> None:
        for fn in self.schedules.values():
            fn.unload()


class Schedule:
    """A compiled schedule bound to a communicator: call it with heap tensors (and, if the schedule
    has them, `op=` a reduction and rank parameters such as `root=` as keywords)."""

    def __init__(self, comm: Communicator, s: ir.Schedule, built: build.Built,
                 worlds: tuple[int, ...] = ()):
        self.comm, self.ir, self.built = comm, s, built
        self.name = s.name
        _check_manifest(s, built, comm.world, worlds)
        self._written = _written_params(s)
        self._sync_described: tuple | None = None
        self._ffi = cffi.FFI()
        self._ffi.cdef(abi.cdef(s))
        self._lib = self._ffi.dlopen(str(built.library))
        self._launch = getattr(self._lib, abi.launcher_name(s))
        self._scratch: dict[str, torch.Tensor] = {}
        self.cores = s.kernel.cores
        params = [p.name for p in s.tensors] + [x.name for x in s.scalars]
        self.__doc__ = f"{s.name}({', '.join(params)}): implements {s.contract}"
        kw = inspect.Parameter.KEYWORD_ONLY
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               annotation=f"{'sym ' if p.symmetric else ''}{p.type_text}[{p.shape_text}]")
             for p in s.tensors]
            + [inspect.Parameter(x.name, kw, annotation=x.kind.value) for x in s.scalars]
            + [inspect.Parameter("cores", kw, default=None)])

    def unload(self) -> None:
        if self._lib is not None:
            self._ffi.dlclose(self._lib)
            self._lib = self._launch = None

    def bind(self, *tensors: torch.Tensor, **named) -> tuple[ir.DType, dict[str, int], list, dict]:
        """Checks the arguments against the schedule's parameters before anything is launched;
        returns dtype, sizes, tensor pointers and scalar values (the op as its index in abi.OPS)."""
        params = self.ir.tensors
        names = [p.name for p in params]
        if len(tensors) > len(params):
            raise StrataUsageError(f"{self.name} takes {len(params)} tensors "
                                   f"({', '.join(names)}), got {len(tensors)}")
        given = dict(zip(names, tensors))
        scalars = {x.name: x for x in self.ir.scalars}
        values: dict[str, object] = {}
        for k, v in named.items():
            if k in scalars:
                values[k] = v
            elif k in names:
                given[k] = v
            else:
                raise StrataUsageError(f"{self.name} has no parameter {k!r}")
        missing = [n for n in names if n not in given] + [n for n in scalars if n not in values]
        if missing:
            raise StrataUsageError(f"{self.name}: missing argument(s) {', '.join(missing)}")
        scalar_args = {}
        for name, x in scalars.items():
            v = values[name]
            if x.kind is ir.ScalarKind.REDOP:
                ops = {o.value: i for i, o in enumerate(abi.OPS)}
                if v not in ops:
                    raise StrataUsageError(f"{self.name}: {name} must be one of {', '.join(ops)}, got {v!r}")
                scalar_args[name] = ops[v]
            else:
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.comm.world:
                    raise StrataUsageError(f"{self.name}: {name} must be a rank in [0, {self.comm.world}), "
                                           f"got {v!r}")
                scalar_args[name] = v
        dtype: ir.DType | None = None
        for p in params:
            t = given[p.name]
            self.comm.offset_of(t, f"{self.name}: parameter {p.name}")
            want = p.dtype
            got = next((d for d, td in _TORCH_DTYPES.items() if td == t.dtype), None)
            if got is None:
                raise StrataUsageError(f"{self.name}: parameter {p.name} has dtype {t.dtype}; "
                                       f"supported: {', '.join(str(v) for v in _TORCH_DTYPES.values())}")
            if want is not None and got is not want:
                raise StrataUsageError(f"{self.name}: parameter {p.name} must be {want.torch_name}, "
                                       f"got {t.dtype}")
            if p.typevar:
                if dtype is not None and got is not dtype:
                    raise StrataUsageError(f"{self.name}: parameter {p.name} is {t.dtype} but an "
                                           f"earlier {p.typevar} parameter is {_TORCH_DTYPES[dtype]}")
                dtype = got
        dtype = dtype or next(p.dtype for p in params)
        if self.ir.contract.kind.moe and dtype not in abi.dtypes(self.ir):
            raise StrataUsageError(f"{self.name}: the tokens must be float32, float16 or bfloat16, got "
                                   f"{_TORCH_DTYPES[dtype]}")
        sizes: dict[str, int] = {}
        env = {"world": self.comm.world}
        rules, _ = ir.size_rules(params, self.ir.sizes)
        for rule in rules:
            p, t = self.ir.param(rule.param), given[rule.param]
            if len(p.dims) > 1 and t.dim() != len(p.dims):
                raise StrataUsageError(f"{self.name}: parameter {p.name} must have shape [{p.shape_text}] "
                                       f"({len(p.dims)} dimensions), got {list(t.shape)}")
            extent = t.numel() if len(p.dims) == 1 else t.shape[rule.dim]
            scale = rule.scale.eval(env)
            sizes[rule.sym] = env[rule.sym] = extent // scale if scale else 0
        for p in params:
            t = given[p.name]
            if len(p.dims) > 1:
                want_shape = [d.eval(env) for d in p.dims]
                if list(t.shape) != want_shape:
                    raise StrataUsageError(f"{self.name}: parameter {p.name} must have shape [{p.shape_text}] "
                                           f"= {want_shape}, got {list(t.shape)}")
            want = p.size.eval(env)
            if t.numel() != want:
                raise StrataUsageError(f"{self.name}: parameter {p.name} must have {p.size} = {want} "
                                       f"elements, got {t.numel()}")
        if self.ir.contract.kind.moe:
            self._check_routing(given, env)
        self._check_aliasing(given)
        ptrs = [self._ffi.cast("void*", given[p.name].data_ptr()) for p in params]
        ptrs += [self._ffi.cast("void*", t.data_ptr()) for t in self._scratch_for(dtype, env)]
        return dtype, sizes, ptrs, scalar_args

    def _check_routing(self, given: dict, env: dict) -> None:
        """Expert ids are checked before anything is written: a bad id would send a token into
        another expert's rows (or outside the window)."""
        c, world = self.ir.contract, self.comm.world
        ids_name = c.inputs[1]
        counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
        experts = self.ir.param(counts).dims[1].eval(env)
        ids = given[ids_name]
        topk = ids.shape[1] if ids.dim() == 2 else 1
        if experts % world or experts < 1:
            raise StrataUsageError(f"{self.name}: {experts} experts do not divide over {world} ranks "
                                   "(the number of experts must be a positive multiple of the world size)")
        if experts > ROUTE_MAX_EXPERTS:
            raise StrataUsageError(f"{self.name}: {experts} experts; the kernels count at most "
                                   f"{ROUTE_MAX_EXPERTS}")
        if topk > experts or topk > ROUTE_MAX_TOPK:
            raise StrataUsageError(f"{self.name}: topk = {topk} must be at most the number of experts "
                                   f"({experts}) and at most {ROUTE_MAX_TOPK}")
        bad = (ids < -1) | (ids >= experts)
        if bool(bad.any()):
            at = tuple(int(v) for v in bad.nonzero()[0])
            what = "a rank" if c.kind is ir.ContractKind.ALLTOALLV else "an expert"
            raise StrataUsageError(f"{self.name}: {ids_name}[{', '.join(map(str, at))}] = {int(ids[at])} "
                                   f"is not {what}: it must lie in [0, {experts}) or be -1 (none); "
                                   "nothing was written")
        if c.capacity:
            cap = env[c.capacity]
            valid = ids[ids >= 0].to(torch.int64)
            per = torch.bincount(valid, minlength=experts) if valid.numel() else torch.zeros(experts)
            worst = int(per.max()) if per.numel() else 0
            if worst > cap:
                e = int(per.argmax())
                raise StrataUsageError(f"{self.name}: {worst} tokens of rank {self.comm.rank} go to expert "
                                       f"{e}, more than the capacity of {cap} slots per (expert, source "
                                       "rank); nothing was written (raise the capacity: a larger window)")

    def _scratch_for(self, dtype: ir.DType, env: dict) -> list[torch.Tensor]:
        """Scratch buffers (staging baselines only), allocated on the heap at the first call of a
        size and kept; allocation is collective, like every call."""
        out = []
        for p in self.ir.scratch:
            n = p.size.eval(env)
            tdtype = _TORCH_DTYPES[p.dtype or dtype]
            have = self._scratch.get(p.name)
            if have is None or have.numel() != n or have.dtype != tdtype:
                if have is not None:
                    self.comm.free(have)
                have = self._scratch[p.name] = self.comm.empty(max(n, 1), dtype=tdtype)
            out.append(have)
        return out

    def release_scratch(self) -> None:
        """Frees the scratch buffers a staging baseline keeps between calls. Collective."""
        for t in reversed(list(self._scratch.values())):
            self.comm.free(t)
        self._scratch.clear()

    def _check_aliasing(self, given: dict) -> None:
        """Two tensors that share memory are refused when the schedule writes either: the verifier
        proved the schedule for separate buffers (an in-place variant is a different schedule)."""
        spans = [(name, t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                 for name, t in given.items() if isinstance(t, torch.Tensor) and t.numel() > 0]
        for i, (a, lo_a, hi_a) in enumerate(spans):
            for b, lo_b, hi_b in spans[i + 1:]:
                if lo_a < hi_b and lo_b < hi_a and (a in self._written or b in self._written):
                    w = " and ".join(n for n in (a, b) if n in self._written)
                    raise StrataUsageError(
                        f"{self.name}: parameters {a} and {b} share memory (heap bytes "
                        f"[{max(lo_a, lo_b) - self.comm._base}, {min(hi_a, hi_b) - self.comm._base}) "
                        f"overlap) and the schedule writes {w}: pass separate tensors")

    def _describe_sync(self, sizes: dict[str, int]) -> None:
        """Names the flag slots of this call's sync area for the model's wait-timeout messages, and
        refuses flags that would not fit the area (nothing may be written outside it)."""
        key = tuple(sorted(sizes.items()))
        if self._sync_described != key:
            env = {"world": self.comm.world, **sizes}
            base, parts = self.comm.world, []
            for f in self.ir.flags:
                n = int(f.size.eval(env))
                parts.append(f"{f.name} {base} {n}")
                base += n
            if base > self.comm.world + SYNC_SLOTS:
                raise StrataUsageError(f"{self.name}: its flags need {base - self.comm.world} slots at these "
                                       f"sizes, more than the {SYNC_SLOTS} of the communicator's sync area")
            self._layout = ";".join(parts).encode()
            self._sync_described = key
        self.comm._lib.strata_cpu_describe_sync(self._ffi.cast("void*", self.comm._base + self.comm._sync),
                                                self.comm.world, self._layout)

    def __call__(self, *tensors: torch.Tensor, cores: int | None = None, **named) -> None:
        self.comm._check_open()
        if self._launch is None:
            raise StrataUsageError(f"{self.name} was unloaded (its communicator was closed)")
        dtype, sizes, ptrs, scalars = self.bind(*tensors, **named)
        blocks = cores or self.cores
        if not 1 <= blocks <= abi.MAX_CORES:
            raise StrataUsageError(f"cores must be between 1 and {abi.MAX_CORES}, got {blocks}")
        self._describe_sync(sizes)
        epoch = self.comm.next_epoch(self.ir.sync_ops)
        sync = self._ffi.cast("void*", self.comm._base + self.comm._sync)
        op = scalars.get(self.ir.op_param.name, 0) if self.ir.op_param else 0
        rc = self._launch(dtype.code, op, blocks, self._ffi.NULL, 0, sync, epoch, *ptrs,
                          *(sizes[n] for n in self.ir.sizes),
                          *(scalars[x.name] for x in self.ir.rank_params))
        if rc != 0:
            raise StrataRuntimeError(f"{self.name} failed on rank {self.comm.rank}: "
                                     f"{_last_error(self.comm._lib, self.comm._ffi)}")
