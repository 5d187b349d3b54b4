// The CPU model's shared state and internal declarations, included by every runtime/cpu/src/*.cpp
// (and by nothing else: kernels see only strata_cpu.h, kernel_operator.h and shmem.h). It holds
// what more than one file of the model uses: the pool's layout (ranks are processes sharing one
// POSIX shared-memory pool: header page + `world` heaps), the launch and per-core state (vector
// cores as fibers on CPU-many threads, each with a 192 KiB UB arena, a D-cache and an SDMA
// engine), the idler every wait parks in, and the functions one file calls in another. Rule
// violations stop the core (FailStr), mark the pool aborted and unwind the other cores.
// Everything declared here is hidden (not exported from libstratacpu.so), as the single file's
// anonymous namespace kept it; the exported API is strata_cpu.h's, defined with STRATA_EXPORT.
// Build (from the repository root):
//   g++ -std=c++17 -O2 -fPIC -shared runtime/cpu/src/*.cpp -Iruntime/cpu/include
//       -o libstratacpu.so -pthread -lrt
#ifndef STRATA_MODEL_INTERNAL_H
#define STRATA_MODEL_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata_cpu.h"

// Exported, but bound inside the library ("protected"): the model's own calls to its exported
// functions (aclshmem_calloc -> aclshmem_malloc, SignalOp -> PeerPtr, ...) never go to another copy
// of the model that an earlier dlopen(RTLD_GLOBAL) put first in the symbol search order.
#define STRATA_EXPORT __attribute__((visibility("protected")))

#pragma GCC visibility push(hidden)

namespace strata_cpu {

// ---------------------------------------------------------------------------------------------
// Pool (shared by the ranks; pool.cpp)

constexpr uint64_t kMagic = 0x53545241544131ULL;  // "STRATA1"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kHeaderBytes = 128 << 10;
constexpr uint64_t kAlign = 512;
constexpr int kMaxWorld = 4096;
// A mask of kMaxWorld ranks, every one live (Pool::active).
inline std::atomic<uint64_t>* AllRanks() {
  auto* words = new std::atomic<uint64_t>[kMaxWorld / 64];
  for (int i = 0; i < kMaxWorld / 64; ++i) words[i].store(~0ull);
  return words;
}

// One per rank: who maps the pool, so that waiting ranks can tell a dead peer from a slow one.
enum RankState : int32_t { kRankAbsent = 0, kRankJoined = 1, kRankLeft = 2 };
struct RankSlot {
  int32_t state;        // RankState
  int32_t pid;          // of the process that joined as this rank
  uint64_t start;       // its start time (/proc/<pid>/stat field 22): a reused pid is not the rank
  int32_t barriers;     // host barriers this rank has entered
  int32_t pad;
};

struct PoolHeader {
  uint64_t magic;  // written last by the creator
  uint32_t version;
  int32_t world;
  uint64_t heap_bytes;
  uint64_t pool_bytes;
  int32_t abort_state;  // 0 none, 1 being written, 2 message complete
  int32_t abort_rank;
  int32_t bar_count;    // host barrier
  int32_t bar_gen;
  char abort_msg[3072];
  // Wake-ups (Notify / Idler): bumped by every model write a waiter may wait for; a thread with
  // nothing to run sleeps on it (futex, shared between the ranks) after setting wake_sleepers.
  alignas(64) uint32_t wake_epoch;
  uint32_t wake_sleepers;
  alignas(64) RankSlot ranks[kMaxWorld];
};
static_assert(sizeof(PoolHeader) <= kHeaderBytes, "header pages");

// The sync area of the launches to come (strata_cpu_describe_sync), to name flags in messages.
struct SyncFlag {
  std::string name;
  int64_t base, size;  // sync slots (one 64-byte line each) from the start of the sync area
};
struct SyncLayout {
  const uint8_t* sync = nullptr;
  int64_t barrier_slots = 0;
  std::vector<SyncFlag> flags;
};

// One mapped pool and everything the model keeps of it in this process. A process may hold several
// pools at once (one per communicator: a torch.distributed group, a MoE Buffer); each has its own
// segment, heaps, allocator, sync area, liveness and settings, and they share the cores, SDMA
// engines, counters and trace. One pool is current (CurPool(); strata_cpu_select_pool makes another
// current between launches): every model call, and every launch, works on the current one.
struct Pool {
  int id = 0;                // strata_cpu_current_pool; 0 = no pool
  bool inited = false;
  int rank = -1, world = 0;
  std::string name;
  uint8_t* base = nullptr;
  uint64_t total = 0;
  PoolHeader* hdr = nullptr;
  uint8_t* heaps = nullptr;  // heap r at heaps + r * heap_bytes
  uint64_t heap_bytes = 0;
  // the symmetric allocator's books (alloc.cpp; under g_alloc_mu): offset -> size
  std::map<uint64_t, uint64_t> free_blocks, used_blocks;
  uint64_t used_bytes = 0;
  // liveness of the ranks (liveness.cpp; under g_live_mu)
  double live_next = 0;
  std::vector<std::string> live_why;  // per rank: why it is dead ("" while not known dead)
  int one_group = -1;                 // -1 not known yet, 0 no, 1 yes (OneSchedGroup)
  // The live ranks of the launches from now on (strata_cpu_set_active_ranks; bit r % 64 of word
  // r / 64 = rank r; all ones until set): a kernel wait stops for a dead rank only when that rank
  // is live. A masked call (docs/robustness.md, "Masked ranks") neither signals nor waits for a
  // masked rank, so a dead masked rank cannot be what a wait of it waits for.
  std::unique_ptr<std::atomic<uint64_t>[]> active{AllRanks()};
  // per rank: the newest signal number seen of it (ledger.cpp)
  std::unique_ptr<std::atomic<int32_t>[]> seen{new std::atomic<int32_t>[kMaxWorld]};
  // the settings of this pool's launches (trace.cpp: strata_cpu_set_timeout, _set_aiv_cores)
  std::atomic<double> timeout{60.0};
  std::atomic<int> aiv_cores{STRATA_SOC_MAX_AIV};
  SyncLayout sync;  // under g_sync_mu (shmem.cpp)
};
// The current pool (pool.cpp); a pool with inited == false while there is none.
extern Pool* g_cur;
inline Pool& CurPool() { return *g_cur; }

inline uint8_t* HeapOf(int r) { return CurPool().heaps + uint64_t(r) * CurPool().heap_bytes; }
inline uint8_t* HeapsEnd() { return CurPool().heaps + uint64_t(CurPool().world) * CurPool().heap_bytes; }
// Rank whose heap holds p, or -1.
inline int OwnerOf(const void* p) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (!CurPool().inited || b < CurPool().heaps || b >= HeapsEnd()) return -1;
  return static_cast<int>((b - CurPool().heaps) / CurPool().heap_bytes);
}

