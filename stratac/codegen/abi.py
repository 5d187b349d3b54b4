"""The one description of the kernel ABI. The launcher's C signature (templates/launch.cpp.j2), the
kernel entry's parameter list, the cffi cdef and manifest.json are all derived from it.

Launcher:  int strata_launch_<schedule>(int32_t dtype, int32_t op, uint32_t blocks, void* stream,
                                         uint64_t ffts, void* sync, int32_t epoch,
                                         void* <tensor>..., void* <scratch>..., uint64_t <size>...,
                                         int32_t <rank parameter>...)
Kernel:    one entry per element type (and reduction, for a schedule with a redop parameter),
           <schedule>_<dtype>[_<op>](ffts, sync, epoch, tensors..., scratch..., sizes..., ranks...).
`dtype` is ir.DType.code, `op` the index in OPS (ignored without a redop parameter); `sync` is the
symmetric flag area; `epoch` the call's first flag stamp.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratac import ir


@dataclass(frozen=True)
class Arg:
    name: str
    ctype: str          # launcher (host) C type
    kernel_ctype: str   # kernel entry C type ("" when the argument is the launcher's own)
    role: str           # dtype | blocks | stream | ffts | sync | epoch | tensor | size


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
        return [ir.DType.F32, ir.DType.F16, ir.DType.BF16]
    if s.typevars:
        return list(ir.DType)
    return sorted(fixed, key=lambda d: d.code) or [ir.DType.F32]


def args(s: ir.Schedule) -> list[Arg]:
    out = [
        Arg("dtype", "int32_t", "", "dtype"),
        Arg("op", "int32_t", "", "op"),
        Arg("blocks", "uint32_t", "", "blocks"),
        Arg("stream", "void*", "", "stream"),
        Arg("ffts", "uint64_t", "uint64_t", "ffts"),
        Arg("sync", "void*", "GM_ADDR", "sync"),
        Arg("epoch", "int32_t", "int32_t", "epoch"),
    ]
    out += [Arg(p.name, "void*", "GM_ADDR", "tensor") for p in s.tensors]
    out += [Arg(p.name, "void*", "GM_ADDR", "scratch") for p in s.scratch]
    out += [Arg(n, "uint64_t", "uint64_t", "size") for n in s.sizes]
    out += [Arg(x.name, "int32_t", "int32_t", "rank") for x in s.rank_params]
    return out


def kernel_args(s: ir.Schedule) -> list[Arg]:
    return [a for a in args(s) if a.kernel_ctype]


def c_prototype(s: ir.Schedule) -> str:
    params = ", ".join(f"{a.ctype} {a.name}" for a in args(s))
    return f'int {launcher_name(s)}({params})'


def cdef(s: ir.Schedule) -> str:
    return c_prototype(s) + ";"


# The CPU model's host API (runtime/cpu/include/strata_cpu.h), as cffi reads it.
RUNTIME_CDEF = """
int strata_cpu_init(int rank, int world, const char* shm_name, uint64_t heap_bytes, int create);
int strata_cpu_finalize(int unlink_segment);
const char* strata_cpu_last_error(void);
void* strata_cpu_heap_base(void);
uint64_t strata_cpu_heap_bytes(void);
uint64_t strata_cpu_heap_used(void);
void strata_cpu_set_timeout(double seconds);
void strata_cpu_reset_counters(void);
int strata_cpu_read_counters(uint64_t* out, int max_cores);
int strata_cpu_aborted(void);
const char* strata_cpu_abort_message(void);
void strata_cpu_trace_enable(int on);
int strata_cpu_trace_write(const char* path);
int strata_cpu_dead_rank(void);
void strata_cpu_leave(void);
void strata_cpu_describe_sync(const void* sync, int64_t barrier_slots, const char* layout);
void* aclshmem_malloc(size_t size);
void* aclshmem_calloc(size_t count, size_t size);
void aclshmem_free(void* ptr);
"""

COUNTERS = ("mte_in", "mte_out", "sdma", "remote_read", "remote_write")
MAX_CORES = 64
