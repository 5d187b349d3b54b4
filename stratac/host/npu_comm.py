"""The runtime on a real Ascend NPU: SHMEM for Ascend through cffi, and NpuCommunicator.

What stratac.host.comm.Communicator does on the CPU model, on the NPU. SHMEM is initialised from a
unique id that rank 0 creates and the job shares (torch.distributed or a Store); heap tensors are
aclshmem_align(512, n) memory wrapped as torch_npu tensors; schedules launch through the generated
launcher on torch_npu's current stream (the kernels' FFTS address is set by the wrapper that
CANN's ascendc_library generates, not passed by stratac); close() synchronises and calls aclshmem_finalize. The kernels come from stratac.targets.npu.build.

torch_npu is imported only here, lazily, and only for the NPU target (docs/npu.md).
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Callable, Mapping

from stratac import ir
from stratac.codegen import abi
from stratac.diagnostics import Codes, Note, StrataError, error
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.ir import passes
from stratac.targets import cpu as _cache
from stratac.targets.npu import (
    build,
    import_torch_npu,
    kernels_library_name,
    require_npu,
    torch_npu_installed,
)

DEFAULT_HEAP_BYTES = 256 << 20
HEAP_ALIGN = 2 << 20                      # SHMEM maps the heap in 2 MiB pages

# The host API subset, from SHMEM's public headers (include/host/...; hicann/shmem v1.3.0):
# aclshmemx_uniqueid_t {int32 version; int my_pe; int n_pes; char internal[124]} and
# aclshmemx_init_attr_t with its optional-attribute block. Enums are int-sized.
SHMEM_CDEF = """
typedef struct { int32_t version; int my_pe; int n_pes; char internal[124]; } aclshmemx_uniqueid_t;
typedef struct {
    int version; int data_op_engine_type; uint32_t shm_init_timeout; uint32_t shm_create_timeout;
    uint32_t control_operation_timeout; int32_t sockFd;
} aclshmem_init_optional_attr_t;
typedef struct {
    int my_pe; int n_pes; char ip_port[64]; uint64_t local_mem_size;
    aclshmem_init_optional_attr_t option_attr; void* comm_args; uint64_t instance_id;
} aclshmemx_init_attr_t;
int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t* uid);
int aclshmemx_set_attr_uniqueid_args(int my_pe, int n_pes, int64_t local_mem_size,
                                     aclshmemx_uniqueid_t* uid, aclshmemx_init_attr_t* attr);
int aclshmemx_init_attr(unsigned int bootstrap_flags, aclshmemx_init_attr_t* attr);
int aclshmemx_init_status(void);
int aclshmem_finalize(void);
void* aclshmem_align(size_t alignment, size_t size);
void aclshmem_free(void* ptr);
void aclshmem_info_get_version(int* major, int* minor);
"""
INIT_WITH_UNIQUEID = 1 << 3               # aclshmemx_bootstrap_t ACLSHMEMX_INIT_WITH_UNIQUEID
DATA_OP = {"mte": 0x01, "sdma": 0x02, "roce": 0x04, "udma": 0x08}
DEFAULT_ENGINES = ("mte", "sdma")         # stratac kernels copy with MTE and SDMA
DEFAULT_TIMEOUT_S = 120                   # SHMEM's DEFAULT_TIMEOUT for the three init timeouts
# One HCCS domain per SoC family, in ranks (processors as Huawei's MindCluster scheduling guide counts
# them; on A3 a rank is one die). The kernels reach peers only by MTE and SDMA, and cross-card
# DataCopy works over HCCS links only (Ascend C DataCopy（UBToUB连续数据搬运）.md, 约束说明).
#   A2: "select Ascend AI Processors in the same HCCS" for jobs of up to 8 (MindCluster 7.3,
#       dl_affinity_0016.html); servers are joined by RoCE only: beyond 8 is refused.
#   A3: 16 per server, "connected through HCCS" (dl_affinity_0040.html); Atlas 900 A3 SuperPoD
#       nodes are joined by HCCS-L2 inside a logical SuperPoD (dl_affinity_0007.html), but whether
#       SHMEM's MTE path reaches across servers is UNVERIFIED: refused unless the caller opts in.
HCCS_DOMAIN = {"Ascend910B": (8, False), "Ascend910_93": (16, True)}   # prefix: (ranks, may opt in)


def check_topology(soc: str | None, world: int, allow_unverified: bool = False) -> str | None:
    """Refuses a world larger than one HCCS domain of the SoC (StrataUsageError); returns a
    warning when the world was not checked or goes beyond it on the caller's word, else None."""
    family = next((f for f in HCCS_DOMAIN if soc and soc.startswith(f)), None)
    if family is None:
        return (f"the HCCS domain of SoC {soc!r} is not known to stratac: a world of {world} ranks "
                "was not checked against it (docs/npu.md, \"Worlds beyond one HCCS domain\")")
    domain, may_opt_in = HCCS_DOMAIN[family]
    if world <= domain:
        return None
    if not may_opt_in:
        raise StrataUsageError(f"a world of {world} ranks on {soc} spans more than one HCCS domain "
                               f"({domain} processors per server on Atlas A2): the kernels reach peers "
                               "only over HCCS (MTE, SDMA) and A2 servers are joined by RoCE only; run "
                               f"at most {domain} ranks per job")
    if not allow_unverified:
        raise StrataUsageError(f"a world of {world} ranks on {soc} spans more than one A3 server "
                               f"({domain} dies joined by HCCS); whether SHMEM's MTE path reaches "
                               "across servers (CloudMatrix384 / Atlas 900 A3 SuperPoD, HCCS-L2) is "
                               "UNVERIFIED: pass allow_unverified_topology=True to run it anyway")
    return (f"a world of {world} ranks on {soc} spans more than one A3 server ({domain} dies): MTE "
            "reach across servers is UNVERIFIED (allow_unverified_topology=True)")