void SetLastError(const std::string& s);
std::string Format(const char* fmt, va_list ap);
std::string Sprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
int Error(const std::string& s);
double Now();

int32_t AbortState();
// Marks the pool aborted; the first caller's rank and message win.
void PoolAbort(int rank, const std::string& msg);
// Waits (briefly) for the abort message to be complete.
void ReadAbort(int* rank, std::string* msg);

// ---------------------------------------------------------------------------------------------
// Wake-ups and the idler (waits.cpp)

long Futex(uint32_t* addr, int op, uint32_t val, const timespec* ts);
// Something a waiter may wait for happened (a GM write by a core, a signal, an SDMA copy done, a
// SyncAll completed, a core returned, a failure or abort, a host barrier): wakes the threads of
// every rank that sleep in Idler::Idle. Costs an atomic add; a futex wake only when one sleeps.
void Notify();

// A thread with nothing to run until something happens (a wait of its only core, every core of
// the thread waiting, the host barrier). The caller re-checks its condition between calls. First
// it yields the CPU for `spin` (100 us, STRATA_CPU_SPIN_US; a peer that is about to write costs no
// sleep), then it sleeps
// until the next Notify: it sets wake_sleepers and reads the epoch (Idle returns so that the caller
// re-checks once more), then futex-waits while the epoch is unchanged, at most kSleepCapNs (host
// writes to the heap, bulk copies and dead peers do not notify; those are seen within the cap).
// Core waits spin only when every core of every rank has a CPU (launch cores <= threads and
// world x threads <= CPUs): otherwise the yielding threads take the CPUs from the ranks, cores and
// SDMA engines they wait for (measured: a 4 KiB one-shot on 4 ranks, 2 CPUs, took 1.3 ms with the
// spin and 0.13 ms without, with every rank in a session of its own, see OneSchedGroup; two-shot
// on 2 ranks 17 us with it and 55-65 without). Oversubscribed waits: OversubSpinSec.
double SpinSec();
constexpr long kSleepCapNs = 2000000;
constexpr uint64_t kNotifyCopyBytes = 512;  // UB->GM copies up to this size notify (flags, counts)
// A sched_yield that returns after more than kYieldLostSec gave the CPU to another runnable
// thread (of this machine's other processes, or ranks and engines beyond the CPUs): spinning
// then delays the very thread it waits for by a time slice, while a futex sleeper is woken (and
// scheduled) when its event comes. So after such a yield, waits do not spin for kSpinOffSec.
constexpr double kYieldLostSec = 20e-6, kSpinOffSec = 0.05;
extern std::atomic<double> g_spin_off_until;
// Oversubscribed waits (world x threads > CPUs): a core alone on its thread may yield the CPU for
// up to STRATA_CPU_OVERSUB_SPIN_US before it sleeps, as Open MPI polls with sched_yield when
// oversubscribed. Default 0, sleep at once: on this 2-CPU VM under other sessions' load (5-8) a
// 300 us or 2 ms yield phase did not beat the immediate sleep at 4 KiB on 4 ranks, and a pure
// yield loop had a tail of milliseconds (docs/bench.md, "4 KiB on 4 ranks"). A yield lets a peer
// rank run only when both are in one scheduling group: see OneSchedGroup.
double OversubSpinSec();
struct Idler {
  double spin = SpinSec();  // how long to yield before sleeping
  bool oversub = false;     // yields are expected to lose the CPU (to the peer ranks): no kYieldLostSec
  double spin_until = 0;
  bool armed = false;
  uint32_t epoch = 0;
  void Busy() {
    spin_until = 0;
    armed = false;
  }
  void Idle() {
    PoolHeader* h = CurPool().hdr;
    if (!h || spin_until == 0 || Now() < spin_until) {
      double t0 = Now();
      if (spin_until == 0) {
        // a recent yield lost the CPU for long: other processes want the CPUs, sleep at once
        spin_until = t0 + (!oversub && t0 < g_spin_off_until.load(std::memory_order_relaxed) ? 0.0 : spin);
      }
      sched_yield();
      if (spin > 0 && !oversub && Now() - t0 > kYieldLostSec) {
        g_spin_off_until.store(Now() + kSpinOffSec, std::memory_order_relaxed);
        spin_until = t0;
      }
      return;
    }
    if (!armed) {
      __atomic_store_n(&h->wake_sleepers, 1, __ATOMIC_SEQ_CST);
      epoch = __atomic_load_n(&h->wake_epoch, __ATOMIC_SEQ_CST);
      armed = true;
      return;
    }
    timespec ts{0, kSleepCapNs};
    Futex(&h->wake_epoch, FUTEX_WAIT, epoch, &ts);
    armed = false;
  }
};

