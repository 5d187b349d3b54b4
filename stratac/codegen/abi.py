"""The one description of the kernel ABI. The launcher's C signature (templates/launch.cpp.j2), the
kernel entry's parameter list, the cffi cdef and manifest.json are all derived from it.

Launcher:  int strata_launch_<schedule>(int32_t dtype, int32_t op, uint32_t blocks, void* stream,
                                         void* sync, int32_t epoch,
                                         void* <tensor>..., void* <scratch>..., uint64_t <size>...,
                                         int32_t <rank parameter>...)
Kernel:    one entry per element type (and reduction, for a schedule with a redop parameter),
           <schedule>_<dtype>[_<op>](sync, epoch, tensors..., scratch..., sizes..., ranks...).
No FFTS (hard-sync) address is passed: for a MIX kernel type the NPU build's ascendc_library adds a
hidden ffts_addr argument itself and sets it in the wrapper it generates (docs/npu.md, "Launch").
`dtype` is ir.DType.code, `op` the index in OPS (ignored without a redop parameter); `sync` is the
symmetric flag area; `epoch` the call's first flag stamp. A call's mask of active ranks (MoE
schedules only, ir.takes_mask) is not an argument: the host writes it into the sync area before
the launch (mask_offset). A user name that would clash in C++
(`class`, `sync`, `x_`) is renamed there (c_name, c_param); the manifest keeps the user's names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stratac import ir

# ---- the sync area (`sync`): an array of slots, one 64-byte line each, the int32 flag at the start
# of its line (strata::kSyncSlotBytes, strata::SyncSlot in runtime/device/strata_device.h; SHMEM
# pads its signals the same way, ACLSHMEM_SYNCBIT_SIZE = 64: a signal is a scalar store plus a
# flush of its whole D-cache line, so flags sharing a line can overwrite each other). Slots
# [0, world) are the barrier's, then SYNC_SLOTS slots for the schedules' named flags.
SYNC_SLOT_BYTES = 64
SYNC_SLOTS = 4096


# After the flag slots, one more line: the rank's status line (strata::StatusLine), 16 int32
# written by DMA from one core of the rank and read by the host after a call. A packed MoE call
# (exscan) leaves there: [STATUS_OVER] 1 when some owner would receive more rows than its window
# holds (then nothing was placed or gathered, on any rank), [STATUS_OWNER] the owner with the most
# rows, [STATUS_ROWS] its rows, [STATUS_BOUND] the window's rows, [STATUS_OWNERS_OVER] how many
# owners are over. With a region per expert (exscan(counts, R)) the same of experts: the expert
# with the most rows, its rows, R, how many experts are over.
STATUS_OVER, STATUS_OWNER, STATUS_ROWS, STATUS_BOUND, STATUS_OWNERS_OVER = range(5)


# After the status line: the rank's agreement records (strata::AgreeRecord), two of AGREE_LINES lines
# each, the one of a call chosen by its epoch's parity (which the host makes that of the call
# number, stratac.host.comm), and then its verdict line (strata::AgreeVerdict). The host writes a
# call's record before the launch: int32 [0] the call number (1 for a communicator's first call),
# [1, 5) a 128-bit hash of the schedule and the call's instance (world, sizes, dtype, op, rank
# parameters, mask), [5, 8) zero: the AGREE_COMPARED_BYTES the kernel compares with every live
# peer's record before its first write to another rank; [8] the epoch after this call (the ranks
# take the largest after a disagreement, so that their stamps meet again); lines 1.. a readable
# description of the call, UTF-8, NUL-padded (AGREE_TEXT_BYTES), which only the host reads, and
# only after a disagreement. On a difference core 0 of the kernel leaves [0] the call number and
# [1] the first peer that differs in the verdict line, and the kernel returns without writing.
AGREE_LINES = 4
AGREE_RECORD_BYTES = AGREE_LINES * SYNC_SLOT_BYTES
AGREE_COMPARED_BYTES = 32
AGREE_EPOCH_WORD = 8
AGREE_TEXT_BYTES = AGREE_RECORD_BYTES - SYNC_SLOT_BYTES


# After the verdict line: the rank's mask of active ranks (strata::Ranks), one bit per rank, bit p
# of int32 word p / 32 for rank p (1: rank p takes part in the call), MASK_LINES(world) lines. The
# host writes it before the launch of a masked kernel (ir.takes_mask), all ones for a call without
# a mask; the kernel copies it into UB once (DataCopy: never read as GM scalars, which the scalar
# D-cache could hold stale from an earlier call) and its loops, barriers and routing read it there.
# Its own rank's only: the ranks' agreement (the record's hash covers the mask) is what tells a
# live rank that another was called with another mask.
MASK_BITS_PER_LINE = SYNC_SLOT_BYTES * 8


def mask_lines(world: int) -> int:
    """Lines of the mask of active ranks in a sync area of world ranks."""
    return -(-world // MASK_BITS_PER_LINE)


def mask_words(bits: int, world: int) -> list[int]:
    """The sync area's mask lines for a mask `bits` (bit r: rank r is live; -1: every rank) as
    int32 words (signed, as the area is read), bits from `world` on zero."""
    bits &= (1 << world) - 1
    words = [(bits >> (32 * i)) & 0xFFFFFFFF for i in range(mask_lines(world) * SYNC_SLOT_BYTES // 4)]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def sync_area_bytes(world: int) -> int:
    """Bytes of a communicator's sync area: (world + 4096 + 1 + 2 * 4 + 1 + ceil(world / 512)) * 64:
    256 KiB + 64 B per rank, the status line, two agreement records, the verdict line and the mask
    of active ranks."""
    return mask_offset(world) + mask_lines(world) * SYNC_SLOT_BYTES


def status_offset(world: int) -> int:
    """Byte offset of the status line in the sync area."""
    return (world + SYNC_SLOTS) * SYNC_SLOT_BYTES


def agree_offset(world: int, parity: int) -> int:
    """Byte offset in the sync area of the agreement record of the calls whose epoch has this
    parity (strata::AgreeRecord)."""
    return status_offset(world) + SYNC_SLOT_BYTES + parity * AGREE_RECORD_BYTES


def verdict_offset(world: int) -> int:
    """Byte offset in the sync area of the agreement verdict line (strata::AgreeVerdict)."""
    return agree_offset(world, 2)


def mask_offset(world: int) -> int:
    """Byte offset in the sync area of the mask of active ranks (strata::MaskBits)."""
    return verdict_offset(world) + SYNC_SLOT_BYTES


@dataclass(frozen=True)
class Arg:
    name: str
    ctype: str          # launcher (host) C type
    kernel_ctype: str   # kernel entry C type ("" when the argument is the launcher's own)
    role: str           # dtype | op | blocks | stream | sync | epoch | tensor | scratch | size | rank
    c: str = ""         # the parameter's name in C++ (c_param), when it is not `name`

    @property
    def c_name(self) -> str:
        return self.c or self.name


# ---- user names in C++
# A .strata name is not a C++ name: a tensor may be called `class`, `sync` or `x_`. Refusing such
# names would be a rule users cannot guess, and one that moves whenever a template changes, so
# codegen renames them instead, and only those that need it (the kernels of ordinary names read as
# written). A user name appears in C++ as itself (a parameter of Init, the kernel entry and the
# launcher, where the names below are in scope) and with `_` appended (a member, a loop variable).
# A name that could clash in either form becomes NAME_u; a name ending in k underscores becomes
# the name without them, then _u and k (`x_` -> `x_u1`), so that no two names meet and no renamed
# parameter ends in `_` like a member. The manifest, the Python API and every message keep the
# user's name.

# C++20's keywords and alternative tokens, and C's `restrict` (the cffi cdef of a launcher is C)
CPP_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
    co_return co_yield decltype default delete do double dynamic_cast else enum explicit export
    extern false float for friend goto if inline int long mutable namespace new noexcept not not_eq
    nullptr operator or or_eq private protected public register reinterpret_cast requires restrict
    return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq""".split())

