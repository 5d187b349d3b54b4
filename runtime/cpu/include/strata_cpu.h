// The CPU model's own interface: what the device library, the generated launchers and the Python
// loader need from the model beyond the Ascend C / SHMEM API it imitates.
#ifndef STRATA_CPU_H
#define STRATA_CPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- Host C API (loaded from Python with cffi; the cdef is stratac/codegen/abi.py: RUNTIME_CDEF) ----

// Counter slots per core, in this order. SDMA_POSTS counts aclshmemx_sdma_put_nbi/get_nbi calls
// that moved bytes, SDMA_SQES the 1 MiB descriptors (SQEs) they were split into.
enum { STRATA_CTR_MTE_IN = 0, STRATA_CTR_MTE_OUT = 1, STRATA_CTR_SDMA = 2,
       STRATA_CTR_REMOTE_READ = 3, STRATA_CTR_REMOTE_WRITE = 4, STRATA_CTR_SDMA_POSTS = 5,
       STRATA_CTR_SDMA_SQES = 6, STRATA_NUM_CTRS = 7 };
// Cost slots per core of the last launch (strata_cpu_read_costs), seconds unless named otherwise.
// START/KERNEL/END are CLOCK_MONOTONIC times: the core entered (before its UB refill), its kernel
// began (after the refill), it returned. The next slots are the core's exclusive time in each
// activity (a nested one is not counted twice: the SQE cost of a quiet counts as SQE, a copy a
// wait runs itself as SDMA_BY_CORE): flag waits, SyncAll, SDMA quiets, the modelled SQE cost
// (the spin), MTE2 (GM->UB) and MTE3 (UB->GM) copies, SDMA copies run by the core's own waits,
// the scalar D-cache (GetValue/SetValue/DataCacheCleanAndInvalid), the SDMA ledger's checks.
// SDMA_ENGINE: the time this core's copy engine thread spent copying (beside the core, not in
// its time). SQE_CHARGED: what the model was told to charge (sdma_sqe_us x SQEs, quiets
// included). UB_REFILL_BYTES, DCACHE_OPS: the bytes refilled with 0xff, the scalar cache calls.
enum { STRATA_COST_START = 0, STRATA_COST_KERNEL = 1, STRATA_COST_END = 2, STRATA_COST_FLAG_WAIT = 3,
       STRATA_COST_SYNCALL = 4, STRATA_COST_QUIET = 5, STRATA_COST_SQE = 6, STRATA_COST_MTE_IN = 7,
       STRATA_COST_MTE_OUT = 8, STRATA_COST_SDMA_BY_CORE = 9, STRATA_COST_DCACHE = 10,
       STRATA_COST_LEDGER = 11, STRATA_COST_SDMA_ENGINE = 12, STRATA_COST_SQE_CHARGED = 13,
       STRATA_COST_UB_REFILL_BYTES = 14, STRATA_COST_DCACHE_OPS = 15, STRATA_NUM_COSTS = 16 };
// The last launch as a whole (strata_cpu_read_costs' `launch`): LaunchBlocks entered, its cores
// handed out (workers notified), LaunchBlocks returning (CLOCK_MONOTONIC), threads T, blocks, and
// the SQE cost it charged per SQE (us: STRATA_CPU_SDMA_SQE_US or the model's default).
enum { STRATA_LCOST_ENTER = 0, STRATA_LCOST_DISPATCH = 1, STRATA_LCOST_EXIT = 2, STRATA_LCOST_THREADS = 3,
       STRATA_LCOST_BLOCKS = 4, STRATA_LCOST_SQE_US = 5, STRATA_NUM_LCOSTS = 6 };
// STRATA_MAX_CORES sizes the model's per-core tables; a launch may use at most the SoC's vector
// core count (strata_cpu_set_aiv_cores, default STRATA_SOC_MAX_AIV = 48, the largest A2/A3 count).
enum { STRATA_MAX_CORES = 64, STRATA_SDMA_MAX_CORE = 48, STRATA_SOC_MAX_AIV = 48 };
// SDMA queue model (runtime/README.md, "SDMA"): a post is split into SQEs of at most
// STRATA_SDMA_SQE_BYTES (SHMEM shmem_device_sdma.hpp:339-401); a core's queue holds at most
// STRATA_SDMA_SQ_DEPTH SQEs between quiets (the real sq_depth is not in SHMEM's source: this is a
// conservative model value, UNVERIFIED). A quiet adds one flag SQE.
enum { STRATA_SDMA_SQE_BYTES = 1 << 20, STRATA_SDMA_SQ_DEPTH = 256 };