// ---------------------------------------------------------------------------------------------
// Symmetric allocator (alloc.cpp)

extern std::mutex g_alloc_mu;

// ---------------------------------------------------------------------------------------------
// Counters, timeout (trace.cpp)

struct alignas(64) CoreCounters {  // one cache line per core: cores count without false sharing
  std::atomic<uint64_t> v[STRATA_NUM_CTRS];
};
extern CoreCounters g_ctr[STRATA_MAX_CORES];
extern std::atomic<int> g_max_cores;

inline void Count(int core, int ctr, uint64_t n) {
  g_ctr[core].v[ctr].fetch_add(n, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Trace (strata_cpu_trace_*): spans on CLOCK_MONOTONIC, recorded only while enabled. Track (tid)
// = core index for a core's kernel, stages (strata: lines), waits and quiets; kSdmaTid + core for
// the copies of that core's SDMA queue.

constexpr int kSdmaTid = 1000;

extern std::atomic<bool> g_trace;

inline bool Tracing() { return g_trace.load(std::memory_order_relaxed); }

void TraceAdd(int tid, double t0, double t1, std::string name, const char* cat, std::string args = "");

// ---------------------------------------------------------------------------------------------
// Liveness of the pool's ranks (liveness.cpp)

constexpr double kPeerCheckSec = 0.05;

uint64_t SelfStart();
// The lowest rank whose process died without leaving the pool, or -1 (why: what happened); with
// `masked`, only ranks live in the active mask count. Scans at most every kPeerCheckSec per
// process; callers in between get the last answer. A rank found dead stays dead.
int DeadRank(std::string* why, bool force = false, bool masked = false);
bool OneSchedGroup();

// ---------------------------------------------------------------------------------------------
// Launches and cores (launch.cpp; the SDMA engine: sdma.cpp)

struct CoreUnwind {};  // unwinds a core's thread; deliberately not a std::exception

struct SdmaJob {
  void* dst;
  const void* src;
  uint64_t bytes;
  int core;
  double due;  // Now() before which the copy does not land (0: at once); see Mix64
  bool wake;   // the engine thread is woken for it (see SdmaPost)
  bool stream;  // a post larger than StreamBytes(): copied with non-temporal stores (StreamCopy)
};

// Posts of at least this many bytes are copied around the CPU caches (sdma.cpp).
uint64_t StreamBytes();

// Moves a job's bytes, timed for the cost accounting (as the engine's or the running core's) (sdma.cpp).
void SdmaCopyBytes(const SdmaJob& job);

// One core's SDMA queue: a persistent copy engine thread, started the first time the core posts a
// copy and reused by later launches (see WorkerPool). At the end of every launch the queue is
// emptied and the copy in progress (if any) finishes, so no copy outlives its launch.
struct SdmaEngine {
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<SdmaJob> queue;
  uint64_t posted = 0, done = 0;
  bool busy = false;  // a copy is in progress (popped, not yet done)
  bool notifying = false;  // a copy is done and its waiters are being woken (Notify, pool header)
  bool stop = false;
  std::thread worker;

  // Copies the job at the head of the queue (the caller holds lk, the engine is not busy); returns
  // with lk held. The queue is served in order, one copy at a time, by whoever takes its head: the
  // engine thread, or the core's quiet (TakeOne), so two copies of one queue never overlap.
  void CopyHead(std::unique_lock<std::mutex>& lk, bool quiet) {
    SdmaJob job = queue.front();
    queue.pop_front();
    busy = true;
    lk.unlock();
    double t0 = Tracing() ? Now() : 0;
    if (job.due > 0) {
      const double left = job.due - Now();
      if (left > 0) usleep(useconds_t(left * 1e6) + 1);
    }
    SdmaCopyBytes(job);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (t0 > 0)
      TraceAdd(kSdmaTid + job.core, t0, Now(), quiet ? "sdma copy (run by the quiet)" : "sdma copy", "sdma",
               Sprintf("\"bytes\": %llu, \"from_rank\": %d, \"to_rank\": %d", (unsigned long long)job.bytes,
                       OwnerOf(job.src), OwnerOf(job.dst)));
    lk.lock();
    busy = false;
    ++done;
    notifying = true;  // the launch's end waits for the Notify below: it reads the pool's header
    cv_done.notify_all();
    if (!queue.empty() && queue.front().wake) cv_work.notify_one();
    lk.unlock();
    Notify();  // a quiet polling for this copy
    lk.lock();
    notifying = false;
    cv_done.notify_all();
  }
  void Run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv_work.wait(lk, [&] { return stop || (!queue.empty() && !busy); });
      if (stop) return;  // only when the process tears its workers down (no launch running)
      CopyHead(lk, false);
    }
  }
  // A quiet whose copies the engine has not started yet runs the next one itself (on the core's
  // thread) instead of waiting for the engine thread to be scheduled: the copy still happens after
  // its post and before the quiet returns, in queue order, never beside another copy of the queue;
  // only which thread moves the bytes changes. A delayed copy is taken only once it is due (the
  // waiter polls again meanwhile), so that a wait does not land it early. Returns whether it ran one.
  bool TakeOne() {
    std::unique_lock<std::mutex> lk(mu);
    if (busy || queue.empty() || (queue.front().due > 0 && Now() < queue.front().due)) return false;
    CopyHead(lk, true);
    return true;
  }
  // End of a launch: drops the copies still queued (their core failed or returned without a
  // quiet), waits for the one in progress and leaves the queue empty with done == posted.
  void EndLaunch() {
    std::unique_lock<std::mutex> lk(mu);
    queue.clear();
    // no copy in progress, and none still waking its waiters: once the launch ends, the pool may be
    // unmapped (a communicator closed while others stay open keeps the engine threads)
    cv_done.wait(lk, [&] { return !busy && !notifying; });
    posted = done;
  }
};

