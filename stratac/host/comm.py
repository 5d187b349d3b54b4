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

import _signal
import array
import atexit
import math
import os
import secrets
import signal
import sys
import time
import weakref
from pathlib import Path

import torch

from stratac.codegen import abi
from stratac.host import cpu_model
from stratac.host.cpu_model import check_pool, last_error, runtime
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.host.schedule import Module, compile_source
from stratac.ir import passes
from stratac.lang import frontend

DEFAULT_HEAP_BYTES = 256 << 20
_SIGINT, _SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)
DEFAULT_TIMEOUT = 60.0



def _handlers() -> tuple:
    """Python's handlers of SIGINT and SIGTERM (what signal.signal last set), compared before every
    launch: the C-level getsignal, without signal.getsignal's conversion to enums (a microsecond
    of every call)."""
    return _signal.getsignal(_SIGINT), _signal.getsignal(_SIGTERM)


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


class Communicator:
    """One rank's view of the symmetric heap. Create it on every rank, in the same order.

    A process may hold several communicators at once (a torch.distributed group each, a MoE
    Buffer beside them): each maps a pool of its own in the CPU model, with its own heap, sync
    area and stamps, and makes its pool the model's current one before it uses the model."""

    _open_count = 0   # communicators of this process that are open (the signal watch is shared)

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
        self._ffi, self._lib = runtime()
        need = abi.sync_area_bytes(world) + abi.HEAP_ALIGN
        if heap_bytes < need:   # before the pool is mapped: nothing to unmap when refused
            raise StrataUsageError(f"heap_bytes = {heap_bytes} per rank cannot even hold the sync area of world "
                                   f"{world} ({need} bytes): give a larger heap")
        rc = self._lib.strata_cpu_init(rank, world, segment.encode(), heap_bytes, int(create))
        if rc != 0:
            raise StrataRuntimeError(f"cannot map the symmetric heap: {last_error(self._lib, self._ffi)}")
        self._pool = cpu_model.current[0] = int(self._lib.strata_cpu_current_pool())
        self._open = True
        Communicator._open_count += 1
        # a process that exits without close() has left the pool: its peers must not take it for dead
        atexit.register(self._leave)
        self._lib.strata_cpu_set_timeout(float(timeout))
        self.timeout = timeout
        # SIGINT and SIGTERM stop a launch's waits (runtime/cpu/src/host_signals.cpp:
        # strata_cpu_watch_signals); watched again at a launch once the program has set another
        # handler (signal.signal replaces ours)
        self._lib.strata_cpu_watch_signals(1)
        self._signals = _handlers()
        base = self._lib.strata_cpu_heap_base()
        self._base = int(self._ffi.cast("uintptr_t", base))
        self._buffer = self._ffi.buffer(base, heap_bytes)
        self._heap = torch.frombuffer(self._buffer, dtype=torch.uint8)
        self._sync = self._alloc(abi.sync_area_bytes(world), zero=True)
        # every tensor comm.empty makes has a storage of its own over its allocation, so that a
        # tensor (or a view of it) names its allocation even after the memory is reused: by the
        # storage's identity, with the storage held so that the identity stays unique
        self._live: dict[int, tuple[int, torch.UntypedStorage]] = {}
        self._freed: weakref.WeakSet = weakref.WeakSet()   # forgotten with the last tensor on them
        self._epoch = 0
        self._calls = 0   # calls launched: the number of the last (the ranks' agreement compares it)
        sync = self._base + self._sync
        # this rank's agreement records (one per epoch parity) and verdict line (abi.agree_offset)
        words = memoryview(self._ffi.buffer(self._ffi.cast("char *", sync),
                                            abi.sync_area_bytes(world))).cast("i")   # int32
        self._agree = [words[abi.agree_offset(world, i) // 4:] for i in (0, 1)]
        self._verdict = words[abi.verdict_offset(world) // 4:]
        self._mask = words[abi.mask_offset(world) // 4:abi.sync_area_bytes(world) // 4]
        self._mask_held = None    # the mask of active ranks the sync area holds (write_mask)
        self._agree_held: list = [None, None]   # the record (Schedule._record) each one holds
        self._modules: list[Module] = []
        self._sync_owner = None   # the prepared call whose flags strata_cpu_describe_sync names
        self._aiv_cores = None    # the SoC core count last given to the model (strata_cpu_set_aiv_cores)
        self._active = -1   # the live ranks last given to the model (set_active), every bit set: all

    # ---- construction from a torch.distributed job
    @classmethod
    def from_process_group(cls, heap_bytes: int = DEFAULT_HEAP_BYTES, timeout: float = DEFAULT_TIMEOUT,
                           segment: str | None = None, group=None) -> "Communicator":
        """A communicator over the members of a torch.distributed group (None: the default group,
        every rank). Collective over the group: every member calls it, in the same order as its
        other collectives. The communicator's ranks are the group's ranks (dist.get_group_rank)."""
        import torch.distributed as dist
        if not dist.is_initialized():
            raise StrataUsageError("torch.distributed is not initialised: call "
                                   "dist.init_process_group('gloo') first (or use torchrun)")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise StrataUsageError(f"group must be a torch.distributed ProcessGroup or None, got "
                                   f"{type(group).__name__}")
        if group is not None and dist.get_rank(group) < 0:
            raise StrataUsageError(f"rank {dist.get_rank()} is not a member of the group it was asked "
                                   "to make a communicator over")
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        name = [segment or _segment_name()]
        root = 0 if group is None else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(name, src=root, group=group)
        return cls._bootstrap(rank, world, name[0], heap_bytes, timeout,
                              lambda: dist.barrier(group=group))

    @classmethod
    def from_store(cls, rank: int, world: int, store, heap_bytes: int = DEFAULT_HEAP_BYTES,
                   timeout: float = DEFAULT_TIMEOUT, prefix: str = "stratac") -> "Communicator":
        """Bootstrap from a torch.distributed Store (TCPStore, FileStore, ...) without a process
        group: rank 0 names the segment in the store, the others read it."""
        if rank == 0:
            store.set(f"{prefix}/segment", _segment_name())
        name = store.get(f"{prefix}/segment").decode()
        _, lib = runtime()
        made: list[Communicator] = []

        def check(where: str) -> None:   # once the heap is mapped: a failed or dead peer ends the wait
            if made and made[0]._open:
                made[0]._use()
                check_pool(lib, rank, where)

        barrier = store_barrier(store, world, timeout, prefix, rank=rank, check=check)
        return cls._bootstrap(rank, world, name, heap_bytes, timeout, barrier, made)

    @classmethod
    def _bootstrap(cls, rank, world, name, heap_bytes, timeout, barrier, made=None) -> "Communicator":
        # rank 0 creates the segment; the others map it once it exists; once every rank has mapped
        # it, its name is removed, so no segment can outlive the job however it ends. A barrier
        # that fails (a peer that never came) unmaps what this rank mapped.
        comm = None
        try:
            if rank != 0:
                barrier()
            comm = cls(rank, world, segment=name, create=rank == 0, heap_bytes=heap_bytes,
                       timeout=timeout, barrier=barrier)
            if made is not None:
                made.append(comm)
            if rank == 0:
                barrier()
            barrier()
        except BaseException:
            if comm is not None:
                comm.close(collective=False)
            if rank == 0:
                unlink_segment(name)
            raise
        if rank == 0:
            unlink_segment(name)
        return comm

    # ---- heap
    def _alloc(self, nbytes: int, zero: bool = False) -> int:
        self._check_open()
        ptr = self._lib.aclshmem_align(abi.HEAP_ALIGN, nbytes)     # aclshmem_malloc: 16 B only
        if ptr != self._ffi.NULL and zero:
            self._ffi.memmove(ptr, bytes(nbytes), nbytes)
        if ptr == self._ffi.NULL:
            raise StrataRuntimeError(f"symmetric heap exhausted: {last_error(self._lib, self._ffi)} "
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
        nbytes = max(numel * elem, 1)
        off = self._alloc(nbytes)
        raw = torch.frombuffer(self._ffi.buffer(self._ffi.cast("char *", self._base + off), nbytes),
                               dtype=torch.uint8)
        storage = raw.untyped_storage()
        self._live[storage._cdata] = (off, storage)
        return raw[:numel * elem].view(dtype).view(*shape)

    def zeros(self, *shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        t = self.empty(*shape, dtype=dtype)
        t.zero_()
        return t

    def free(self, t: torch.Tensor) -> None:
        """Returns the memory of the allocation t (or a view of it) belongs to; t and its views are
        refused by schedules from then on. Collective, like allocation: same order on every rank."""
        self._check_open()
        self.offset_of(t, "the tensor to free")
        off, storage = self._live.pop(t.untyped_storage()._cdata)
        self._freed.add(storage)
        self._lib.aclshmem_free(self._ffi.cast("void*", self._base + off))

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
        storage = t.untyped_storage()
        if storage._cdata not in self._live:
            if storage in self._freed:
                raise StrataUsageError(f"{what} was given back with comm.free: its memory may belong "
                                       "to another tensor now; allocate a new one with comm.empty")
            raise StrataUsageError(f"{what} lies on the symmetric heap but is not a tensor comm.empty "
                                   "or comm.zeros made: pass the tensor they returned (or a view of it)")
        if not t.is_contiguous():
            raise StrataUsageError(f"{what} must be contiguous")
        return off

    def status_line(self) -> list[int]:
        """The 16 int32 of this rank's status line (abi.status_offset), as the last call left them."""
        off = self._sync + abi.status_offset(self.world)
        return self._heap[off:off + abi.SYNC_SLOT_BYTES].view(torch.int32).tolist()

    @property
    def heap_used(self) -> int:
        self._check_open()
        return int(self._lib.strata_cpu_heap_used())

    # ---- compiled schedules
    def load(self, path_or_source: str | Path, *, options: passes.Options | None = None,
             name: str = "<source>", selection=None) -> "Module":
        """Compiles (through the cache) every schedule of a .strata file or source text.
        selection: the table the selecting entry points (mod.allreduce, ...) use: a path or a
        table, None for this machine's table if `stratac tune` wrote one (stratac.host.select),
        False for the default rule."""
        self._check_open()
        source = frontend.path_or_text(path_or_source, name)
        mod = Module(self, compile_source(source, options or passes.Options(), worlds=[self.world]),
                     selection=selection)
        self._modules.append(mod)
        return mod

    def next_call(self, stamps: int) -> tuple[int, int]:
        """The first stamp (epoch) and the number of the next call. The epoch has the parity of the
        call's number, which picks the call's agreement record (abi.agree_offset): a rank that
        has returned from call k writes call k + 1's record into the other one, so a peer still
        comparing call k reads k's."""
        self._calls += 1
        epoch = self._epoch + ((self._epoch ^ self._calls) & 1)
        self._epoch = epoch + stamps + 1
        if self._epoch >= 2**31 - 1:
            raise StrataRuntimeError("flag stamps exhausted (2^31 per communicator): create a new one")
        return epoch, self._calls

    def write_record(self, parity: int, call: int, record: tuple) -> None:
        """This rank's agreement record of a call (abi.AGREE_*), before its launch. `record` is the
        call's (digest, text), the same object for every call of one signature (Schedule._record),
        so the slot's hash and text are rewritten only when another call's held it."""
        w = self._agree[parity]
        w[0] = call
        w[abi.AGREE_EPOCH_WORD] = self._epoch
        if self._agree_held[parity] is not record:
            digest, text = record
            w[1:5] = array.array("i", digest)
            w[abi.SYNC_SLOT_BYTES // 4:abi.AGREE_RECORD_BYTES // 4] = memoryview(text).cast("i")
            self._agree_held[parity] = record

    def write_mask(self, bits: int) -> None:
        """This rank's mask of active ranks (bit r: rank r is live; -1: every rank), before the
        launch of a kernel that reads it (abi.mask_offset, strata::Ranks)."""
        if self._mask_held != bits:
            self._mask[:] = array.array("i", abi.mask_words(bits, self.world))
            self._mask_held = bits

    def set_active(self, bits: int) -> None:
        """The live ranks of the launches from now on, for the CPU model's waits: one stops early
        for the death of a live rank only (strata_cpu_set_active_ranks)."""
        if self._active != bits:
            live = bits & ((1 << self.world) - 1)
            words = [(live >> (64 * i)) & (2**64 - 1) for i in range(-(-self.world // 64))]
            self._lib.strata_cpu_set_active_ranks(self._ffi.new("uint64_t[]", words), len(words))
            self._active = bits

    def read_record(self, rank: int, parity: int) -> tuple[tuple[int, ...], int, str]:
        """Rank `rank`'s agreement record of the calls of this parity (the pool maps every rank's
        heap): its compared words, the epoch after its call, its description."""
        addr = (self._base + (rank - self.rank) * self.heap_bytes + self._sync
                + abi.agree_offset(self.world, parity))
        raw = bytes(self._ffi.buffer(self._ffi.cast("char *", addr), abi.AGREE_RECORD_BYTES))
        words = torch.frombuffer(bytearray(raw[:abi.SYNC_SLOT_BYTES]), dtype=torch.int32).tolist()
        text = raw[abi.SYNC_SLOT_BYTES:].split(b"\0", 1)[0].decode(errors="replace")
        return tuple(words[:abi.AGREE_COMPARED_BYTES // 4]), words[abi.AGREE_EPOCH_WORD], text

    def disagreed(self, call: int) -> bool:
        """Whether the kernel of call `call` found a live peer making another call (and returned
        without writing): its verdict line names the call."""
        return self._verdict[0] == call

    def settle_disagreement(self, epochs: list[int]) -> None:
        """After a call the ranks did not agree on: every rank continues from the largest epoch any
        of them reached, so that the stamps of their next calls meet again."""
        self._epoch = max(epochs + [self._epoch])

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

    def watch_signals(self) -> None:
        """Before a launch: if the program set a SIGINT or SIGTERM handler since the last look, which
        replaced the model's, put the model's back in front of it (it hands signals on to it)."""
        seen = _handlers()
        if seen != self._signals:
            self._lib.strata_cpu_watch_signals(1)
            self._signals = seen

    def end_on_signal(self, sig: int, what: str) -> None:
        """A SIGINT or SIGTERM whose action was the default arrived while `what` ran: the model
        stopped the launch's waits (the pool is aborted: every rank's call fails, naming the signal)
        and held the signal back, so that the process does not die inside the kernel. Ends as the
        default would have, but cleanly: SIGINT raises KeyboardInterrupt; SIGTERM says so on stderr
        and raises SystemExit(128 + SIGTERM), so that finally blocks and atexit (this rank leaves
        the pool) still run. docs/robustness.md, "Signals"."""
        name = signal.Signals(sig).name
        msg = (f"stratac: rank {self.rank}: {name} while {what} ran: the call was abandoned (its waits "
               "stopped; the pool is aborted, so every rank's call fails)")
        if sig == signal.SIGINT:
            raise KeyboardInterrupt(msg)
        print(msg + "; exiting", file=sys.stderr, flush=True)
        raise SystemExit(128 + sig)

    def dead_rank(self) -> tuple[int, str] | None:
        """(rank, what happened) for the lowest rank whose process died without leaving the heap
        (killed, crashed), or None. Waits check this themselves; this is for host-side code."""
        self._check_open()
        r = self._lib.strata_cpu_dead_rank()
        return (r, last_error(self._lib, self._ffi)) if r >= 0 else None

    def _leave(self) -> None:
        if getattr(self, "_open", False):
            self._use()
            self._lib.strata_cpu_leave()

    def _use(self) -> None:
        """Makes this communicator's pool the CPU model's current one (a no-op when it is)."""
        if cpu_model.current[0] != self._pool:
            if self._lib.strata_cpu_select_pool(self._pool) != 0:
                raise StrataRuntimeError(last_error(self._lib, self._ffi))
            cpu_model.current[0] = self._pool

    def _check_open(self) -> None:
        if not getattr(self, "_open", False):
            raise StrataUsageError("the communicator is closed")
        if cpu_model.current[0] != self._pool:
            self._use()

    def close(self, unlink: bool = False, collective: bool = True) -> None:
        """Releases the heap and the loaded libraries. Collective: call on every rank (after a
        failure, collective=False skips the barrier; whoever started the job unlinks the segment)."""
        if not getattr(self, "_open", False):
            return
        if collective:
            self._barrier()
        atexit.unregister(self._leave)
        del self._heap
        self._buffer = self._agree = self._verdict = None
        self._open = False
        for mod in self._modules:
            mod.unload()
        self._modules.clear()
        self._live.clear()
        if unlink:
            unlink_segment(self.segment)
        Communicator._open_count -= 1
        if Communicator._open_count == 0:
            self._lib.strata_cpu_watch_signals(0)
        self._use()
        self._lib.strata_cpu_finalize(0)
        cpu_model.current[0] = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