def check_engines(s: ir.Schedule, engines: tuple[str, ...]) -> None:
    """Refuses a schedule with an `on sdma` or `on auto` stage on a communicator whose SHMEM was
    initialised without the SDMA engine (StrataUsageError). SHMEM then leaves the SDMA workspace
    null (src/host/init/shmem_init.cpp:71) and the device's SDMA post dereferences it unchecked
    (shmem_device_sdma.hpp:613-619): a device fault or stray GM writes, not an error."""
    if "sdma" in engines:
        return
    for st in passes.stages(s.body):
        if st.engine in (ir.Engine.SDMA, ir.Engine.AUTO):
            raise StrataUsageError(
                f"schedule {s.name}: stage {st.index} at {st.span} runs `on {st.engine.value}` "
                f"(SDMA copies), but this NpuCommunicator was created with engines="
                f"{tuple(engines)!r}: SHMEM was initialised without ACLSHMEM_DATA_OP_SDMA, so the "
                "kernel would post to a null SDMA workspace. Create the communicator with 'sdma' "
                "in engines (the default is ('mte', 'sdma')), or use a schedule without SDMA "
                "stages; nothing was built or loaded")


SHMEM_ERRORS = {-1: "invalid parameter", -2: "invalid value", -3: "SMEM error",
                -4: "internal error", -5: "not initialised", -6: "bootstrap error", -7: "timeout"}


def shmem_ffi():
    """The cffi description of SHMEM's host API (no library loaded)."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(SHMEM_CDEF)
    return ffi


def uniqueid_version(ffi) -> int:
    """ACLSHMEM_UNIQUEID_VERSION = (1 << 16) + sizeof(aclshmemx_uniqueid_t)."""
    return (1 << 16) + ffi.sizeof("aclshmemx_uniqueid_t")


def optional_attr_version(ffi) -> int:
    """The option_attr.version aclshmemx_init_attr_t's default initialiser sets."""
    return (1 << 16) + ffi.sizeof("aclshmem_init_optional_attr_t")


def _shmem_runtime_error(what: str, rc: int) -> Exception:
    return StrataRuntimeError(f"{what} failed: SHMEM error {rc} "
                              f"({SHMEM_ERRORS.get(rc, 'unknown')})")