// Core time an SDMA post costs its issuing core per SQE (STRATA_CPU_SDMA_SQE_US overrides; 0 turns
// it off). On the NPU, aclshmemi_sdma_post_send runs on the AIV: three aclshmemi_set_value round
// trips (scalar to UB, PipeBarrier<PIPE_ALL>, an 8-byte DataCopyPad UB->GM and an MTE3_MTE2 wait:
// ~0.5 us each, a GM write latency), a cache-line flush and scalar load of sq_tail (~0.5 us),
// about 20 scalar GM stores filling the SQE, a PipeBarrier<PIPE_ALL> per SQE and a
// DataCacheCleanAndInvalid(ENTIRE_DATA_CACHE) (~1 us) (SHMEM shmem_device_sdma.hpp:339-401). That
// is ~3 us for a one-SQE post: an estimate from the instruction sequence, UNVERIFIED (no NPU).
// The model spins the core for this long per SQE (and once for a quiet's flag SQE), so that many
// tiny posts cost what they would on the NPU relative to one large one.
constexpr double kSdmaSqeCostUs = 3.0;

struct Launch {
  const char* kernel = "?";
  uint32_t blocks = 0;
  double timeout = 60.0;
  uint32_t sdma_delay_us = 0;    // STRATA_CPU_SDMA_DELAY_US (see Mix64)
  bool sdma_delay_seeded = false;  // STRATA_CPU_SDMA_DELAY_SEED set: each delay drawn from [0, D]
  uint64_t sdma_delay_seed = 0;
  double sdma_sqe_us = kSdmaSqeCostUs;
  uint32_t threads = 1;  // T: the threads its cores run on (see "cores as fibers")
  bool spin = false;     // its waits yield before sleeping (see Idler)
  bool oversub = false;  // !spin, but each core has a thread and the ranks share a scheduling group
  std::atomic<bool> failed{false};
  std::mutex fail_mu;
  std::string first_failure;
  // SyncAll barrier (polled: cores may be fibers sharing a thread)
  std::mutex bar_mu;
  uint32_t bar_arrived = 0;
  std::atomic<uint64_t> bar_gen{0};
  std::atomic<uint32_t> exited{0};  // cores that returned from the kernel normally
  int first_exited = -1;
  // 64-byte lines some core of this rank scalar-wrote (SetValue) in this launch, and which core
  std::mutex scalar_mu;
  std::unordered_map<uintptr_t, int> scalar_writer;
};