# What the generated code (templates/*.j2, codegen/emit.py) and the macros it expands (GM_ADDR,
# STRATA_CPU_LAUNCH) name unqualified where a user's parameter is in scope, the stems of the
# members it declares (sync_, epoch_, mv_, rt_, pipe_, mask_, live_), and the C library's and GNU's macros in
# lower case. The locals of Process and the parameters of PartOffset are not here: user names
# appear there only with `_`. tests/codegen/test_names.py builds a kernel whose parameters are named
# after every identifier of the generated code, of runtime/'s headers and of their macros: a name a
# template starts to use without adding it here fails there.
GENERATED_NAMES = frozenset("""
    T OP GM_ADDR uint8_t int32_t int64_t uint32_t uint64_t half bfloat16_t sync epoch dtype op
    blocks stream mv rt pipe active mask live aclshmem_my_pe aclshmem_n_pes kTileBytes kCopyTiles kReduceTiles
    kScratchBytes kSdmaThreshold PartOffset PartLength strata strata_cpu AscendC
    KERNEL_TASK_TYPE_DEFAULT KERNEL_TYPE_MIX_AIV_1_0 STRATA_LAUNCH STRATA_GM
    STRATA_CPU_LAUNCH ACLRT_LAUNCH_KERNEL aclrtStream body
    math_errhandling errno linux unix""".split())