// Map the pool. `create` = 1 on exactly one process (it creates the segment with mode 0600 and
// fails if the name exists); the others open it after the creator returned, and refuse a segment
// that is not owned by this user with mode 0600. heap_bytes is per rank. The rank's pid is
// recorded in the pool's header so that peers can tell when its process dies. A process may map
// several pools (one per communicator, each its own segment); the new one becomes the current pool,
// which every other call of this API and every launch works on.
int strata_cpu_init(int rank, int world, const char* shm_name, uint64_t heap_bytes, int create);
// The current pool's id (> 0; 0 when none is), and making another mapped pool current. Refused
// from inside a kernel; waits for a launch of another thread to end.
int strata_cpu_current_pool(void);
int strata_cpu_select_pool(int id);
// Unmap the current pool (afterwards none is current); `unlink` = 1 removes the segment name (call
// on one rank, after every rank is done). The rank is marked as having left the pool: its exit is
// then not a death.
int strata_cpu_finalize(int unlink_segment);
// Marks this rank as having left the pool without unmapping it (for an exit without finalize).
void strata_cpu_leave(void);
// The lowest rank whose process died (killed, crashed: gone, a zombie, or its pid reused) without
// leaving the pool, or -1. When one is found, strata_cpu_last_error() says which and how.
// Waits (kernel flag waits and the host barrier) check this every 50 ms and fail with that text.
int strata_cpu_dead_rank(void);
// The live ranks of the following launches (bit r % 64 of words[r / 64] = rank r; ranks of words
// past `count` are live): a kernel wait stops early for a dead rank only when that rank is live.
// Masked MoE calls set it (docs/robustness.md, "Masked ranks"); every rank by default.
void strata_cpu_set_active_ranks(const uint64_t* words, int count);
// Names the sync area of the launches to come, for wait-timeout messages: `sync` is this rank's
// flag area, an array of slots of one 64-byte line each (the int32 flag at the start of its line);
// slots [0, barrier_slots) are barrier slots (slot p: rank p), then `layout` lists the named flags
// as "name base size;..." in slots from the start of the area.
void strata_cpu_describe_sync(const void* sync, int64_t barrier_slots, const char* layout);
const char* strata_cpu_last_error(void);

void* strata_cpu_heap_base(void);        // this rank's heap instance
uint64_t strata_cpu_heap_bytes(void);    // capacity per rank
uint64_t strata_cpu_heap_used(void);     // bytes handed out by aclshmem_malloc and not freed

void strata_cpu_set_timeout(double seconds);   // deadline of every wait in later launches
// The SoC's vector (AIV) core count: later launches of more blocks fail (SyncAll hangs on the NPU
// when numBlocks exceeds the physical AIV count). n in [1, STRATA_SOC_MAX_AIV]; default 48.
int strata_cpu_set_aiv_cores(int n);
void strata_cpu_reset_counters(void);
// Copies counters into out[core * STRATA_NUM_CTRS + ctr] for cores [0, max_cores); returns the
// highest core count launched since the last reset.
int strata_cpu_read_counters(uint64_t* out, int max_cores);
// Cost accounting (the STRATA_COST_* slots above): while on, every launch records per core where
// its time went, with two clock reads per accounted call (off by default). read_costs copies the
// last launch's: out[core * STRATA_NUM_COSTS + slot] for cores [0, max_cores) and, if `launch` is
// not null, its STRATA_NUM_LCOSTS slots; returns the last launch's core count (0: none recorded).
void strata_cpu_costs_enable(int on);
int strata_cpu_read_costs(double* out, int max_cores, double* launch);

// Abort state of the pool: nonzero once any rank failed; its message is returned by
// strata_cpu_abort_message().
int strata_cpu_aborted(void);
// SIGINT and SIGTERM: while watched (on = 1; on = 0 puts the replaced handlers back; idempotent,
// and a signal the process ignores is not watched), a signal during a launch makes its waits fail at
// their next poll (the pool is aborted), and goes on to the handler it would have reached
// (Python's); one whose action is the default (SIGTERM, unless the host set a handler) is held back
// instead, so that the process does not die inside the launch. Outside a launch the signal goes on
// unchanged (the default action included). Call watch again after the host set another handler.
void strata_cpu_watch_signals(int on);
// The held-back signal of the last launch, once (0 if none), for the host to end the process cleanly.
int strata_cpu_take_signal(void);
// Trace: while enabled, every core's kernel, stages (strata: lines), flag waits, SyncAll and SDMA
// quiets, and every SDMA copy are recorded as spans (CLOCK_MONOTONIC). trace_write appends them to
// `path` as Chrome trace events, one JSON object per line (pid = rank; tid = core, or 1000 + core
// for that core's SDMA queue), and forgets them.
void strata_cpu_trace_enable(int on);
int strata_cpu_trace_write(const char* path);
const char* strata_cpu_abort_message(void);