constexpr int kEvents = 16;
constexpr int kEventIds = 8;  // SetFlag/WaitFlag eventID: 0-7 on A2/A3 (atlasascendc_api_07_0270)
enum EventHolder : uint8_t { kEvFree = 0, kEvAlloc = 1, kEvQueue = 2 };
constexpr int kNoKernelType = -1;

struct CoreState {
  Launch* launch = nullptr;
  int idx = 0;
  int line = 0;
  int ktype = kNoKernelType;
  uint8_t* ub = nullptr;
  int atomic_op = kAtomicNone;
  int atomic_dtype = 0;
  uint8_t ev_set[kEvents][kEventIds] = {};   // binary flags: SetFlag sets, WaitFlag clears
  uint8_t ev_hold[kEvents][kEventIds] = {};  // EventHolder
  void* pipe = nullptr;
  uint64_t sdma_unquieted = 0;
  uint64_t sdma_sqes_held = 0;  // SQEs in the core's SDMA queue since the last quiet
  uint64_t mte_ub_off = 0;      // aclshmemx_set_mte_config (SHMEM default: UB [0, 16 KiB))
  uint32_t mte_ub_bytes = 16 * 1024;
  uint32_t poll_calls = 0;
  int trace_line = 0;        // the strata: line whose stage span is open (tracing only)
  double trace_line_t0 = 0;
  // STRATA_WAIT_NOTE: what the next wait is for (consumed by the next SignalWaitUntil)
  const char* note_what = nullptr;
  const int32_t* note_group = nullptr;
  int64_t note_count = 0, note_index = 0;
  // STRATA_SYNC_TRAFFIC: the ranks' agreement (strata::Agree) is reading or writing its records;
  // sync traffic, as signals are, so the data counters leave its DMAs out
  bool sync_traffic = false;
  // cost accounting (strata_cpu_costs_enable; trace.cpp): the activity being timed (-1: none, the
  // kernel's own code), since when, and the exclusive seconds per STRATA_COST_* slot
  bool costing = false;
  int cost_cat = -1;
  double cost_t0 = 0;
  double cost[STRATA_NUM_COSTS] = {};
};