# the shapes of members (x_) and of renamed names (x_u, x_u1): a name kept as written never has them
_MEMBER_OR_RENAMED = re.compile(r".*(_|_u\d*)")


def _clashes(name: str) -> bool:
    return (name in CPP_KEYWORDS or name in GENERATED_NAMES or bool(_MEMBER_OR_RENAMED.fullmatch(name))
            # reserved to the compiler and its headers (__gm__, _Bool, ...)
            or name.startswith("__") or bool(re.match(r"_[A-Z]", name))
            # macros start with capitals (NULL, CHAR_BIT, M_PIf, and the toolkits' own)
            or bool(re.match(r"[A-Z][A-Z0-9_]", name)))


def _renamed(name: str) -> str:
    base = name.rstrip("_")
    k = len(name) - len(base)
    return f"{base}_u{k or ''}"


def c_name(name: str) -> str:
    """A user name as C++ writes it (members and loop variables add `_`)."""
    return _renamed(name) if _clashes(name) else name


def kernel_class(s: ir.Schedule) -> str:
    """The kernel's class, the schedule's name in CamelCase (allreduce_twoshot: AllreduceTwoshot);
    `Kernel` in front when that would not be a fresh C++ name (`_1x`, `ascend_c`)."""
    name = "".join(w.capitalize() for w in s.name.split("_"))
    return name if name[:1].isalpha() and name not in GENERATED_NAMES else f"Kernel{name}"


def c_param(s: ir.Schedule, name: str) -> str:
    """A user name as a parameter of the kernel entry and the launcher, where the schedule's own
    generated names (its class, kernels and launcher) are in scope too."""
    own = {kernel_class(s), launcher_name(s)}
    for d in dtypes(s):
        for op in ops(s):
            own |= {kernel_name(s, d, op), "aclrtlaunch_" + kernel_name(s, d, op)}
    return _renamed(name) if _clashes(name) or name in own else name


def launcher_name(s: ir.Schedule) -> str:
    return f"strata_launch_{s.name}"


OPS = (ir.ReduceOp.SUM, ir.ReduceOp.MAX, ir.ReduceOp.MIN)


def ops(s: ir.Schedule) -> list[ir.ReduceOp | None]:
    """The reductions a schedule is built for: all of them for a redop parameter."""
    return list(OPS) if s.op_param else [None]


def kernel_name(s: ir.Schedule, dtype: ir.DType, op: ir.ReduceOp | None = None) -> str:
    return f"{s.name}_{dtype.short}" + (f"_{op.value}" if op else "")


def dtypes(s: ir.Schedule) -> list[ir.DType]:
    """The element types a schedule is instantiated for: all of them for a type variable."""
    fixed = {p.dtype for p in s.params if p.dtype is not None}
    if s.contract.kind.moe:   # tokens are floating point; ids, counts and weights have fixed types
        if s.typevars:
            return [ir.DType.F32, ir.DType.F16, ir.DType.BF16]
        c = s.contract   # tokens of a fixed type (an int8 dispatch): that type alone
        return [s.param(c.inputs[0] if c.kind.dispatch else c.outputs[0]).dtype]
    if s.typevars:   # int8 is a payload to move, not a type to compute in: not a type variable's
        return [d for d in ir.DType if d is not ir.DType.I8]
    return sorted(fixed, key=lambda d: d.code) or [ir.DType.F32]