// Host barrier over the pool's ranks (all `world` processes must call it the same number of times).
// Honours the pool abort flag, dead peers and the timeout (whose message lists the ranks that have
// not arrived; a timeout or a dead peer aborts the pool); returns 0, or -1 with the last error set.
int strata_cpu_barrier(void);

// Symmetric allocation (SHMEM host API names). Every rank must make the same calls in the same
// order; the allocator is deterministic so equal calls give equal offsets. aclshmem_malloc and
// aclshmem_calloc align to 16 bytes only, as SHMEM's do (src/host/mem/shmem_mgr.cpp:241-245);
// aclshmem_align(alignment, size) to `alignment` (a power of two <= 512), reserving size rounded up
// to it. stratac allocates everything with aclshmem_align(512, ...) (STRATA_HEAP_ALIGN).
// Returns NULL (and sets the last error with the request and the free bytes) when exhausted.
enum { STRATA_HEAP_ALIGN = 512 };
void* aclshmem_malloc(size_t size);
void* aclshmem_calloc(size_t count, size_t size);
void* aclshmem_align(size_t alignment, size_t size);
void aclshmem_free(void* ptr);

#ifdef __cplusplus
}  // extern "C"

// ---- C++ interface used by generated launchers and the device library ----
namespace strata_cpu {

using BlockFn = void (*)(void* ctx);

// Runs fn(ctx) on `blocks` threads with GetBlockIdx() = 0..blocks-1, one UB arena and one SDMA
// queue per thread, and waits until every core has returned. The threads persist: a process keeps
// one per core (as many as its widest launch, at most STRATA_MAX_CORES) and one SDMA engine per
// core that has posted a copy, reused by later launches, joined by strata_cpu_finalize and at exit.
// Launches from several host threads run one after another. Returns 0, or -1 with the last error
// set (the first failure of any core). `kernel_name` appears in error messages.
int LaunchBlocks(uint32_t blocks, const char* kernel_name, BlockFn fn, void* ctx);

// The `.strata` source line of the statement the calling core executes (shown in failures).
void SetLine(int line);

// Stops the calling core with a rule violation: formats the message, prefixes it with
// "rank R core C strata:LINE kernel K: ", records it (first failure wins), marks the pool aborted
// and unwinds the core's thread. Never returns.
[[noreturn]] void Fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- Hooks for kernel_operator.h and shmem.h (the model's device side; not for launchers) ----
// All state they touch lives in the library: the calling thread's core (block index, UB arena,
// kernel type, atomic mode, events, SDMA queue) and the process's pool.
constexpr uint32_t kUbBytes = 196608;   // Unified Buffer per vector core
// A vector core's scalar data cache line (DataCacheCleanAndInvalid SINGLE_CACHE_LINE; SHMEM's
// ACLSHMEM_SYNCBIT_SIZE pads each signal to one line). Signals must be line-aligned.
constexpr uint64_t kCacheLineBytes = 64;

// Element type codes (for DMA atomics and messages).
enum DType : int { kDtOther = 0, kDtF32, kDtF16, kDtBF16, kDtI32, kDtI16, kDtI8, kDtU32, kDtU16,
                   kDtU8, kDtI64, kDtU64, kDtF64 };
enum AtomicOp : int { kAtomicNone = 0, kAtomicAdd = 1, kAtomicMax = 2, kAtomicMin = 3 };

int64_t BlockIdx();
int64_t BlockNum();
void DeclareKernelType(int type);       // KERNEL_TASK_TYPE_DEFAULT
uint8_t* UbBase();                      // the calling core's UB arena (kUbBytes bytes)
uint8_t* UbCarve(uint64_t end);         // the same, for buffers within [0, end) of it (TPipe)
void UbWrote(const void* p, uint64_t bytes);   // bytes from p of the calling core's UB may not be 0xff
                                               // any more: the next launch refills them
int64_t UbOffset(const void* p);        // offset of p in the calling core's arena, or -1
[[noreturn]] void FailUb(const char* op, const char* role, const void* p, uint64_t bytes,
                         uint64_t cap_bytes);
void CheckGm(const void* p, uint64_t bytes, const char* op);   // inside the pool's heaps
void CheckAbort(const char* op);        // unwinds if this launch failed or the pool aborted
// One DMA each (MTE2 / MTE3): pool check, counters, and for UB->GM the atomic mode (`dtype` is
// the element type of the copy).
void CopyGmToUb(void* ub, const void* gm, uint64_t bytes, const char* op);
void CopyUbToGm(void* gm, const void* ub, uint64_t bytes, int dtype, const char* op);
void SetAtomicMode(int op, int dtype, const char* api);
// Event flags are binary, per core, ids [0, 8) (SetFlag/WaitFlag doc, A2/A3). An id is free,
// held by AllocEventID (until ReleaseEventID) or held by a TQue (an EnQue'd or freed buffer).
void EventSet(int event, int id, const char* api);
void EventWait(int event, int id, const char* api);
int EventFetch(int event);                       // a free id whose flag is clear; not taken
int EventAlloc(int event, bool by_queue, const char* api);   // takes a free id whose flag is clear
void EventRelease(int event, int id, bool by_queue, const char* api);
void* CurrentPipe();
void SetCurrentPipe(void* pipe);
void SyncAllCores(bool aiv_only);
void Fence();
void PollHint(const char* op);          // fence + abort check + occasional yield (DCCI)
// The core's scalar data cache (GlobalTensor::GetValue/SetValue; runtime/cpu/src/dcache.cpp: g_dcache): a load of a
// cached line whose memory changed since it was cached fails (stale read); a store marks the line
// dirty and fails when another core of the rank scalar-wrote the line in this launch;
// DataCacheCleanInvalidate writes back and forgets the line of p (or every line: `entire`), and
// fails when a dirty line's other bytes changed in memory (lost write).
void ScalarLoad(const void* p, void* out, uint64_t bytes, const char* op);
void ScalarStore(void* p, const void* in, uint64_t bytes, const char* op);
void DataCacheCleanInvalidate(const void* p, bool entire, const char* op);

// SHMEM device side.
int MyPe();
int NPes();
void* PeerPtr(const void* local_sym, int pe, const char* op);
void SignalOp(int32_t* sig_addr, int32_t signal, int sig_op, int pe);
int32_t SignalWaitUntil(int32_t* sig_addr, int cmp, int32_t value);
// STRATA_WAIT_NOTE (strata_device.h, CPU model only): the calling core's next SignalWaitUntil is
// on slot `index` of `count` sync slots (int32 flags kCacheLineBytes apart) from `group`, which
// are `what` ("barrier": slot p is rank p's arrival). A timeout then names the slot and lists the
// slots still below the stamp.
void NoteWait(const char* what, const int32_t* group, int64_t count, int64_t index);
// STRATA_SYNC_TRAFFIC (strata_device.h, CPU model only): the calling core's DMAs until the next
// SyncTraffic(false) are the ranks' agreement on the call (strata::Agree), left out of the counters.
void SyncTraffic(bool on);
// put: dst local symmetric (translated to pe), src any pool address; get: src local symmetric
// (translated to pe), dst any pool address.
void SdmaPost(bool put, void* dst, const void* src, uint64_t bytes, const void* ub_buf,
              uint32_t ub_size, int pe, const char* op);
void SdmaQuiet(const void* ub_buf, uint32_t ub_size, const char* op);
// aclshmemx_set_mte_config: the calling core's UB staging region of SHMEM's default-config MTE
// APIs (default {0, 16 KiB}, reset at every launch).
void SetMteUb(uint64_t offset, uint32_t bytes);
void GetMteUb(uint64_t* offset, uint32_t* bytes);

}  // namespace strata_cpu

// Launch a kernel `k(args...)` on `blocks` cores from a launcher; evaluates to 0 or -1.
#define STRATA_CPU_LAUNCH(k, blocks, ...)                                                    \
  ([&]() -> int {                                                                          \
    auto body = [&]() { k(__VA_ARGS__); };                                                 \
    using Body = decltype(body);                                                           \
    return ::strata_cpu::LaunchBlocks(                                                     \
        (blocks), #k, [](void* c) { (*static_cast<Body*>(c))(); }, &body);                 \
  }())

#endif  // __cplusplus
#endif  // STRATA_CPU_H