class NpuCommunicator:
    """One rank's view of the SHMEM symmetric heap on its NPU: the NPU twin of
    stratac.Communicator. Create it on every rank, in the same order.

        import torch, torch.distributed as dist, stratac
        dist.init_process_group("gloo")                  # bootstraps the unique id exchange
        comm = stratac.NpuCommunicator.from_process_group(heap_bytes=1 << 30)
        mod = comm.load("examples/allreduce_twoshot.strata")
        x = comm.empty(1 << 20, dtype=torch.float32)     # aclshmem_align, as a torch_npu tensor
        x.copy_(data); mod.allreduce_twoshot(x)          # launched on torch.npu.current_stream()
        comm.close()

    Launches are asynchronous in the order of torch_npu's current stream, like any NPU op:
    synchronise the stream before timing or reading results on the host.

    torch_npu is imported by the constructor, not before. Where torch_npu is installed but CANN is
    not, `import torch` fails on its own (torch auto-loads torch_npu): export
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 there to keep the CPU target working.
    """

    def __init__(self, rank: int, world: int, *, exchange_uid: Callable[[bytes | None], bytes],
                 heap_bytes: int = DEFAULT_HEAP_BYTES, device: int | None = None,
                 engines: tuple[str, ...] = DEFAULT_ENGINES,
                 barrier: Callable[[], None] | None = None, env: Mapping[str, str] | None = None,
                 allow_unverified_topology: bool = False):
        """exchange_uid(uid) is called on every rank: rank 0 passes its SHMEM unique id (bytes),
        the others None; it returns rank 0's id on every rank. A world larger than one HCCS domain
        of the SoC is refused (check_topology); allow_unverified_topology lets an A3 job span
        servers, with a warning."""
        self._open = False
        self.toolchain = require_npu(env)
        self._torch_npu = import_torch_npu()
        import torch

        if not 0 <= rank < world:
            raise StrataUsageError(f"rank {rank} is outside world size {world}")
        bad = [e for e in engines if e not in DATA_OP]
        if bad or not engines:
            raise StrataUsageError(f"unknown SHMEM data engine(s) {bad}; known: "
                                   f"{', '.join(DATA_OP)}")
        self.rank, self.world = rank, world
        self.engines = tuple(engines)
        self._barrier = barrier or (lambda: None)
        self._npu = self._torch_npu.npu      # what torch.npu aliases once torch_npu is imported
        if device is None:
            count = self._npu.device_count()
            if count < 1:
                raise StrataRuntimeError("torch_npu sees no NPU (device_count() is 0): check the "
                                         "driver and ASCEND_RT_VISIBLE_DEVICES")
            device = int(os.environ.get("LOCAL_RANK", rank)) % count
        self.device = int(device)
        self.torch_device = torch.device("npu", self.device)
        self._npu.set_device(self.device)
        note = check_topology(self.soc(), world, allow_unverified_topology)
        if note:
            warnings.warn(note, stacklevel=2)

        self._ffi = shmem_ffi()
        try:
            self._lib = self._ffi.dlopen(str(self.toolchain.shmem.library),
                                         self._ffi.RTLD_NOW | self._ffi.RTLD_GLOBAL)
        except OSError as exc:
            raise StrataError(error(Codes.TOOLCHAIN, f"cannot load {self.toolchain.shmem.library}: "
                                    f"{exc}", None,
                                    Note("run `source <install>/shmem/latest/set_env.sh` so that "
                                         "libshmem_utils.so and CANN's libraries are on "
                                         "LD_LIBRARY_PATH"))) from None
        uid = self._ffi.new("aclshmemx_uniqueid_t*")
        uid.version = uniqueid_version(self._ffi)
        mine = None
        if rank == 0:
            rc = self._lib.aclshmemx_get_uniqueid(uid)
            if rc != 0:
                raise _shmem_runtime_error("aclshmemx_get_uniqueid on rank 0", rc)
            mine = bytes(self._ffi.buffer(uid))
        shared = exchange_uid(mine)
        if not isinstance(shared, (bytes, bytearray)) or len(shared) != self._ffi.sizeof(uid[0]):
            raise StrataUsageError(f"exchange_uid must return rank 0's "
                                   f"{self._ffi.sizeof(uid[0])}-byte SHMEM unique id on every rank")
        self._ffi.memmove(uid, bytes(shared), len(shared))
        self.heap_bytes = -(-max(int(heap_bytes), HEAP_ALIGN) // HEAP_ALIGN) * HEAP_ALIGN
        attr = self._ffi.new("aclshmemx_init_attr_t*")
        rc = self._lib.aclshmemx_set_attr_uniqueid_args(rank, world, self.heap_bytes, uid, attr)
        if rc != 0:
            raise _shmem_runtime_error("aclshmemx_set_attr_uniqueid_args", rc)
        # the C++ default member initialisers of aclshmemx_init_attr_t, which cffi does not run
        attr.option_attr.version = optional_attr_version(self._ffi)
        attr.option_attr.data_op_engine_type = sum(DATA_OP[e] for e in set(engines))
        attr.option_attr.shm_init_timeout = DEFAULT_TIMEOUT_S
        attr.option_attr.shm_create_timeout = DEFAULT_TIMEOUT_S
        attr.option_attr.control_operation_timeout = DEFAULT_TIMEOUT_S
        self._uid, self._attr = uid, attr   # attr.comm_args points into uid: keep both alive
        rc = self._lib.aclshmemx_init_attr(INIT_WITH_UNIQUEID, attr)
        if rc != 0:
            raise _shmem_runtime_error(f"aclshmemx_init_attr (rank {rank} of {world}, engines "
                                       f"{'+'.join(engines)}, heap {self.heap_bytes} bytes)", rc)
        self._open = True
        self._allocs: dict[int, int] = {}
        self._sync = self._alloc(abi.sync_area_bytes(world), zero=True)
        self._epoch = 0
        self._modules: list[NpuModule] = []

    # ---- construction from a job
    @classmethod
    def from_process_group(cls, heap_bytes: int = DEFAULT_HEAP_BYTES, device: int | None = None,
                           engines: tuple[str, ...] = DEFAULT_ENGINES,
                           allow_unverified_topology: bool = False) -> "NpuCommunicator":
        """Every rank of an initialised torch.distributed job (any backend; gloo suffices)."""
        require_npu()       # before any collective, so that every rank fails alike
        import torch.distributed as dist

        if not dist.is_initialized():
            raise StrataUsageError("torch.distributed is not initialised: call "
                                   "dist.init_process_group(...) first (or use torchrun)")

        def exchange(uid: bytes | None) -> bytes:
            box = [uid]
            dist.broadcast_object_list(box, src=0)
            return box[0]

        return cls(dist.get_rank(), dist.get_world_size(), exchange_uid=exchange,
                   heap_bytes=heap_bytes, device=device, engines=engines, barrier=dist.barrier,
                   allow_unverified_topology=allow_unverified_topology)

    @classmethod
    def from_store(cls, rank: int, world: int, store, heap_bytes: int = DEFAULT_HEAP_BYTES,
                   device: int | None = None, engines: tuple[str, ...] = DEFAULT_ENGINES,
                   timeout: float = 300.0, prefix: str = "stratac-npu",
                   allow_unverified_topology: bool = False) -> "NpuCommunicator":
        """Bootstrap from a torch.distributed Store (TCPStore, FileStore, ...): rank 0 puts the
        unique id in the store, the others read it."""
        require_npu()

        def exchange(uid: bytes | None) -> bytes:
            if uid is not None:
                store.set(f"{prefix}/uid", uid)
            return bytes(store.get(f"{prefix}/uid"))

        from stratac.host.comm import store_barrier
        return cls(rank, world, exchange_uid=exchange, heap_bytes=heap_bytes, device=device,
                   engines=engines, barrier=store_barrier(store, world, timeout, prefix),
                   allow_unverified_topology=allow_unverified_topology)

    # ---- heap
    def _check_open(self) -> None:
        if not self._open:
            raise StrataUsageError("the communicator is closed")

    def _alloc(self, nbytes: int, zero: bool = False) -> int:
        self._check_open()
        n = max(int(nbytes), 1)
        # aclshmem_malloc/calloc align to 16 bytes only (SHMEM src/host/mem/shmem_mgr.cpp:241-245); the
        # kernels assume 512 (64-byte signal lines, 32-byte DMA blocks), as the CPU model's allocations
        p = self._lib.aclshmem_align(abi.HEAP_ALIGN, n)
        if p != self._ffi.NULL and zero:
            self._zero(int(self._ffi.cast("uintptr_t", p)), n)
        if p == self._ffi.NULL:
            raise StrataRuntimeError(f"symmetric heap exhausted: {n} more bytes do not fit in the "
                                     f"{self.heap_bytes}-byte heap per rank (create the "
                                     "communicator with a larger heap_bytes)")
        ptr = int(self._ffi.cast("uintptr_t", p))
        self._allocs[ptr] = n
        return ptr

    def _zero(self, ptr: int, n: int) -> None:
        """Zeroes n bytes of device memory at ptr (aclshmem_align does not; calloc has no aligned
        form) and waits, so that no kernel sees them before."""
        import torch
        self._wrap(ptr, (n,), torch.uint8).zero_()
        self._npu.current_stream(self.device).synchronize()

    def status_line(self) -> list[int]:
        """The 16 int32 of this rank's status line (abi.status_offset) after the calls queued so
        far: copying it to the host waits for the stream."""
        import torch
        return self._wrap(self._sync + abi.status_offset(self.world), (abi.SYNC_SLOT_BYTES // 4,),
                          torch.int32).cpu().tolist()

    def write_mask(self, bits: int) -> None:
        """This rank's mask of active ranks (bit r: rank r is live; -1: every rank) into the sync
        area (abi.mask_offset), by a copy queued on the stream before the launch that reads it,
        after every launch queued before (which may still be reading the last one)."""
        import torch
        if getattr(self, "_mask_held", None) != bits:
            words = abi.mask_words(bits, self.world)
            self._wrap(self._sync + abi.mask_offset(self.world), (len(words),), torch.int32).copy_(
                torch.tensor(words, dtype=torch.int32), non_blocking=False)
            self._mask_held = bits

    def _wrap(self, ptr: int, shape: tuple[int, ...], dtype):
        """A torch_npu tensor over SHMEM memory. torch_npu has no public constructor from a device
        pointer; this is the pair of its private constructors that SHMEM's own Python package
        uses (shmem/construct_tensor.py). The storage does not own the memory: free() does."""
        C = self._torch_npu._C
        make_storage = getattr(C, "_construct_storage_from_data_pointer", None)
        make_tensor = getattr(C, "_construct_NPU_Tensor_From_Storage_And_Metadata", None)
        if not (callable(make_storage) and callable(make_tensor)):
            raise StrataRuntimeError(
                f"this torch_npu ({torch_npu_installed()}) lacks "
                "_construct_storage_from_data_pointer/_construct_NPU_Tensor_From_Storage_And_"
                "Metadata, the only way found to view "
                "SHMEM memory as a tensor: use a torch_npu release that has them")
        import torch
        elem = torch.empty(0, dtype=dtype).element_size()
        stride, acc = [], 1
        for d in reversed(shape):
            stride.append(acc)
            acc *= d
        nbytes = acc * elem
        meta = {"data_ptr": ptr, "device": self.torch_device, "nbytes": nbytes, "dtype": dtype,
                "size": tuple(shape), "stride": tuple(reversed(stride)), "storage_offset": 0}
        return make_tensor(meta, make_storage(ptr, self.torch_device, nbytes))

    def empty(self, *shape, dtype=None):
        """A tensor on the symmetric heap. Every rank must allocate the same shapes in the same
        order (aclshmem_align is collective and symmetric)."""
        import torch
        dtype = torch.float32 if dtype is None else dtype
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        numel = 1
        for d in shape:
            numel *= d
        ptr = self._alloc(numel * torch.empty(0, dtype=dtype).element_size())
        return self._wrap(ptr, shape, dtype)

    def zeros(self, *shape, dtype=None):
        t = self.empty(*shape, dtype=dtype)
        t.zero_()
        return t

    def free(self, t) -> None:
        """Returns a heap tensor's memory (collective, like allocation). Waits for the stream
        first, so that no queued kernel still uses it."""
        self.offset_of(t, "tensor")
        if t.data_ptr() not in self._allocs:
            raise StrataUsageError("free takes a tensor returned by comm.empty/comm.zeros, "
                                   "not a view")
        self._npu.current_stream(self.device).synchronize()
        self._lib.aclshmem_free(self._ffi.cast("void*", t.data_ptr()))
        del self._allocs[t.data_ptr()]

    def offset_of(self, t, what: str) -> int:
        """Checks that t lies inside one heap allocation; returns its offset from the first."""
        import torch

        if not isinstance(t, torch.Tensor):
            raise StrataUsageError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "npu":
            raise StrataUsageError(f"{what} is on {t.device}; the npu target runs on NPU tensors "
                                   "allocated with comm.empty(...)")
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        if not any(p <= lo and hi <= p + n for p, n in self._allocs.items()):
            raise StrataUsageError(f"{what} is not on the symmetric heap: allocate it with "
                                   "comm.empty(shape, dtype=...) (stratac never copies user "
                                   "tensors)")
        if not t.is_contiguous():
            raise StrataUsageError(f"{what} must be contiguous")
        return lo - min(self._allocs)

    @property
    def _base(self) -> int:
        """Where heap offsets in messages count from (the first allocation, as offset_of)."""
        return min(self._allocs) if self._allocs else 0

    @property
    def heap_used(self) -> int:
        """Bytes this communicator has allocated (SHMEM has no query for it)."""
        return sum(self._allocs.values())

    # ---- compiled schedules
    def load(self, path_or_source, *, options: passes.Options | None = None,
             name: str = "<source>") -> "NpuModule":
        """Compiles every schedule of a .strata file or source text and builds it with CANN
        (through the cache)."""
        from stratac.codegen.pipeline import compile_schedules
        from stratac.host.schedule import prove_worlds
        from stratac.lang import frontend
        self._check_open()
        options = options or passes.Options(soc=self.soc() or passes.DEFAULT_SOC)
        options.check()
        if options.agreement and not getattr(self, "_agreement_warned", False):
            # the kernels' strata::Agree compares records this host does not write yet: say so
            self._agreement_warned = True
            warnings.warn("stratac on the NPU: the ranks' agreement on each call is not active (the "
                          "NPU host does not write the call records yet; docs/robustness.md, 'Ranks "
                          "that make different calls'): ranks that call with different arguments "
                          "are not refused here as they are on the CPU build", RuntimeWarning,
                          stacklevel=2)
        here = self.soc()
        if here is not None and here != options.soc:
            raise StrataUsageError(f"this NPU is {here}; the schedules were asked for "
                                   f"{options.soc}: load them with Options(soc={here!r})")
        source = frontend.path_or_text(path_or_source, name)
        compiled = compile_schedules(source, options, [self.world], prove_worlds)
        for c in compiled:
            check_engines(c.schedule, self.engines)
        mod = NpuModule(self, [(c.schedule, build(c.output, options.soc, toolchain=self.toolchain))
                               for c in compiled])
        self._modules.append(mod)
        return mod

    def soc(self) -> str | None:
        """The SoC name of this NPU as torch_npu reports it, if it is one stratac knows."""
        try:
            name = str(self._npu.get_device_name(self.device))
        except (AttributeError, RuntimeError):
            return None
        return name if name in passes.SOCS else None

    def next_epoch(self, stamps: int) -> int:
        epoch = self._epoch
        self._epoch += stamps + 1
        if self._epoch >= 2**31 - 1:
            raise StrataRuntimeError("flag stamps exhausted (2^31 per communicator): create a "
                                     "new one")
        return epoch

    def stream_handle(self) -> int:
        """The aclrtStream of torch_npu's current stream. Reading Stream.npu_stream calls
        NPUStream::stream(), which first empties torch_npu's task queue, so a launch on the
        handle is ordered after every op already queued on that stream."""
        return int(self._npu.current_stream(self.device).npu_stream)

    # the CPU model's per-core counters have no NPU equivalent here
    def reset_counters(self) -> None:
        pass

    def counters(self) -> list[dict[str, int]]:
        return []

    def barrier(self) -> None:
        self._barrier()

    def synchronize(self) -> None:
        """Waits until everything queued on this device (the schedules included) has finished."""
        self._npu.synchronize(self.device)

    def close(self, collective: bool = True) -> None:
        """Waits for the device, unloads the schedules and finalises SHMEM. Collective: every
        rank must call it (SHMEM finalises symmetrically)."""
        if not self._open:
            return
        self._npu.synchronize(self.device)
        if collective:
            self._barrier()
        for mod in self._modules:
            mod.unload()
        self._modules.clear()
        self._open = False
        rc = self._lib.aclshmem_finalize()
        if rc != 0:
            raise _shmem_runtime_error("aclshmem_finalize", rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


NpuBackend = NpuCommunicator


class NpuModule:
    """The schedules of one .strata source on the NPU, each a callable attribute."""

    def __init__(self, comm: NpuCommunicator, built: list[tuple[ir.Schedule, _cache.Built]]):
        cls = npu_schedule_class()
        self.schedules: dict = {}
        for s, b in built:
            fn = cls(comm, s, b)
            self.schedules[s.name] = fn
            setattr(self, s.name, fn)

    def __getitem__(self, name: str):
        return self.schedules[name]

    def unload(self) -> None:
        for fn in self.schedules.values():
            fn.unload()


@functools.lru_cache(maxsize=1)
def npu_schedule_class():
    """NpuSchedule, a stratac.host.comm.Schedule that launches on the NPU. Made on first use, so that
    importing stratac.host.npu_comm does not import torch."""
    from stratac.host.schedule import ALL_RANKS, Schedule, check_world_constraints

    class NpuSchedule(Schedule):
        """A schedule built for the NPU, bound to an NpuCommunicator: call it with heap tensors.
        Argument checks (and scratch buffers) are the CPU target's; the launch is the NPU's."""

        def __init__(self, comm: NpuCommunicator, s: ir.Schedule, built: _cache.Built):
            import cffi
            # the kernels first, globally: the launcher's dependency on them is then satisfied
            self._kernels_ffi = cffi.FFI()
            self._kernels = self._kernels_ffi.dlopen(
                str(built.directory / kernels_library_name(s.name)),
                self._kernels_ffi.RTLD_NOW | self._kernels_ffi.RTLD_GLOBAL)
            super().__init__(comm, s, built)
            self.max_cores = passes.SOCS[s.kernel.soc]

        def auto_limit(self) -> int:
            """The NPU rule alone: the vector cores are hardware, not this host's CPUs."""
            return self.cores

        def unload(self) -> None:
            super().unload()
            if self._kernels is not None:
                self._kernels_ffi.dlclose(self._kernels)
                self._kernels = None

        def __call__(self, *tensors, cores: int | None = None, active=None, **named) -> None:
            self.comm._check_open()
            check_world_constraints(self.ir, self.comm.world)
            if self._unloaded:
                raise StrataUsageError(f"{self.name} was unloaded (its communicator was closed)")
            bits = self.active_bits(active)
            if cores is not None:
                self.launch_cores(cores, self.max_cores)    # a bad cores value before the tensors
            bound = self.bind(*tensors, **named)
            dtype, sizes, ptrs = bound[:3]
            scalars = bound[3] if len(bound) > 3 else {}
            params = self.instance_params(sizes, scalars)
            if bits != ALL_RANKS:   # the masked variant of this instance must be proven too
                self._check_instance(params, bits)
            # the CPU launcher's rule without its host cap (stratac.host.cores): cores follow the bytes
            blocks = self.last_cores = self.launch_cores(cores, self.max_cores, sizes, dtype)
            op_param = getattr(self.ir, "op_param", None)
            op = scalars.get(op_param.name, 0) if op_param else 0
            launch = self._launcher(dtype, op)     # before the epoch is taken: a load error takes none
            fixed = {"dtype": dtype.code, "op": op,
                     "blocks": blocks,
                     "sync": self._ffi.cast("void*", self.comm._sync),
                     "epoch": self.comm.next_epoch(self.ir.stamps({"world": self.comm.world, **params})),
                     # read last: reading it flushes torch_npu's queue (see stream_handle)
                     "stream": self._ffi.cast("void*", self.comm.stream_handle())}
            pointers = iter(ptrs)
            args = []
            for a in abi.args(self.ir):     # the launcher's parameters, in ABI order
                if a.role in fixed:
                    args.append(fixed[a.role])
                elif a.role in ("tensor", "scratch"):
                    args.append(next(pointers))
                elif a.role == "size":
                    args.append(sizes[a.name])
                else:
                    args.append(scalars[a.name])
            if ir.takes_mask(self.ir):
                self.comm.write_mask(bits)
            rc = launch(*args)
            if rc != 0:
                raise StrataRuntimeError(f"{self.name}: launching the {dtype.short} kernel on rank "
                                         f"{self.comm.rank} failed (the launcher returned {rc})")
            self.check_status()   # a packed MoE call: waits for the stream to read its bound's verdict

    return NpuSchedule