// Times the enclosed activity of core c as STRATA_COST_<cat>, exclusively: the enclosing one (if
// any) stops while it runs and resumes after. A no-op unless the launch accounts costs.
struct CostScope {
  CoreState* c;
  int prev = -1;
  CostScope(CoreState* core, int cat) : c(core && core->costing ? core : nullptr) {
    if (!c) return;
    const double now = Now();
    if (c->cost_cat >= 0) c->cost[c->cost_cat] += now - c->cost_t0;
    prev = c->cost_cat;
    c->cost_cat = cat;
    c->cost_t0 = now;
  }
  ~CostScope() {
    if (!c) return;
    const double now = Now();
    c->cost[c->cost_cat] += now - c->cost_t0;
    c->cost_cat = prev;
    c->cost_t0 = now;
  }
  CostScope(const CostScope&) = delete;
  CostScope& operator=(const CostScope&) = delete;
};
extern std::atomic<bool> g_costs;                        // strata_cpu_costs_enable
extern std::atomic<uint64_t> g_engine_ns[STRATA_MAX_CORES];  // copy time of each core's engine thread
void CostsCoreDone(const CoreState& c);                  // publishes a core's costs (trace.cpp)
void CostsLaunch(int slot, double v);                    // a STRATA_LCOST_* slot of this launch

void TraceStage(CoreState* c, int line);  // closes the open stage span, opens one for `line`

extern thread_local CoreState* t_core;

void CoreMain(Launch* L, int idx, BlockFn fn, void* ctx);

// ---------------------------------------------------------------------------------------------
// Cores as fibers (fibers.cpp)

bool CoreYield(bool waiting);
void RunCores(int t, int T, Launch* L, BlockFn fn, void* arg);
int MachineCpus();
int LaunchThreads(uint32_t blocks);
std::string EnsureStacks(uint32_t blocks);

// A core waiting for an event: other cores of its thread run meanwhile; when it is alone on its
// thread, the thread idles (yields, then sleeps until a Notify).
bool SdmaHelp();  // sdma.cpp: the waiting core runs the next copy of its own SDMA queue
struct CoreWaiter {
  Idler idle;
  explicit CoreWaiter(const Launch* L) {
    if (!L->spin) {
      idle.oversub = L->oversub;
      idle.spin = L->oversub ? OversubSpinSec() : 0;
    }
  }
  void Pause() {
    if (SdmaHelp()) return;  // a copy of this core's queue ran: the caller re-checks its condition
    if (!CoreYield(true)) idle.Idle();
  }
};

// ---------------------------------------------------------------------------------------------
// UB arenas (ub.cpp)

extern std::mutex g_arena_mu;
extern uint8_t* g_arenas[STRATA_MAX_CORES];
void UbMark(int idx, uint64_t lo, uint64_t hi);  // bytes [lo, hi) of the arena, hi <= kUbBytes
void UbMarkAll(int idx);
uint64_t UbRefill(int idx, uint8_t* ub);  // every dirty chunk back to 0xff, in runs; bytes refilled

// ---------------------------------------------------------------------------------------------
// D-cache (dcache.cpp)