def args(s: ir.Schedule) -> list[Arg]:
    out = [
        Arg("dtype", "int32_t", "", "dtype"),
        Arg("op", "int32_t", "", "op"),
        Arg("blocks", "uint32_t", "", "blocks"),
        Arg("stream", "void*", "", "stream"),
        Arg("sync", "void*", "GM_ADDR", "sync"),
        Arg("epoch", "int32_t", "int32_t", "epoch"),
    ]
    out += [Arg(p.name, "void*", "GM_ADDR", "tensor", c_param(s, p.name)) for p in s.tensors]
    out += [Arg(p.name, "void*", "GM_ADDR", "scratch", c_param(s, p.name)) for p in s.scratch]
    out += [Arg(n, "uint64_t", "uint64_t", "size", c_param(s, n)) for n in s.sizes]
    out += [Arg(x.name, "int32_t", "int32_t", x.kind.value, c_param(s, x.name)) for x in s.int_params]
    return out


def kernel_args(s: ir.Schedule) -> list[Arg]:
    return [a for a in args(s) if a.kernel_ctype]


def c_prototype(s: ir.Schedule) -> str:
    params = ", ".join(f"{a.ctype} {a.c_name}" for a in args(s))
    return f'int {launcher_name(s)}({params})'


def cdef(s: ir.Schedule) -> str:
    return c_prototype(s) + ";"


# The CPU model's host API (runtime/cpu/include/strata_cpu.h), as cffi reads it.
RUNTIME_CDEF = """
int strata_cpu_init(int rank, int world, const char* shm_name, uint64_t heap_bytes, int create);
int strata_cpu_finalize(int unlink_segment);
int strata_cpu_current_pool(void);
int strata_cpu_select_pool(int id);
const char* strata_cpu_last_error(void);
void* strata_cpu_heap_base(void);
uint64_t strata_cpu_heap_bytes(void);
uint64_t strata_cpu_heap_used(void);
void strata_cpu_set_timeout(double seconds);
int strata_cpu_set_aiv_cores(int n);
void strata_cpu_reset_counters(void);
int strata_cpu_read_counters(uint64_t* out, int max_cores);
void strata_cpu_costs_enable(int on);
int strata_cpu_read_costs(double* out, int max_cores, double* launch);
int strata_cpu_aborted(void);
int strata_cpu_take_signal(void);
void strata_cpu_watch_signals(int on);
const char* strata_cpu_abort_message(void);
void strata_cpu_trace_enable(int on);
int strata_cpu_trace_write(const char* path);
int strata_cpu_dead_rank(void);
void strata_cpu_set_active_ranks(const uint64_t* words, int count);
void strata_cpu_leave(void);
void strata_cpu_describe_sync(const void* sync, int64_t barrier_slots, const char* layout);
void* aclshmem_malloc(size_t size);
void* aclshmem_calloc(size_t count, size_t size);
void* aclshmem_align(size_t alignment, size_t size);
void aclshmem_free(void* ptr);
"""

# The alignment of every symmetric allocation stratac makes, on the CPU model and on the NPU
# (aclshmem_align): the kernels assume it (64-byte signal lines in the sync area, 32-byte DMA blocks),
# and aclshmem_malloc guarantees only 16 bytes (SHMEM src/host/mem/shmem_mgr.cpp:241-245). As
# runtime/cpu/include/strata_cpu.h STRATA_HEAP_ALIGN.
HEAP_ALIGN = 512

# per core, in the order of strata_cpu.h's STRATA_CTR_*: bytes per engine, remote bytes, and the
# SDMA posts and the 1 MiB SQEs they were split into
COUNTERS = ("mte_in", "mte_out", "sdma", "remote_read", "remote_write", "sdma_posts", "sdma_sqes")
MAX_CORES = 64
# per core, in the order of strata_cpu.h's STRATA_COST_* (strata_cpu_read_costs): the core's start,
# its kernel's start (after the UB refill) and end (CLOCK_MONOTONIC s), its exclusive seconds per
# activity, its SDMA engine's copy seconds, the SQE cost charged (s), UB bytes refilled, D-cache calls
COSTS = ("start", "kernel", "end", "flag_wait", "syncall", "quiet", "sqe", "mte_in", "mte_out",
         "sdma_by_core", "dcache", "ledger", "sdma_engine", "sqe_charged", "ub_refill_bytes", "dcache_ops")
# the launch's own slots (STRATA_LCOST_*)
LAUNCH_COSTS = ("enter", "dispatch", "exit", "threads", "blocks", "sqe_us")