// ---- the scalar data cache of each vector core ----
// GlobalTensor::GetValue/SetValue go through a private, non-coherent, write-back cache of 64-byte
// lines (asc-devkit GlobalTensor/GetValue.md, DataCacheCleanAndInvalid.md); DMA (DataCopy, SDMA,
// DMA atomics) and signals do not. A cached line keeps the memory it was loaded from (`snap`), so
// that a change by anyone else (another core or rank, a DMA, the host) is seen: reading such a
// line is a stale read, writing back a dirty line whose other bytes changed is a lost write.
// Core i's cache survives launches of the same pool (its thread persists; whether the hardware's
// D-cache survives between kernel launches is unverified, so the model assumes the worst); it is
// emptied when a pool is mapped or unmapped. Only core i's thread touches it during a launch.
struct DLine {
  uint8_t snap[kCacheLineBytes];  // memory when the line was loaded
  uint8_t data[kCacheLineBytes];  // the core's copy
  uint64_t dirty = 0;             // bit b: byte b written by SetValue and not written back
};
extern std::unordered_map<uintptr_t, DLine> g_dcache[STRATA_MAX_CORES];
// Forgets every core's cached lines of [lo, hi) (a pool that is unmapped).
void DCacheForget(const uint8_t* lo, const uint8_t* hi);
// Writes back (clean) a dirty line and forgets it (invalidate).
void LineCleanInvalidate(CoreState* c, uintptr_t line, const char* op);

// ---------------------------------------------------------------------------------------------
// Failures and name tables (failures.cpp)

const char* KernelTypeName(int t);
const char* DTypeName(int d);
// Records a core failure (first one of the launch wins), marks the pool aborted and wakes the
// other cores of the launch. Does not throw.
void RecordFailure(CoreState* c, const std::string& body);
[[noreturn]] void Unwind();
[[noreturn]] void FailStr(const std::string& body);
CoreState* Cur(const char* op);
// Unwinds if this launch failed (silently: its failure is recorded) or the pool was aborted by a
// failure elsewhere (with a message naming the failed rank); fails it when the host got SIGINT or
// SIGTERM during the launch (OnHostSignal).
void AbortCheck(CoreState* c, const char* op);
std::string GmWhere(const void* p);
void CheckGmImpl(const void* p, uint64_t bytes, const char* op);

// ---------------------------------------------------------------------------------------------
// SIGINT and SIGTERM while a launch runs (host_signals.cpp)

extern std::atomic<int> g_host_signal;     // the signal that arrived during this launch, 0 if none
extern std::atomic<bool> g_in_launch;  // LaunchBlocks runs kernels

// LaunchBlocks' share: the signals of this launch, from a clean slate
struct LaunchSignals {
  LaunchSignals() {
    g_host_signal.store(0);
    g_in_launch.store(true);
  }
  ~LaunchSignals() { g_in_launch.store(false); }
};

// ---------------------------------------------------------------------------------------------
// The SDMA ledger (ledger.cpp)

void LedgerLaunchStart();
void LedgerPost(int core, const void* dst, uint64_t bytes);
void LedgerSignal(const void* flag);
void LedgerSeen(const void* flag);
void LedgerQuiet(int core);
void LedgerRead(const void* p, uint64_t bytes, const char* op);


// ---------------------------------------------------------------------------------------------
// Persistent workers. A process keeps T-1 worker threads (grown to the largest T launched; see
// "cores as fibers") and one SDMA engine thread per core that has posted a copy; launches hand each
// worker its share of the cores and wait for all of them, instead of starting and joining threads
// every time. strata_cpu_finalize (and the library's unloading or the process's exit) stops and
// joins them; the next launch starts them again.

struct CoreJob {
  Launch* L = nullptr;
  BlockFn fn = nullptr;
  void* ctx = nullptr;
  int threads = 1;  // T of the launch
};

struct WorkerPool;

struct CoreWorker {
  WorkerPool* pool = nullptr;
  int idx = 0;  // thread index t >= 1 of every launch (thread 0 is the launching thread)
  std::mutex mu;
  std::condition_variable cv;
  uint64_t gen = 0;  // jobs handed out (a new job: gen changes)
  bool stop = false;
  CoreJob job;
  std::thread thread;
};

struct WorkerPool {
  std::mutex launch_mu;                  // one launch at a time per process
  std::vector<CoreWorker*> cores;        // cores[t - 1] is thread t of every launch
  SdmaEngine* sdma[STRATA_MAX_CORES] = {};  // written by core i (on its thread), read after the launch
  std::mutex done_mu;
  std::condition_variable done_cv;
  uint32_t pending = 0;                  // cores of the running launch that have not finished
};

extern WorkerPool* g_workers;
std::string GrowWorkers(WorkerPool* pool, uint32_t workers);
void StopWorkers(bool wait);

}  // namespace strata_cpu

#pragma GCC visibility pop

#endif  // STRATA_MODEL_INTERNAL_H
