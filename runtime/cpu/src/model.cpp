// The CPU model of the machine stratac kernels run on (see runtime/README.md):
//   * ranks are processes sharing one POSIX shared-memory pool (header page + `world` heaps);
//   * vector cores run on as many threads as CPUs (the launching thread and persistent workers),
//     several per thread as cooperatively switched fibers; each core has a 192 KiB UB arena and
//     an SDMA engine (a persistent thread);
//   * rule violations stop the core (Fail), mark the pool aborted and unwind the other cores.
// Build (from the repository root):
//   g++ -std=c++17 -O2 -fPIC -shared runtime/cpu/src/model.cpp -Iruntime/cpu/include
//       -o libstratacpu.so -pthread -lrt
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

namespace strata_cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Pool (shared by the ranks)

constexpr uint64_t kMagic = 0x53545241544131ULL;  // "STRATA1"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kHeaderBytes = 128 << 10;
constexpr uint64_t kAlign = 512;
constexpr int kMaxWorld = 4096;

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

struct Pool {
  bool inited = false;
  int rank = -1, world = 0;
  std::string name;
  uint8_t* base = nullptr;
  uint64_t total = 0;
  PoolHeader* hdr = nullptr;
  uint8_t* heaps = nullptr;  // heap r at heaps + r * heap_bytes
  uint64_t heap_bytes = 0;
};
Pool g_pool;

inline uint8_t* HeapOf(int r) { return g_pool.heaps + uint64_t(r) * g_pool.heap_bytes; }
inline uint8_t* HeapsEnd() { return g_pool.heaps + uint64_t(g_pool.world) * g_pool.heap_bytes; }
// Rank whose heap holds p, or -1.
inline int OwnerOf(const void* p) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (!g_pool.inited || b < g_pool.heaps || b >= HeapsEnd()) return -1;
  return static_cast<int>((b - g_pool.heaps) / g_pool.heap_bytes);
}

std::mutex g_err_mu;
std::string g_last_error;
std::string g_abort_copy;

void SetLastError(const std::string& s) {
  std::lock_guard<std::mutex> lk(g_err_mu);
  g_last_error = s;
}
std::string Format(const char* fmt, va_list ap) {
  char buf[4096];
  vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}
std::string Sprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Sprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = Format(fmt, ap);
  va_end(ap);
  return s;
}
int Error(const std::string& s) {
  SetLastError(s);
  return -1;
}

double Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

long Futex(uint32_t* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, addr, op, val, ts, nullptr, 0);
}

// Something a waiter may wait for happened (a GM write by a core, a signal, an SDMA copy done, a
// SyncAll completed, a core returned, a failure or abort, a host barrier): wakes the threads of
// every rank that sleep in Idler::Idle. Costs an atomic add; a futex wake only when one sleeps.
void Notify() {
  PoolHeader* h = g_pool.hdr;
  if (!h) return;
  __atomic_add_fetch(&h->wake_epoch, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->wake_sleepers, __ATOMIC_SEQ_CST) != 0 &&
      __atomic_exchange_n(&h->wake_sleepers, 0, __ATOMIC_SEQ_CST) != 0)
    Futex(&h->wake_epoch, FUTEX_WAKE, INT_MAX, nullptr);
}

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
double SpinSec() {
  static const double s = [] {
    const char* e = getenv("STRATA_CPU_SPIN_US");
    return e ? std::max(0.0, strtod(e, nullptr)) * 1e-6 : 100e-6;
  }();
  return s;
}
constexpr long kSleepCapNs = 2000000;
constexpr uint64_t kNotifyCopyBytes = 512;  // UB->GM copies up to this size notify (flags, counts)
// A sched_yield that returns after more than kYieldLostSec gave the CPU to another runnable
// thread (of this machine's other processes, or ranks and engines beyond the CPUs): spinning
// then delays the very thread it waits for by a time slice, while a futex sleeper is woken (and
// scheduled) when its event comes. So after such a yield, waits do not spin for kSpinOffSec.
constexpr double kYieldLostSec = 20e-6, kSpinOffSec = 0.05;
std::atomic<double> g_spin_off_until{0};
// Oversubscribed waits (world x threads > CPUs): a core alone on its thread may yield the CPU for
// up to STRATA_CPU_OVERSUB_SPIN_US before it sleeps, as Open MPI polls with sched_yield when
// oversubscribed. Default 0, sleep at once: on this 2-CPU VM under other sessions' load (5-8) a
// 300 us or 2 ms yield phase did not beat the immediate sleep at 4 KiB on 4 ranks, and a pure
// yield loop had a tail of milliseconds (docs/bench.md, "4 KiB on 4 ranks"). A yield lets a peer
// rank run only when both are in one scheduling group: see OneSchedGroup.
double OversubSpinSec() {
  static const double s = [] {
    const char* e = getenv("STRATA_CPU_OVERSUB_SPIN_US");
    return (e ? std::max(0.0, strtod(e, nullptr)) : 0.0) * 1e-6;
  }();
  return s;
}
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
    PoolHeader* h = g_pool.hdr;
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

int32_t AbortState() {
  return g_pool.hdr ? __atomic_load_n(&g_pool.hdr->abort_state, __ATOMIC_ACQUIRE) : 0;
}
// Marks the pool aborted; the first caller's rank and message win.
void PoolAbort(int rank, const std::string& msg) {
  if (!g_pool.hdr) return;
  int32_t expected = 0;
  if (!__atomic_compare_exchange_n(&g_pool.hdr->abort_state, &expected, 1, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  g_pool.hdr->abort_rank = rank;
  snprintf(g_pool.hdr->abort_msg, sizeof g_pool.hdr->abort_msg, "%s", msg.c_str());
  __atomic_store_n(&g_pool.hdr->abort_state, 2, __ATOMIC_RELEASE);
  Notify();
}
// Waits (briefly) for the abort message to be complete.
void ReadAbort(int* rank, std::string* msg) {
  for (int i = 0; i < 100000 && AbortState() == 1; ++i) sched_yield();
  *rank = g_pool.hdr->abort_rank;
  *msg = AbortState() == 2 ? std::string(g_pool.hdr->abort_msg) : std::string("(message not available)");
}

// ---------------------------------------------------------------------------------------------
// Symmetric allocator: deterministic first fit with coalescing over [0, heap_bytes).

std::mutex g_alloc_mu;
std::map<uint64_t, uint64_t> g_free;  // offset -> size
std::map<uint64_t, uint64_t> g_used;  // offset -> size
uint64_t g_used_bytes = 0;

void AllocReset() {
  g_free.clear();
  g_used.clear();
  g_used_bytes = 0;
  if (g_pool.heap_bytes) g_free[0] = g_pool.heap_bytes;
}

constexpr uint64_t kMallocAlign = 16;  // SHMEM aclshmem_malloc: shmem_mgr.cpp:241-245 (align_size = 16)

// First fit of `size` bytes (rounded up to `align`) at an offset that is a multiple of `align`; the
// bytes skipped before it stay free. Deterministic: equal calls give equal offsets on every rank.
void* AllocAligned(uint64_t align, size_t size, const char* api) {
  if (!g_pool.inited) {
    Error(Sprintf("%s: not initialised", api));
    return nullptr;
  }
  if (size == 0) {
    Error(Sprintf("%s(0): zero-byte request", api));
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  uint64_t need = (uint64_t(size) + align - 1) / align * align;
  for (auto it = g_free.begin(); it != g_free.end(); ++it) {
    uint64_t off = it->first, sz = it->second;
    uint64_t at = (off + align - 1) / align * align;
    if (at - off > sz || sz - (at - off) < need) continue;
    g_free.erase(it);
    if (at > off) g_free[off] = at - off;
    if (off + sz > at + need) g_free[at + need] = off + sz - (at + need);
    g_used[at] = need;
    g_used_bytes += need;
    return HeapOf(g_pool.rank) + at;
  }
  uint64_t free_bytes = 0, largest = 0;
  for (auto& f : g_free) {
    free_bytes += f.second;
    largest = std::max(largest, f.second);
  }
  Error(Sprintf("%s(%llu): symmetric heap exhausted: request of %llu bytes (%llu-byte aligned), %llu bytes free "
                "(largest free block %llu) of %llu",
                api, (unsigned long long)size, (unsigned long long)need, (unsigned long long)align,
                (unsigned long long)free_bytes, (unsigned long long)largest, (unsigned long long)g_pool.heap_bytes));
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Counters, timeout

struct alignas(64) CoreCounters {  // one cache line per core: cores count without false sharing
  std::atomic<uint64_t> v[STRATA_NUM_CTRS];
};
CoreCounters g_ctr[STRATA_MAX_CORES];
std::atomic<int> g_max_cores{0};
std::atomic<double> g_timeout{60.0};
std::atomic<int> g_aiv_cores{STRATA_SOC_MAX_AIV};  // strata_cpu_set_aiv_cores

inline void Count(int core, int ctr, uint64_t n) {
  g_ctr[core].v[ctr].fetch_add(n, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Trace (strata_cpu_trace_*): spans on CLOCK_MONOTONIC, recorded only while enabled. Track (tid)
// = core index for a core's kernel, stages (strata: lines), waits and quiets; kSdmaTid + core for
// the copies of that core's SDMA queue.

constexpr int kSdmaTid = 1000;

struct TraceSpan {
  double t0, t1;
  int tid;
  std::string name, cat, args;  // args: a JSON object body (may be empty)
};

std::atomic<bool> g_trace{false};
std::mutex g_trace_mu;
std::vector<TraceSpan> g_trace_spans;

inline bool Tracing() { return g_trace.load(std::memory_order_relaxed); }

void TraceAdd(int tid, double t0, double t1, std::string name, const char* cat, std::string args = "") {
  std::lock_guard<std::mutex> lk(g_trace_mu);
  g_trace_spans.push_back(TraceSpan{t0, t1, tid, std::move(name), cat, std::move(args)});
}

// ---------------------------------------------------------------------------------------------
// Liveness of the pool's ranks. A rank records its pid and start time when it maps the pool and
// marks itself as left when it unmaps it (or exits through strata_cpu_leave). A joined rank whose
// process is gone, a zombie, or a different process under a reused pid is dead: waits check this
// (at most every kPeerCheckSec per process) and stop instead of running into their deadline.

constexpr double kPeerCheckSec = 0.05;

// Reads state and start time of /proc/<pid>/stat; false if the process does not exist.
bool ProcStat(int pid, char* state, uint64_t* start) {
  char path[64];
  if (pid > 0)
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
  else
    snprintf(path, sizeof path, "/proc/self/stat");
  FILE* f = fopen(path, "r");
  if (!f) return false;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!p) return false;
  ++p;
  // fields after the name: 3 state, 4 ppid, ..., 22 starttime
  int field = 2;
  *state = '?';
  *start = 0;
  while (*p) {
    while (*p == ' ') ++p;
    if (!*p) break;
    ++field;
    if (field == 3) *state = *p;
    if (field == 22) {
      *start = strtoull(p, nullptr, 10);
      break;
    }
    while (*p && *p != ' ') ++p;
  }
  return true;
}

uint64_t SelfStart() {
  char state;
  uint64_t start = 0;
  ProcStat(0, &state, &start);
  return start;
}

// Why the process of a joined rank is not alive, or "" if it is.
std::string WhyDead(const RankSlot& slot) {
  int pid = slot.pid;
  if (pid <= 0) return "";
  if (kill(pid, 0) != 0 && errno == ESRCH) return Sprintf("process %d no longer exists", pid);
  char state;
  uint64_t start;
  if (!ProcStat(pid, &state, &start)) {
    if (errno == ENOENT) return Sprintf("process %d no longer exists", pid);
    return "";  // no /proc: kill(pid, 0) is all we can tell
  }
  if (state == 'Z' || state == 'X') return Sprintf("process %d has exited (a zombie, not yet reaped)", pid);
  if (slot.start != 0 && start != 0 && start != slot.start)
    return Sprintf("process %d has exited (its pid now belongs to another process)", pid);
  return "";
}

std::mutex g_live_mu;
double g_live_next = 0;
std::vector<std::string> g_live_why;   // per rank: why it is dead ("" while not known dead)
// The live ranks of the launches from now on (strata_cpu_set_active_ranks; bit r = rank r, ranks
// from 64 on always live): a kernel wait stops for a dead rank only when that rank is live. A masked
// call (docs/robustness.md, "Masked ranks") neither signals nor waits for a masked rank, so a dead
// masked rank cannot be what a wait of it waits for.
std::atomic<uint64_t> g_active{~0ull};

bool ActiveRank(int r) { return r >= 64 || ((g_active.load() >> r) & 1ull) != 0; }

// The lowest rank whose process died without leaving the pool, or -1 (why: what happened); with
// `masked`, only ranks live in the active mask count. Scans at most every kPeerCheckSec per
// process; callers in between get the last answer. A rank found dead stays dead.
int DeadRank(std::string* why, bool force = false, bool masked = false) {
  if (!g_pool.inited) return -1;
  std::unique_lock<std::mutex> lk(g_live_mu, std::defer_lock);
  if (force) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return -1;  // another core is scanning right now
  }
  const int n = g_pool.world < kMaxWorld ? g_pool.world : kMaxWorld;
  if (static_cast<int>(g_live_why.size()) != n) g_live_why.assign(n, std::string());
  double now = Now();
  if (force || now >= g_live_next) {
    g_live_next = now + kPeerCheckSec;
    int me_pid = getpid();
    for (int r = 0; r < n; ++r) {
      if (r == g_pool.rank || !g_live_why[r].empty()) continue;
      RankSlot slot;
      slot.state = __atomic_load_n(&g_pool.hdr->ranks[r].state, __ATOMIC_ACQUIRE);
      if (slot.state != kRankJoined) continue;
      slot.pid = __atomic_load_n(&g_pool.hdr->ranks[r].pid, __ATOMIC_ACQUIRE);
      slot.start = __atomic_load_n(&g_pool.hdr->ranks[r].start, __ATOMIC_ACQUIRE);
      if (slot.pid == me_pid) continue;
      std::string w = WhyDead(slot);
      // it may have left in between
      if (w.empty() || __atomic_load_n(&g_pool.hdr->ranks[r].state, __ATOMIC_ACQUIRE) != kRankJoined) continue;
      g_live_why[r] = Sprintf("rank %d is gone: %s (killed or crashed) without leaving the pool", r, w.c_str());
    }
  }
  for (int r = 0; r < n; ++r) {
    if (g_live_why[r].empty() || (masked && !ActiveRank(r))) continue;
    if (why) *why = g_live_why[r];
    return r;
  }
  return -1;
}

// Whether every rank of the pool runs in this process's session. With the kernel's autogroup
// scheduling (sched_autogroup_enabled, on by default) each session is a scheduling group of its
// own and sched_yield never hands the CPU to another group: a rank that yields while a peer of
// another session waits for the CPU keeps it until the tick (4 ms at HZ=250), so the oversubscribed
// yield phase is used only when all ranks share the session (`stratac run` and `stratac bench` start
// them in the runner's, as mpirun does its ranks). Known once every rank has joined; kept per pool.
int g_one_group = -1;  // -1 not known yet, 0 no, 1 yes (under g_live_mu)
bool OneSchedGroup() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  if (g_one_group >= 0) return g_one_group == 1;
  if (!g_pool.inited) return false;
  const pid_t mine = getsid(0);
  for (int r = 0; r < g_pool.world && r < kMaxWorld; ++r) {
    if (r == g_pool.rank) continue;
    if (__atomic_load_n(&g_pool.hdr->ranks[r].state, __ATOMIC_ACQUIRE) != kRankJoined) return false;
    pid_t pid = __atomic_load_n(&g_pool.hdr->ranks[r].pid, __ATOMIC_ACQUIRE);
    if (getsid(pid) != mine) {
      g_one_group = 0;
      return false;
    }
  }
  g_one_group = 1;
  return true;
}

void LiveReset() {
  std::lock_guard<std::mutex> lk(g_live_mu);
  g_live_next = 0;
  g_live_why.clear();
  g_active.store(~0ull);
  g_one_group = -1;
}

// ---------------------------------------------------------------------------------------------
// Launches and cores

struct CoreUnwind {};  // unwinds a core's thread; deliberately not a std::exception

struct SdmaJob {
  void* dst;
  const void* src;
  uint64_t bytes;
  int core;
  double due;  // Now() before which the copy does not land (0: at once); see Mix64
  bool wake;   // the engine thread is woken for it (see SdmaPost)
};

// A copy's latency in the model (none by default). STRATA_CPU_SDMA_DELAY_US=D delays every copy by
// D us, which exposes a signal raised before the quiet of the copy it announces. With
// STRATA_CPU_SDMA_DELAY_SEED=S as well, each copy's delay is drawn from [0, D] us by a hash of S,
// the rank, the core and the copy's index in the core's queue (reproducible for one S): copies of
// different cores and ranks then land in an order other than their posts', and a copy still in
// flight when a later access overtakes it (a barrier does not quiet the SDMA queue) is seen as a
// wrong result. On the NPU an SDMA copy's latency varies with size, engine load and links.
uint64_t Mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One core's SDMA queue: a persistent copy engine thread, started the first time the core posts a
// copy and reused by later launches (see WorkerPool). At the end of every launch the queue is
// emptied and the copy in progress (if any) finishes, so no copy outlives its launch.
struct SdmaEngine {
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<SdmaJob> queue;
  uint64_t posted = 0, done = 0;
  bool busy = false;  // a copy is in progress (popped, not yet done)
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
    std::memmove(job.dst, job.src, job.bytes);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (t0 > 0)
      TraceAdd(kSdmaTid + job.core, t0, Now(), quiet ? "sdma copy (run by the quiet)" : "sdma copy", "sdma",
               Sprintf("\"bytes\": %llu, \"from_rank\": %d, \"to_rank\": %d", (unsigned long long)job.bytes,
                       OwnerOf(job.src), OwnerOf(job.dst)));
    lk.lock();
    busy = false;
    ++done;
    cv_done.notify_all();
    if (!queue.empty() && queue.front().wake) cv_work.notify_one();
    lk.unlock();
    Notify();  // a quiet polling for this copy
    lk.lock();
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
    cv_done.wait(lk, [&] { return !busy; });
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
};

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
std::mutex g_sync_mu;
SyncLayout g_sync;

void TraceStage(CoreState* c, int line) {  // closes the open stage span, opens one for `line`
  double now = Now();
  if (c->trace_line > 0)
    TraceAdd(c->idx, c->trace_line_t0, now, Sprintf("strata:%d", c->trace_line), "stage");
  c->trace_line = line;
  c->trace_line_t0 = now;
}

thread_local CoreState* t_core = nullptr;

}  // namespace
}  // namespace strata_cpu

// Switches stacks (x86-64 System V): saves the callee-saved registers and the SSE/x87 control
// words on the current stack, stores its pointer in *from, loads `to` (a stack saved the same way)
// and returns on it. No signal mask is saved (swapcontext's two syscalls per switch); cores do not
// change it.
extern "C" void StrataFiberSwitch(void** from, void* to);
#if defined(__x86_64__)
__asm__(R"(
.text
.p2align 4
.type StrataFiberSwitch,@function
StrataFiberSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size StrataFiberSwitch,.-StrataFiberSwitch
)");
#define STRATA_HAVE_FIBERS 1
#else  // elsewhere every core has a thread of its own (LaunchThreads), so no fiber ever switches
extern "C" void StrataFiberSwitch(void**, void*) { std::abort(); }
#define STRATA_HAVE_FIBERS 0
#endif

namespace strata_cpu {
namespace {

// ---- cores as fibers ----
// A launch runs its cores on T threads (T = the CPUs this process may run on, at most the launch's
// cores; STRATA_CPU_THREADS overrides): the launching thread is thread 0 and runs cores 0, T, 2T,
// ...; persistent worker thread t runs cores t, t+T, .... A thread with one core runs it directly;
// a thread with several runs each as a fiber (ucontext, a stack of its own per core, kept across
// launches) and switches between them where a core waits (flag waits, SyncAll, SDMA quiets, the
// modelled SQE cost, polling D-cache flushes): cooperative, so a core never loses the CPU between
// two model calls. Everything a core owns (CoreState, UB arena, D-cache, events, SDMA queue,
// counters) stays per core, whichever thread runs it.
constexpr size_t kFiberStackBytes = 8u << 20;  // as a default thread stack
struct FiberSlot {
  void* sp = nullptr;  // saved stack pointer while switched out (StrataFiberSwitch)
  uint8_t* stack = nullptr;  // mmap'd once, guard page at the bottom
  bool done = false;
  bool waiting = false;  // its last switch-out was a wait (nothing to do until something happens)
  Launch* L = nullptr;
  BlockFn fn = nullptr;
  void* arg = nullptr;
};
FiberSlot g_fib[STRATA_MAX_CORES];

struct Sched {  // one thread's share of a launch
  void* home = nullptr;  // the scheduler's saved stack pointer while a fiber runs
  int cur = -1;
  int live = 0;  // its cores that have not returned
};
thread_local Sched* t_sched = nullptr;

// Lets the other cores of this thread run (returns false, doing nothing, when none shares it).
// `waiting`: this core has nothing to do until another agent acts (the thread may sleep when all
// its cores wait).
bool CoreYield(bool waiting) {
  Sched* s = t_sched;
  if (!s || s->live <= 1) return false;
  CoreState* me = t_core;
  FiberSlot& f = g_fib[s->cur];
  f.waiting = waiting;
  StrataFiberSwitch(&f.sp, s->home);
  t_core = me;
  return true;
}

// A core waiting for an event: other cores of its thread run meanwhile; when it is alone on its
// thread, the thread idles (yields, then sleeps until a Notify).
bool SdmaHelp();  // below: the waiting core runs the next copy of its own SDMA queue
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

std::mutex g_arena_mu;
uint8_t* g_arenas[STRATA_MAX_CORES] = {};
// The 256-byte chunks of core i's arena that may differ from 0xff: those some write reached since
// the last refill (UbWrote: DataCopy/DataCopyPad into UB, the vector ops' and Cast's dst,
// LocalTensor::SetValue and operator(); and, since the model cannot see what a kernel does with a
// raw UB pointer, the whole buffer behind every LocalTensor::GetPhyAddr, and the whole UB after
// UbBase). A launch refills only those, so every launch still starts with a UB of 0xff (the arena
// is filled whole when allocated), at the cost of what the previous launches wrote rather than
// what they carved (a reduction that uses 32 KiB of each 48 KiB tile refills 32 KiB). Only core i
// touches its bits.
constexpr uint64_t kUbChunk = 256;
constexpr int kUbChunkWords = int((kUbBytes / kUbChunk + 63) / 64);
static_assert(kUbBytes % kUbChunk == 0, "UB chunks");
uint64_t g_ub_dirty[STRATA_MAX_CORES][kUbChunkWords] = {};
void UbMark(int idx, uint64_t lo, uint64_t hi) {  // bytes [lo, hi) of the arena, hi <= kUbBytes
  if (hi <= lo) return;
  uint64_t k = lo / kUbChunk;
  const uint64_t e = (hi + kUbChunk - 1) / kUbChunk;  // chunks [k, e), a word at a time
  while (k < e) {
    const uint64_t w = k / 64, b = k % 64, n = std::min<uint64_t>(64 - b, e - k);
    g_ub_dirty[idx][w] |= (n == 64 ? ~0ull : ((1ull << n) - 1)) << b;
    k += n;
  }
}
void UbMarkAll(int idx) { UbMark(idx, 0, kUbBytes); }
void UbRefill(int idx, uint8_t* ub) {  // every dirty chunk back to 0xff, in runs
  uint64_t* w = g_ub_dirty[idx];
  uint64_t k = 0;
  const uint64_t n = kUbBytes / kUbChunk;
  while (k < n) {
    if (w[k / 64] == 0 && k % 64 == 0) {
      k += 64;
      continue;
    }
    if (!((w[k / 64] >> (k % 64)) & 1)) {
      ++k;
      continue;
    }
    uint64_t e = k;
    while (e < n && ((w[e / 64] >> (e % 64)) & 1)) ++e;
    std::memset(ub + k * kUbChunk, 0xff, (e - k) * kUbChunk);
    k = e;
  }
  std::memset(w, 0, sizeof(g_ub_dirty[idx]));
}

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
std::unordered_map<uintptr_t, DLine> g_dcache[STRATA_MAX_CORES];

void DCacheReset() {
  for (auto& c : g_dcache) c.clear();
}

const char* KernelTypeName(int t) {
  static const char* const names[] = {"KERNEL_TYPE_AIV_ONLY",    "KERNEL_TYPE_AIC_ONLY",
                                      "KERNEL_TYPE_MIX_AIV_1_0", "KERNEL_TYPE_MIX_AIC_1_0",
                                      "KERNEL_TYPE_MIX_AIC_1_1", "KERNEL_TYPE_MIX_AIC_1_2"};
  if (t >= 0 && t < 6) return names[t];
  return "an unknown kernel type";
}
const char* DTypeName(int d) {
  static const char* const names[] = {"(other)", "float",   "half",    "bfloat16_t", "int32_t",
                                      "int16_t", "int8_t",  "uint32_t", "uint16_t",  "uint8_t",
                                      "int64_t", "uint64_t", "double"};
  if (d >= 0 && d <= kDtF64) return names[d];
  return "?";
}

std::string Prefix(const CoreState* c) {
  char line[32];
  if (c->line > 0)
    snprintf(line, sizeof line, "%d", c->line);
  else
    snprintf(line, sizeof line, "?");
  return Sprintf("rank %d core %d strata:%s kernel %s: ", g_pool.rank, c->idx, line, c->launch->kernel);
}

// Records a core failure (first one of the launch wins), marks the pool aborted and wakes the
// other cores of the launch. Does not throw.
void RecordFailure(CoreState* c, const std::string& body) {
  std::string msg = Prefix(c) + body;
  Launch* L = c->launch;
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(L->fail_mu);
    if (!L->failed.load()) {
      L->first_failure = msg;
      L->failed.store(true);
      first = true;
    }
  }
  // only the launch's first failure aborts the pool, so the pool's message and the launch's error
  // are the same failure even when several cores fail at once
  if (first) PoolAbort(g_pool.rank, msg);
  Notify();  // waiting cores (SyncAll, quiets, flags) re-check and unwind
}

[[noreturn]] void Unwind() { throw CoreUnwind{}; }

[[noreturn]] void FailOutsideCore(const std::string& body) {
  std::string msg = Sprintf("rank %d (not on a core): %s", g_pool.rank, body.c_str());
  SetLastError(msg);
  PoolAbort(g_pool.rank, msg);
  fprintf(stderr, "strata_cpu: %s\n", msg.c_str());
  fflush(stderr);
  std::abort();
}

[[noreturn]] void FailStr(const std::string& body) {
  CoreState* c = t_core;
  if (!c) FailOutsideCore(body);
  RecordFailure(c, body);
  Unwind();
}

CoreState* Cur(const char* op) {
  CoreState* c = t_core;
  if (!c) FailOutsideCore(Sprintf("%s called outside a kernel launch", op));
  return c;
}

// ---- SIGINT and SIGTERM while a launch runs ----
// The host thread blocks in LaunchBlocks (cffi releases the GIL; Python runs its signal handlers
// only in the main thread, between bytecodes), so without this a signal would wait for the launch
// to end: for a wait on a peer that never arrives, its timeout. strata_cpu_watch_signals (the
// communicator's, for its lifetime) puts OnHostSignal on both signals (not on one the process
// ignores). Outside a launch it only hands the signal on to the handler it replaced, exactly as if
// it were not there (the default action is re-raised). During a launch it also records the signal
// (one lock-free atomic store: async-signal-safe), so that every kernel wait sees it at its next
// poll (AbortCheck) and fails the launch like any rule violation: the pool is aborted, so the
// peers' waits on this rank stop too, naming the signal. Python's own handler still gets the signal
// and runs once the launch returns (SIGINT: KeyboardInterrupt); when the replaced action is the
// default (SIGTERM's, unless the host set a handler) the signal is held back instead of killing the
// process inside the kernel, for the host to end it cleanly (strata_cpu_take_signal). Installed
// once rather than around each launch: the four system calls of installing and restoring cost about
// 4 us per launch (7 % of a 4 KiB AllReduce on the model).
std::atomic<int> g_host_signal{0};     // the signal that arrived during this launch, 0 if none
std::atomic<int> g_held_signal{0};     // one whose action was the default, held for the host
std::atomic<bool> g_in_launch{false};  // LaunchBlocks runs kernels
const int kWatchedSignals[2] = {SIGINT, SIGTERM};
struct sigaction g_replaced[2];

void OnHostSignal(int sig, siginfo_t* info, void* uc) {
  const int saved = errno;
  const int i = sig == SIGINT ? 0 : 1;
  const struct sigaction& prev = g_replaced[i];
  const bool in_launch = g_in_launch.load();
  if (in_launch) g_host_signal.store(sig);
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, uc);
  } else if (prev.sa_handler == SIG_DFL) {
    if (in_launch) {
      g_held_signal.store(sig);
    } else {   // as if this handler were not there: the default action, once this returns
      sigaction(sig, &prev, nullptr);
      raise(sig);
    }
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
  errno = saved;
}

bool Watching(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == OnHostSignal;
}

// LaunchBlocks' share: the signals of this launch, from a clean slate
struct LaunchSignals {
  LaunchSignals() {
    g_host_signal.store(0);
    g_in_launch.store(true);
  }
  ~LaunchSignals() { g_in_launch.store(false); }
};

// Unwinds if this launch failed (silently: its failure is recorded) or the pool was aborted by a
// failure elsewhere (with a message naming the failed rank); fails it when the host got SIGINT or
// SIGTERM during the launch (OnHostSignal).
void AbortCheck(CoreState* c, const char* op) {
  if (c->launch->failed.load(std::memory_order_relaxed)) Unwind();
  if (int sig = g_host_signal.load(std::memory_order_relaxed))
    FailStr(Sprintf("%s interrupted: this rank's process got %s; the launch is abandoned", op,
                    sig == SIGINT ? "SIGINT" : "SIGTERM"));
  if (AbortState() != 0) {
    if (c->launch->failed.load()) Unwind();
    int rank;
    std::string msg;
    ReadAbort(&rank, &msg);
    FailStr(Sprintf("%s aborted: rank %d failed: %s", op, rank, msg.c_str()));
  }
}

const char* CmpName(int cmp) {
  static const char* const names[] = {"==", "!=", ">", ">=", "<", "<="};
  return cmp >= 0 && cmp < 6 ? names[cmp] : "?";
}
const char* CmpApi(int cmp) {
  static const char* const names[] = {"ACLSHMEM_CMP_EQ", "ACLSHMEM_CMP_NE", "ACLSHMEM_CMP_GT",
                                      "ACLSHMEM_CMP_GE", "ACLSHMEM_CMP_LT", "ACLSHMEM_CMP_LE"};
  return cmp >= 0 && cmp < 6 ? names[cmp] : "?";
}
bool Compare(int32_t v, int cmp, int32_t x) {
  switch (cmp) {
    case 0: return v == x;
    case 1: return v != x;
    case 2: return v > x;
    case 3: return v >= x;
    case 4: return v < x;
    default: return v <= x;
  }
}

std::string GmWhere(const void* p) {
  int owner = OwnerOf(p);
  if (owner < 0) return Sprintf("%p (not in the pool)", p);
  uint64_t off = static_cast<const uint8_t*>(p) - HeapOf(owner);
  return Sprintf("rank %d heap offset %llu (0x%llx)", owner, (unsigned long long)off, (unsigned long long)off);
}

void CheckGmImpl(const void* p, uint64_t bytes, const char* op) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (!g_pool.inited) FailStr(Sprintf("%s: no pool (strata_cpu_init missing)", op));
  if (b < g_pool.heaps || b > HeapsEnd() || bytes > uint64_t(HeapsEnd() - b)) {
    const char* where = (b >= g_pool.base && b < g_pool.heaps) ? " (the pool's header page)" : "";
    FailStr(Sprintf("%s: GM range [%p, +%llu bytes) is outside the pool's heaps [%p, %p)%s", op, p,
                    (unsigned long long)bytes, (void*)g_pool.heaps, (void*)HeapsEnd(), where));
  }
}

// ---------------------------------------------------------------------------------------------
// The SDMA ledger: a flag raised before the quiet of the SDMA copies it announces.
//
// SHMEM orders nothing between an SDMA copy and a later signal: only aclshmemx_sdma_quiet says the
// copies a core posted have landed (shmem_device_sdma.h:118, 127; there is no SDMA put-with-signal,
// audit 2 #31), so a flag must be raised after the quiet of the copies whose data a peer reads once
// it sees the flag. The model keeps, per core, the destinations of the copies posted since its
// last quiet (process-local). A signal raised while some core of the rank has such copies
// "announces" them: their ranges go into a ledger in the pool header (shared by the ranks) with
// the rank's signal number at that moment; the quiet records the signal number at its end. Every
// flag remembers which rank's signal (and number) set it, and a rank whose wait sees the flag
// learns that number. A rank that then reads (DataCopy/DataCopyPad into UB, an SDMA source, a
// scalar load) bytes of an announced copy of another rank fails when the newest signal it has seen
// from that rank was raised at or after the announcement but not after the quiet: it is reading
// data announced by a flag raised before the quiet (on the NPU: not yet landed, whatever the timing).
// An async stage's copies, announced by an unrelated barrier and read only after the await's quiet
// and a later signal, pass. The ledger forgets a rank's copies at its next launch. When the tables
// overflow the check switches itself off for the pool (it may miss, never refuse wrongly).
constexpr uint64_t kLedgerOffset = 112 << 10;   // in the pool header, after PoolHeader
constexpr int kLedgerEntries = 128, kLedgerFlags = 512, kLedgerRanks = 256;   // larger worlds: no check
struct LedgerEntry {
  int32_t state;        // 0 free, 1 announced (not quieted yet), 2 announced, quieted
  int32_t rank, core;
  int32_t announce;     // the poster's signal number at the announcing signal
  int32_t quiet;        // its signal number when the quiet returned
  int32_t pad;
  uint64_t dst, bytes;  // destination: pool offset, bytes
};
struct LedgerFlag {
  uint64_t addr;        // pool offset + 1 (0: free)
  int32_t rank, seq;    // the signal that last set it
};
struct Ledger {
  int32_t lock;
  int32_t off;          // the tables overflowed: no more checks in this pool
  int32_t announced;    // entries in state 1 or 2 (a read with none skips the scan)
  int32_t pad;
  LedgerEntry e[kLedgerEntries];
  LedgerFlag f[kLedgerFlags];
  int32_t seq[kLedgerRanks];   // per rank: its signals so far (in this pool)
};
static_assert(sizeof(PoolHeader) <= kLedgerOffset, "the SDMA ledger follows the pool header");
static_assert(kLedgerOffset + sizeof(Ledger) <= kHeaderBytes, "the SDMA ledger fits in the header pages");

struct Posted {
  uint64_t dst, bytes;
};
std::mutex g_ledger_mu;                              // this process's side (below)
std::vector<Posted> g_posted[STRATA_MAX_CORES];      // per core: unquieted copies, not yet announced
std::vector<int> g_announced[STRATA_MAX_CORES];      // per core: its ledger entries not yet quieted
std::atomic<int32_t> g_seen[kMaxWorld];              // per rank: the newest signal number seen of it

Ledger* TheLedger() { return reinterpret_cast<Ledger*>(g_pool.base + kLedgerOffset); }
struct LedgerLock {
  Ledger* l;
  explicit LedgerLock(Ledger* x) : l(x) {
    while (__atomic_exchange_n(&l->lock, 1, __ATOMIC_ACQUIRE) != 0) sched_yield();
  }
  ~LedgerLock() { __atomic_store_n(&l->lock, 0, __ATOMIC_RELEASE); }
};
uint64_t PoolOff(const void* p) { return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - g_pool.base); }

// Launch start (one per process): forget this rank's entries and what it had seen.
void LedgerLaunchStart() {
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  for (int i = 0; i < STRATA_MAX_CORES; ++i) {
    g_posted[i].clear();
    g_announced[i].clear();
  }
  for (int r = 0; r < g_pool.world && r < kMaxWorld; ++r) g_seen[r].store(-1);
  Ledger* l = TheLedger();
  LedgerLock g(l);
  if (g_pool.world > kLedgerRanks) l->off = 1;
  for (LedgerEntry& e : l->e)
    if (e.state != 0 && e.rank == g_pool.rank) {
      e.state = 0;
      --l->announced;
    }
}
void LedgerPost(int core, const void* dst, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  std::vector<Posted>& v = g_posted[core];
  uint64_t d = PoolOff(dst);
  if (!v.empty() && v.back().dst + v.back().bytes == d) v.back().bytes += bytes;   // coalesce
  else v.push_back(Posted{d, bytes});
}
// A signal of this rank to `flag` (a pool address): announces every core's unquieted copies.
void LedgerSignal(const void* flag) {
  Ledger* l = TheLedger();
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  LedgerLock g(l);
  if (l->off) return;
  const int32_t seq = ++l->seq[g_pool.rank];
  for (int c = 0; c < STRATA_MAX_CORES; ++c) {
    for (const Posted& p : g_posted[c]) {
      int slot = -1;
      for (int i = 0; i < kLedgerEntries && slot < 0; ++i)
        if (l->e[i].state == 0) slot = i;
      if (slot < 0) {
        l->off = 1;
        return;
      }
      l->e[slot] = LedgerEntry{1, g_pool.rank, c, seq, 0, 0, p.dst, p.bytes};
      ++l->announced;
      g_announced[c].push_back(slot);
    }
    g_posted[c].clear();
  }
  const uint64_t key = PoolOff(flag) + 1;
  int h = static_cast<int>((key / kCacheLineBytes) % kLedgerFlags);
  for (int k = 0; k < kLedgerFlags; ++k, h = (h + 1) % kLedgerFlags) {
    LedgerFlag& f = l->f[h];
    if (f.addr == 0 || f.addr == key) {
      f = LedgerFlag{key, g_pool.rank, seq};
      return;
    }
  }
  l->off = 1;   // every flag slot taken
}
// A wait on `flag` (a pool address) was satisfied: this rank has seen the signal that set it (its
// rank and number are exact) and is credited with every signal any other rank has raised so far
// (more than it may know: a flag several ranks add to names only its last writer; crediting too
// much can only miss a violation, never refuse a kernel that is right).
void LedgerSeen(const void* flag) {
  Ledger* l = TheLedger();
  const uint64_t key = PoolOff(flag) + 1;
  LedgerLock g(l);
  if (l->off) return;
  int writer = -1, wseq = 0;
  int h = static_cast<int>((key / kCacheLineBytes) % kLedgerFlags);
  for (int k = 0; k < kLedgerFlags; ++k, h = (h + 1) % kLedgerFlags) {
    const LedgerFlag& f = l->f[h];
    if (f.addr == 0) break;
    if (f.addr == key) {
      writer = f.rank;
      wseq = f.seq;
      break;
    }
  }
  for (int r = 0; r < g_pool.world; ++r) {
    const int32_t got = r == writer ? wseq : l->seq[r];
    int32_t cur = g_seen[r].load();
    while (got > cur && !g_seen[r].compare_exchange_weak(cur, got)) {
    }
  }
}
// The quiet of `core`: its copies have landed; announced ones record the signal number now.
void LedgerQuiet(int core) {
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  g_posted[core].clear();
  if (g_announced[core].empty()) return;
  Ledger* l = TheLedger();
  LedgerLock g(l);
  for (int i : g_announced[core])
    if (l->e[i].state == 1 && l->e[i].rank == g_pool.rank && l->e[i].core == core) {
      l->e[i].state = 2;
      l->e[i].quiet = l->seq[g_pool.rank];
    }
  g_announced[core].clear();
}
// A read of [p, p + bytes) by the calling core (see above).
void LedgerRead(const void* p, uint64_t bytes, const char* op) {
  Ledger* l = TheLedger();
  if (!g_pool.inited || __atomic_load_n(&l->announced, __ATOMIC_ACQUIRE) == 0 || bytes == 0) return;
  const uint64_t lo = PoolOff(p), hi = lo + bytes;
  std::string why;
  {
    LedgerLock g(l);
    if (l->off) return;
    for (const LedgerEntry& e : l->e) {
      if (e.state == 0 || e.rank == g_pool.rank || e.dst >= hi || lo >= e.dst + e.bytes) continue;
      const int32_t seen = g_seen[e.rank].load();
      if (seen < e.announce || (e.state == 2 && seen > e.quiet)) continue;
      why = Sprintf("%s: reads %s, which an SDMA copy of rank %d core %d writes, and the newest signal this rank "
                    "has seen from rank %d (its signal %d) was raised before that copy's aclshmemx_sdma_quiet: a "
                    "flag raised before the quiet of the SDMA copy it announces (SHMEM orders nothing between an "
                    "SDMA copy and a later signal; only the quiet says the copy landed, shmem_device_sdma.h)%s",
                    op, GmWhere(g_pool.base + std::max(lo, e.dst)).c_str(), e.rank, e.core, e.rank, seen,
                    e.state == 1 ? "; the quiet has not returned yet" : "");
      break;
    }
  }
  if (!why.empty()) FailStr(why);
}


// Busy-waits the calling core for `us` microseconds of wall time (the modelled AIV cost of SDMA
// descriptor writes), unwinding if the launch fails meanwhile.
void SpinCore(CoreState* c, double us, const char* op) {
  if (us <= 0) return;
  const double end = Now() + us * 1e-6;
  for (uint32_t k = 1; Now() < end; ++k)  // other cores of the thread run meanwhile
    if (CoreYield(false) || (k & 255u) == 0) AbortCheck(c, op);
}

// Scratch rules of the SDMA path (UB address, size) and the channel limit.
void CheckSdmaScratch(CoreState* c, const void* buf, uint32_t ub_size, const char* op) {
  if (c->idx >= STRATA_SDMA_MAX_CORE)
    FailStr(Sprintf("%s: core index %d >= %d has no SDMA channel (on hardware the request is silently skipped)",
                    op, c->idx, STRATA_SDMA_MAX_CORE));
  if (buf == nullptr) FailStr(Sprintf("%s: UB scratch buffer is null", op));
  if (ub_size < 64 || ub_size % 64 != 0)
    FailStr(Sprintf("%s: ub_size %u must be at least 64 and a multiple of 64 bytes", op, ub_size));
  const uint8_t* b = static_cast<const uint8_t*>(buf);
  bool in_arena = b >= c->ub && uint64_t(b - c->ub) + ub_size <= kUbBytes;
  bool ub_offset = reinterpret_cast<uintptr_t>(buf) + ub_size <= kUbBytes;  // hardware-style UB address
  if (!in_arena && !ub_offset)
    FailStr(Sprintf("%s: scratch %p (+%u bytes) is not inside the core's Unified Buffer", op, buf, ub_size));
}

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

// Never destroyed: its threads may outlive the library's static destructors (see WorkerReaper).
WorkerPool* g_workers = new WorkerPool;

SdmaEngine* Engine(CoreState* c) {
  SdmaEngine*& e = g_workers->sdma[c->idx];
  if (!e) {
    SdmaEngine* raw = new SdmaEngine;
    try {
      raw->worker = std::thread([raw] { raw->Run(); });
    } catch (const std::exception& ex) {
      delete raw;
      FailStr(Sprintf("cannot start the SDMA engine thread: %s", ex.what()));
    }
    e = raw;
  }
  return e;
}

// A core about to pause in a wait (flag, SyncAll, quiet) runs the next copy of its own SDMA queue
// if the engine has not started it (SdmaEngine::TakeOne); true if it ran one.
bool SdmaHelp() {
  CoreState* c = t_core;
  if (!c) return false;
  SdmaEngine* e = g_workers->sdma[c->idx];
  return e && e->TakeOne();
}

// ---- scalar data cache (see g_dcache) ----
void LineRead(uintptr_t line, uint8_t* out) {  // tearing-free per 8 bytes (lines are 64-aligned)
  const uint64_t* src = reinterpret_cast<const uint64_t*>(line);
  for (uint64_t w = 0; w < kCacheLineBytes / 8; ++w) {
    uint64_t v = __atomic_load_n(src + w, __ATOMIC_ACQUIRE);
    std::memcpy(out + 8 * w, &v, 8);
  }
}

// The bytes of a line where x and y differ, outside `skip`: "32-47 (4 bytes differ)".
std::string ByteRanges(const uint8_t* x, const uint8_t* y, uint64_t skip) {
  int lo = -1, hi = -1, n = 0;
  for (int i = 0; i < int(kCacheLineBytes); ++i) {
    if (x[i] == y[i] || ((skip >> i) & 1)) continue;
    if (lo < 0) lo = i;
    hi = i;
    ++n;
  }
  return Sprintf("%d-%d (%d byte%s differ%s)", lo, hi, n, n == 1 ? "" : "s", n == 1 ? "s" : "");
}

// The line's bytes that memory holds differently from the snapshot, ignoring `skip` (dirty bytes).
bool LineChanged(const DLine& e, uintptr_t line, uint64_t skip, std::string* which) {
  uint8_t now[kCacheLineBytes];
  LineRead(line, now);
  for (uint64_t i = 0; i < kCacheLineBytes; ++i) {
    if (((skip >> i) & 1) == 0 && now[i] != e.snap[i]) {
      *which = ByteRanges(now, e.snap, skip);
      return true;
    }
  }
  return false;
}

DLine& LineFill(CoreState* c, uintptr_t line) {
  auto it = g_dcache[c->idx].find(line);
  if (it != g_dcache[c->idx].end()) return it->second;
  DLine& e = g_dcache[c->idx][line];
  LineRead(line, e.snap);
  std::memcpy(e.data, e.snap, kCacheLineBytes);
  e.dirty = 0;
  return e;
}

// Writes back (clean) a dirty line and forgets it (invalidate).
void LineCleanInvalidate(CoreState* c, uintptr_t line, const char* op) {
  auto it = g_dcache[c->idx].find(line);
  if (it == g_dcache[c->idx].end()) return;
  DLine& e = it->second;
  if (e.dirty) {
    std::string which;
    if (LineChanged(e, line, e.dirty, &which))
      FailStr(Sprintf("%s: lost write: the write-back of this core's dirty 64-byte line at %s would overwrite "
                      "bytes %s, which another agent (core, rank, DMA, SDMA or the host) wrote since this core "
                      "cached the line; the hardware writes back whole lines, so two writers in one line "
                      "between flushes lose one's data (asc-devkit DataCacheCleanAndInvalid.md example 3)",
                      op, GmWhere(reinterpret_cast<const void*>(line)).c_str(), which.c_str()));
    uint8_t* dst = reinterpret_cast<uint8_t*>(line);
    for (uint64_t w = 0; w < kCacheLineBytes / 8; ++w) {
      uint64_t m = (e.dirty >> (8 * w)) & 0xff;
      if (m == 0xff) {
        uint64_t v;
        std::memcpy(&v, e.data + 8 * w, 8);
        __atomic_store_n(reinterpret_cast<uint64_t*>(dst) + w, v, __ATOMIC_RELEASE);
      } else {
        for (uint64_t b = 0; b < 8; ++b)
          if ((m >> b) & 1) __atomic_store_n(dst + 8 * w + b, e.data[8 * w + b], __ATOMIC_RELEASE);
      }
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    Notify();
  }
  g_dcache[c->idx].erase(it);
}

void CoreMain(Launch* L, int idx, BlockFn fn, void* ctx) {
  CoreState cs;
  cs.launch = L;
  cs.idx = idx;
  cs.ub = g_arenas[idx];
  // UB starts as garbage: NaN for floats, -1 for integers (see g_ub_dirty)
  UbRefill(idx, cs.ub);
  t_core = &cs;
  bool normal = false;
  bool traced = Tracing();
  double t_start = traced ? Now() : 0;
  try {
    fn(ctx);
    if (cs.sdma_unquieted > 0)
      FailStr(Sprintf("kernel returned with %llu SDMA copies not waited for by aclshmemx_sdma_quiet",
                      (unsigned long long)cs.sdma_unquieted));
    {
      uint64_t dirty = 0;
      uintptr_t first = 0;
      for (auto& kv : g_dcache[idx])
        if (kv.second.dirty && (dirty++ == 0 || kv.first < first)) first = kv.first;
      if (dirty)
        FailStr(Sprintf("kernel returned with scalar GM writes not flushed: %llu dirty D-cache line(s) of "
                        "SetValue data (the lowest at %s) never written back; call DataCacheCleanAndInvalid "
                        "after GlobalTensor::SetValue (until then neither DMA, other cores nor other ranks see "
                        "the data)", (unsigned long long)dirty,
                        GmWhere(reinterpret_cast<const void*>(first)).c_str()));
    }
    normal = true;
  } catch (const CoreUnwind&) {
  } catch (const std::exception& e) {
    RecordFailure(&cs, Sprintf("uncaught C++ exception: %s", e.what()));
  } catch (...) {
    RecordFailure(&cs, "uncaught C++ exception of unknown type");
  }
  if (traced) {
    TraceStage(&cs, 0);
    TraceAdd(idx, t_start, Now(), L->kernel, "kernel", normal ? "" : "\"failed\": true");
  }
  {
    std::lock_guard<std::mutex> lk(L->bar_mu);
    if (normal) {
      if (L->exited++ == 0) L->first_exited = idx;
    }
  }
  Notify();  // a SyncAll waiting for a core that returned fails now
  t_core = nullptr;
}

// First code of a fiber (StrataFiberSwitch "returns" here on its new stack); never returns: it
// switches back to the scheduler for good.
void FiberStart() {
  Sched* s = t_sched;
  const int idx = s->cur;
  FiberSlot& f = g_fib[idx];
  CoreMain(f.L, idx, f.fn, f.arg);  // catches everything a kernel throws
  f.done = true;
  void* dead;
  StrataFiberSwitch(&dead, t_sched->home);
  std::abort();
}

// Thread t of a launch on T threads: runs cores t, t+T, ... to their end (see "cores as fibers").
// Stacks are allocated by LaunchBlocks before the launch starts.
void RunCores(int t, int T, Launch* L, BlockFn fn, void* arg) {
  const int blocks = int(L->blocks);
  Sched s;
  t_sched = &s;
  if (t + T >= blocks) {  // one core on this thread: no fiber
    s.live = 1;
    s.cur = t;
    CoreMain(L, t, fn, arg);
    t_sched = nullptr;
    return;
  }
  for (int i = t; i < blocks; i += T) {
    FiberSlot& f = g_fib[i];
    f.L = L;
    f.fn = fn;
    f.arg = arg;
    f.done = false;
    f.waiting = false;
    // a fresh stack as StrataFiberSwitch leaves it: FP control words, six callee-saved registers
    // (zero), the "return" address FiberStart and a null frame above it (FiberStart starts with
    // rsp = 8 mod 16, as after a call)
    uint64_t* sp = reinterpret_cast<uint64_t*>(f.stack + kFiberStackBytes);
    *--sp = 0;
    *--sp = reinterpret_cast<uint64_t>(&FiberStart);
    for (int r = 0; r < 6; ++r) *--sp = 0;
    *--sp = 0;
    uint32_t mxcsr = 0x1f80;  // the defaults, replaced by this thread's
    uint16_t fpucw = 0x037f;
#if defined(__x86_64__)
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(fpucw));
#endif
    std::memcpy(reinterpret_cast<uint8_t*>(sp), &mxcsr, 4);
    std::memcpy(reinterpret_cast<uint8_t*>(sp) + 4, &fpucw, 2);
    f.sp = sp;
    ++s.live;
  }
  Idler idle;
  idle.spin = 0;  // see Idler
  while (s.live > 0) {
    bool busy = false;
    for (int i = t; i < blocks; i += T) {
      FiberSlot& f = g_fib[i];
      if (f.done) continue;
      s.cur = i;
      f.waiting = false;
      StrataFiberSwitch(&s.home, f.sp);
      if (f.done) {
        --s.live;
        busy = true;
      } else if (!f.waiting) {
        busy = true;
      }
    }
    if (busy)
      idle.Busy();
    else
      idle.Idle();  // every core of this thread waits
  }
  t_sched = nullptr;
  t_core = nullptr;
}

// CPUs this process may run on.
int MachineCpus() {
  static const int cpus = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  }();
  return cpus;
}

// Threads a launch of `blocks` cores runs on.
int LaunchThreads(uint32_t blocks) {
  int n = MachineCpus();
  if (const char* e = getenv("STRATA_CPU_THREADS")) n = std::max(1, atoi(e));
  if (!STRATA_HAVE_FIBERS) n = int(blocks);
  return std::max(1, std::min<int>(n, int(blocks)));
}

// Fiber stacks for cores [0, blocks) that run as fibers; "" or why not.
std::string EnsureStacks(uint32_t blocks) {
  for (uint32_t i = 0; i < blocks; ++i) {
    FiberSlot& f = g_fib[i];
    if (f.stack) continue;
    void* p = mmap(nullptr, kFiberStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) return Sprintf("cannot map a stack for core %u: %s", i, strerror(errno));
    mprotect(p, 4096, PROT_NONE);  // guard page: an overflow faults instead of writing elsewhere
    f.stack = static_cast<uint8_t*>(p);
  }
  return "";
}

void CoreWorkerMain(CoreWorker* w) {
  uint64_t seen = 0;
  for (;;) {
    CoreJob job;
    {
      std::unique_lock<std::mutex> lk(w->mu);
      w->cv.wait(lk, [&] { return w->stop || w->gen != seen; });
      if (w->stop) return;
      seen = w->gen;
      job = w->job;
    }
    RunCores(w->idx, job.threads, job.L, job.fn, job.ctx);  // CoreMain catches everything a kernel throws
    WorkerPool* pool = w->pool;
    std::lock_guard<std::mutex> lk(pool->done_mu);
    if (--pool->pending == 0) pool->done_cv.notify_one();
  }
}

// Starts core workers until there are `blocks`; "" or why one could not be started.
std::string GrowWorkers(WorkerPool* pool, uint32_t workers) {
  while (pool->cores.size() < workers) {
    CoreWorker* w = new CoreWorker;
    w->pool = pool;
    w->idx = int(pool->cores.size()) + 1;
    try {
      w->thread = std::thread(CoreWorkerMain, w);
    } catch (const std::exception& e) {
      std::string why = Sprintf("cannot start core thread %d: %s", w->idx, e.what());
      delete w;
      return why;
    }
    pool->cores.push_back(w);
  }
  return "";
}

// Stops and joins every worker thread of the process (no launch may be running: the caller holds
// launch_mu). The pool is empty afterwards and grows again at the next launch.
void StopWorkersLocked(WorkerPool* pool) {
  for (CoreWorker* w : pool->cores) {
    {
      std::lock_guard<std::mutex> lk(w->mu);
      w->stop = true;
    }
    w->cv.notify_one();
  }
  for (CoreWorker* w : pool->cores) {
    if (w->thread.joinable()) w->thread.join();
    delete w;
  }
  pool->cores.clear();
  for (SdmaEngine*& e : pool->sdma) {
    if (!e) continue;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      e->stop = true;
      e->queue.clear();
    }
    e->cv_work.notify_all();
    if (e->worker.joinable()) e->worker.join();
    delete e;
    e = nullptr;
  }
}

// Stops the workers. `wait`: after the running launch, if any (strata_cpu_finalize: the pool is
// about to be unmapped, so no launch may still run on it); otherwise only if none is running (at
// exit, a launch's threads are left alone, as before). Never from one of a launch's own threads.
void StopWorkers(bool wait) {
  WorkerPool* pool = g_workers;
  if (t_core) return;
  std::unique_lock<std::mutex> lk(pool->launch_mu, std::defer_lock);
  if (wait) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return;
  }
  StopWorkersLocked(pool);
}

// At the library's unloading (dlclose) or the process's exit: idle workers are joined, so that no
// thread is left waiting in code that is about to be unmapped. Defined after every other global
// of this file, so destroyed before them.
struct WorkerReaper {
  ~WorkerReaper() { StopWorkers(false); }
};

// A child forked while workers exist has none of their threads: it starts its own.
void ForgetWorkersInChild() { g_workers = new WorkerPool; }
struct AtForkRegistration {
  AtForkRegistration() { pthread_atfork(nullptr, nullptr, ForgetWorkersInChild); }
};
AtForkRegistration g_atfork;
WorkerReaper g_reaper;

}  // namespace

// =============================================================================================
// C++ interface (strata_cpu.h)

STRATA_EXPORT int LaunchBlocks(uint32_t blocks, const char* kernel_name, BlockFn fn, void* ctx) {
  if (t_core) return Error("LaunchBlocks: nested launch from inside a kernel");
  // one launch at a time per process; taken before the pool checks, so that a launch queued
  // behind another sees a pool that was aborted or finalized meanwhile
  WorkerPool* pool = g_workers;
  std::unique_lock<std::mutex> launch_lock(pool->launch_mu);
  if (!g_pool.inited) return Error("LaunchBlocks: no pool (call strata_cpu_init first)");
  if (blocks == 0 || blocks > STRATA_MAX_CORES)
    return Error(Sprintf("LaunchBlocks(%s): %u blocks is outside [1, %d]", kernel_name ? kernel_name : "?",
                         blocks, STRATA_MAX_CORES));
  int aiv = g_aiv_cores.load();
  if (const char* e = getenv("STRATA_CPU_AIV_CORES")) {  // the SoC's count, as the host launcher knows it
    int n = atoi(e);
    if (n < 1 || n > STRATA_SOC_MAX_AIV)
      return Error(Sprintf("LaunchBlocks: STRATA_CPU_AIV_CORES=%s is outside [1, %d]", e, STRATA_SOC_MAX_AIV));
    aiv = std::min(aiv, n);
  }
  if (int(blocks) > aiv)
    return Error(Sprintf("LaunchBlocks(%s): %u blocks exceed the SoC's %d vector cores (numBlocks must not "
                         "exceed the physical AIV count: SyncAll hangs on the NPU otherwise)",
                         kernel_name ? kernel_name : "?", blocks, aiv));
  if (AbortState() != 0) {
    int rank;
    std::string msg;
    ReadAbort(&rank, &msg);
    return Error(Sprintf("LaunchBlocks(%s): the pool is aborted: rank %d failed: %s",
                         kernel_name ? kernel_name : "?", rank, msg.c_str()));
  }
  LedgerLaunchStart();
  const int T = LaunchThreads(blocks);
  {
    std::lock_guard<std::mutex> lk(g_arena_mu);
    for (uint32_t i = 0; i < blocks; ++i) {
      if (!g_arenas[i]) {
        g_arenas[i] = static_cast<uint8_t*>(aligned_alloc(64, kUbBytes));
        if (!g_arenas[i]) return Error("LaunchBlocks: out of memory for UB arenas");
        UbMarkAll(int(i));  // filled by its first launch
      }
    }
    if (int(blocks) > T) {
      std::string why = EnsureStacks(blocks);
      if (!why.empty()) return Error(Sprintf("LaunchBlocks: %s", why.c_str()));
    }
  }
  LaunchSignals signals;   // SIGINT and SIGTERM stop the launch's waits (strata_cpu_watch_signals)
  Launch L;
  L.kernel = kernel_name ? kernel_name : "?";
  L.blocks = blocks;
  L.threads = uint32_t(T);
  L.spin = int(blocks) <= T && g_pool.world * T <= MachineCpus();
  L.oversub = !L.spin && int(blocks) <= T && OversubSpinSec() > 0 && OneSchedGroup();
  L.timeout = g_timeout.load();
  if (const char* d = getenv("STRATA_CPU_SDMA_DELAY_US")) L.sdma_delay_us = uint32_t(strtoul(d, nullptr, 10));
  if (const char* d = getenv("STRATA_CPU_SDMA_DELAY_SEED")) {
    L.sdma_delay_seeded = true;
    L.sdma_delay_seed = strtoull(d, nullptr, 10);
  }
  if (const char* d = getenv("STRATA_CPU_SDMA_SQE_US")) L.sdma_sqe_us = std::max(0.0, strtod(d, nullptr));
  std::string spawn_error = GrowWorkers(pool, uint32_t(T - 1));
  if (!spawn_error.empty()) return Error(Sprintf("LaunchBlocks(%s): %s", L.kernel, spawn_error.c_str()));
  {
    std::lock_guard<std::mutex> lk(pool->done_mu);
    pool->pending = uint32_t(T - 1);
  }
  for (int t = 1; t < T; ++t) {
    CoreWorker* w = pool->cores[t - 1];
    {
      std::lock_guard<std::mutex> lk(w->mu);
      w->job = CoreJob{&L, fn, ctx, T};
      ++w->gen;
    }
    w->cv.notify_one();
  }
  RunCores(0, T, &L, fn, ctx);  // this thread's share
  if (T > 1) {
    std::unique_lock<std::mutex> lk(pool->done_mu);
    pool->done_cv.wait(lk, [&] { return pool->pending == 0; });
  }
  for (uint32_t i = 0; i < blocks; ++i)
    if (SdmaEngine* e = pool->sdma[i]) e->EndLaunch();
  int prev = g_max_cores.load();
  while (int(blocks) > prev && !g_max_cores.compare_exchange_weak(prev, int(blocks))) {
  }
  if (L.failed.load()) return Error(L.first_failure);
  return 0;
}

STRATA_EXPORT void SetLine(int line) {
  if (!t_core) return;
  if (line != t_core->trace_line && Tracing()) TraceStage(t_core, line);
  t_core->line = line;
}

STRATA_EXPORT void Fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string body = Format(fmt, ap);
  va_end(ap);
  FailStr(body);
}

// ---- device hooks ----

STRATA_EXPORT int64_t BlockIdx() { return Cur("GetBlockIdx")->idx; }
STRATA_EXPORT int64_t BlockNum() { return Cur("GetBlockNum")->launch->blocks; }

STRATA_EXPORT void DeclareKernelType(int type) {
  CoreState* c = Cur("KERNEL_TASK_TYPE_DEFAULT");
  if (type != 0 && type != 2)
    FailStr(Sprintf("KERNEL_TASK_TYPE_DEFAULT(%s): only vector kernels (KERNEL_TYPE_AIV_ONLY, "
                    "KERNEL_TYPE_MIX_AIV_1_0) are modeled",
                    KernelTypeName(type)));
  c->ktype = type;
}

STRATA_EXPORT uint8_t* UbBase() {
  CoreState* c = Cur("UB access");
  UbMarkAll(c->idx);  // any byte may be written
  return c->ub;
}
STRATA_EXPORT uint8_t* UbCarve(uint64_t end) {
  CoreState* c = Cur("TPipe::InitBuffer");
  (void)end;  // carving writes nothing: the writes into its buffers are marked (UbWrote)
  return c->ub;
}
STRATA_EXPORT void UbWrote(const void* p, uint64_t bytes) {
  CoreState* c = t_core;
  if (!c || !c->ub) return;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < c->ub || b >= c->ub + kUbBytes) return;  // not this core's arena (a bounds check fails it)
  const uint64_t lo = uint64_t(b - c->ub);
  UbMark(c->idx, lo, lo + std::min<uint64_t>(bytes, kUbBytes - lo));
}

STRATA_EXPORT int64_t UbOffset(const void* p) {
  CoreState* c = t_core;
  if (!c || !p) return -1;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (b < c->ub || b >= c->ub + kUbBytes) return -1;
  return b - c->ub;
}

STRATA_EXPORT void FailUb(const char* op, const char* role, const void* p, uint64_t bytes, uint64_t cap_bytes) {
  if (p == nullptr)
    FailStr(Sprintf("%s: %s is an empty LocalTensor (not from AllocTensor/DeQue/Get)", op, role));
  int64_t off = UbOffset(p);
  FailStr(Sprintf("%s: %s UB access of %llu bytes at UB offset %lld overruns its buffer (%llu bytes left "
                  "in the buffer from there)",
                  op, role, (unsigned long long)bytes, (long long)off, (unsigned long long)cap_bytes));
}

STRATA_EXPORT void CheckGm(const void* p, uint64_t bytes, const char* op) { CheckGmImpl(p, bytes, op); }

STRATA_EXPORT void CheckAbort(const char* op) { AbortCheck(Cur(op), op); }

STRATA_EXPORT void CopyGmToUb(void* ub, const void* gm, uint64_t bytes, const char* op) {
  CoreState* c = Cur(op);
  AbortCheck(c, op);
  CheckGmImpl(gm, bytes, op);
  LedgerRead(gm, bytes, op);
  UbWrote(ub, bytes);
  std::memcpy(ub, gm, bytes);
  if (c->sync_traffic) return;
  Count(c->idx, STRATA_CTR_MTE_IN, bytes);
  if (OwnerOf(gm) != g_pool.rank) Count(c->idx, STRATA_CTR_REMOTE_READ, bytes);
}

STRATA_EXPORT void SyncTraffic(bool on) {
  if (CoreState* c = t_core) c->sync_traffic = on;
}

namespace {
template <class T> T FromU(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
float F16ToF(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
uint16_t FToF16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float Bf16ToF(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Applies dst = dst op src elementwise with CAS loops (atomic against other writers doing the
// same, in any process of the pool). W is the storage word, `combine` works on decoded values.
template <class W, class Combine>
void AtomicApply(uint8_t* dst, const uint8_t* src, uint64_t n, Combine combine) {
  W* d = reinterpret_cast<W*>(dst);
  for (uint64_t i = 0; i < n; ++i) {
    W s;
    std::memcpy(&s, src + i * sizeof(W), sizeof(W));
    W old = __atomic_load_n(d + i, __ATOMIC_RELAXED);
    for (;;) {
      W nv = combine(old, s);
      if (__atomic_compare_exchange_n(d + i, &old, nv, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) break;
    }
  }
}

template <class T> T Op(int op, T a, T b) {
  switch (op) {
    case kAtomicAdd: return a + b;
    case kAtomicMax: return a >= b ? a : b;
    default: return a <= b ? a : b;
  }
}
template <class T> T IntOp(int op, T a, T b) {  // integers wrap
  using U = typename std::make_unsigned<T>::type;
  if (op == kAtomicAdd) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  return Op(op, a, b);
}

void AtomicCopy(CoreState* c, uint8_t* dst, const uint8_t* src, uint64_t bytes, int dtype, const char* op) {
  int mode = c->atomic_op;
  int adt = c->atomic_dtype;
  static const int sizes[] = {0, 4, 2, 2, 4, 2, 1, 4, 2, 1, 8, 8, 8};
  if (dtype != adt)
    FailStr(Sprintf("%s: UB->GM copy of %s elements while the atomic mode is set for %s", op, DTypeName(dtype),
                    DTypeName(adt)));
  int sz = sizes[adt];
  if (bytes % sz != 0)
    FailStr(Sprintf("%s: atomic copy of %llu bytes is not a whole number of %s", op, (unsigned long long)bytes,
                    DTypeName(adt)));
  if (reinterpret_cast<uintptr_t>(dst) % sz != 0)
    FailStr(Sprintf("%s: atomic copy to GM address %p not aligned to %d bytes", op, (void*)dst, sz));
  uint64_t n = bytes / sz;
  switch (adt) {
    case kDtF32:
      AtomicApply<uint32_t>(dst, src, n, [mode](uint32_t a, uint32_t b) {
        float r = Op(mode, FromU<float>(a), FromU<float>(b));
        uint32_t u;
        std::memcpy(&u, &r, 4);
        return u;
      });
      break;
    case kDtF16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return FToF16(Op(mode, F16ToF(a), F16ToF(b)));
      });
      break;
    case kDtBF16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return FToBf16(Op(mode, Bf16ToF(a), Bf16ToF(b)));
      });
      break;
    case kDtI32:
      AtomicApply<uint32_t>(dst, src, n, [mode](uint32_t a, uint32_t b) {
        return static_cast<uint32_t>(IntOp(mode, static_cast<int32_t>(a), static_cast<int32_t>(b)));
      });
      break;
    case kDtI16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return static_cast<uint16_t>(IntOp(mode, static_cast<int16_t>(a), static_cast<int16_t>(b)));
      });
      break;
    case kDtI8:
      AtomicApply<uint8_t>(dst, src, n, [mode](uint8_t a, uint8_t b) {
        return static_cast<uint8_t>(IntOp(mode, static_cast<int8_t>(a), static_cast<int8_t>(b)));
      });
      break;
    default:
      FailStr(Sprintf("%s: DMA atomics are not modeled for %s", op, DTypeName(adt)));
  }
}
}  // namespace

STRATA_EXPORT void CopyUbToGm(void* gm, const void* ub, uint64_t bytes, int dtype, const char* op) {
  CoreState* c = Cur(op);
  AbortCheck(c, op);
  CheckGmImpl(gm, bytes, op);
  if (c->atomic_op != kAtomicNone)
    AtomicCopy(c, static_cast<uint8_t*>(gm), static_cast<const uint8_t*>(ub), bytes, dtype, op);
  else
    std::memcpy(gm, ub, bytes);
  if (!c->sync_traffic) {
    Count(c->idx, STRATA_CTR_MTE_OUT, bytes);
    if (OwnerOf(gm) != g_pool.rank) Count(c->idx, STRATA_CTR_REMOTE_WRITE, bytes);
  }
  // a flag may have been written this way (a signal goes through SignalOp, which notifies); bulk
  // data copies do not notify: a wait on a flag that one covers sees it within Idler's sleep cap
  if (bytes <= kNotifyCopyBytes) Notify();
}

STRATA_EXPORT void SetAtomicMode(int op, int dtype, const char* api) {
  CoreState* c = Cur(api);
  if (op != kAtomicNone) {
    switch (dtype) {
      case kDtF32: case kDtF16: case kDtBF16: case kDtI32: case kDtI16: case kDtI8: break;
      default:
        FailStr(Sprintf("%s<%s>: DMA atomics support float, half, bfloat16_t, int32_t, int16_t and int8_t", api,
                        DTypeName(dtype)));
    }
  }
  c->atomic_op = op;
  c->atomic_dtype = op == kAtomicNone ? 0 : dtype;
}

namespace {
const char* EventName(int e) {
  static const char* const names[] = {"MTE2_V", "V_MTE2", "MTE3_V", "V_MTE3", "V_V", "MTE3_MTE2", "MTE2_MTE3",
                                      "S_V",    "V_S",    "S_MTE2", "MTE2_S", "S_MTE3", "MTE3_S"};
  return e >= 0 && e < 13 ? names[e] : "?";
}
void CheckEvent(int event, int id, const char* api) {
  if (event < 0 || event >= kEvents) FailStr(Sprintf("%s: invalid HardEvent %d", api, event));
  if (id < 0 || id >= kEventIds)
    FailStr(Sprintf("%s<HardEvent::%s>: event id %d is outside [0, %d) (A2/A3 event ids are 0-7)", api,
                    EventName(event), id, kEventIds));
}
const char* HolderName(uint8_t h) {
  return h == kEvAlloc ? "AllocEventID" : h == kEvQueue ? "a TQue (EnQue'd or freed buffer)" : "nobody";
}
// Lowest id of `event` that nobody holds and whose flag is clear, or -1.
int FreeEventId(CoreState* c, int event) {
  for (int id = 0; id < kEventIds; ++id)
    if (c->ev_hold[event][id] == kEvFree && !c->ev_set[event][id]) return id;
  return -1;
}
[[noreturn]] void FailNoEventId(CoreState* c, int event, const char* api) {
  std::string held;
  for (int id = 0; id < kEventIds; ++id)
    held += Sprintf("%s%d: %s%s", id ? ", " : "", id, HolderName(c->ev_hold[event][id]),
                    c->ev_set[event][id] ? " (set)" : "");
  FailStr(Sprintf("%s<HardEvent::%s>: no free event id (%s); ReleaseEventID missing?", api, EventName(event),
                  held.c_str()));
}
}  // namespace

// Flags are binary (TQueSync SetFlag/WaitFlag doc: SetFlag sets the hardware flag bit to 1, WaitFlag
// blocks while it is 0 and clears it). A second SetFlag before the WaitFlag is lost, so the second
// WaitFlag waits forever: the model refuses the second SetFlag ("set-set").
STRATA_EXPORT void EventSet(int event, int id, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  if (c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d): set-set: the flag is already set and not yet waited for (held by "
                    "%s); flags are binary, so one of the two WaitFlags would wait forever on hardware (take "
                    "ids from TPipe::AllocEventID, not fixed EVENT_IDs)",
                    api, EventName(event), id, HolderName(c->ev_hold[event][id])));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  c->ev_set[event][id] = 1;
}

STRATA_EXPORT void EventWait(int event, int id, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  if (!c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d) without a matching SetFlag since the last wait (on hardware this "
                    "waits forever)",
                    api, EventName(event), id));
  c->ev_set[event][id] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

STRATA_EXPORT int EventFetch(int event) {
  CoreState* c = Cur("FetchEventID");
  if (event < 0 || event >= kEvents) FailStr(Sprintf("FetchEventID: invalid HardEvent %d", event));
  int id = FreeEventId(c, event);
  if (id < 0) FailNoEventId(c, event, "FetchEventID");
  return id;
}

STRATA_EXPORT int EventAlloc(int event, bool by_queue, const char* api) {
  CoreState* c = Cur(api);
  if (event < 0 || event >= kEvents) FailStr(Sprintf("%s: invalid HardEvent %d", api, event));
  int id = FreeEventId(c, event);
  if (id < 0) FailNoEventId(c, event, api);
  c->ev_hold[event][id] = by_queue ? kEvQueue : kEvAlloc;
  return id;
}

STRATA_EXPORT void EventRelease(int event, int id, bool by_queue, const char* api) {
  CoreState* c = Cur(api);
  CheckEvent(event, id, api);
  uint8_t want = by_queue ? kEvQueue : kEvAlloc;
  if (c->ev_hold[event][id] != want)
    FailStr(Sprintf("%s<HardEvent::%s>(%d): the id is held by %s, not by %s", api, EventName(event), id,
                    HolderName(c->ev_hold[event][id]), HolderName(want)));
  if (c->ev_set[event][id])
    FailStr(Sprintf("%s<HardEvent::%s>(%d): released with its flag still set (WaitFlag missing; the next "
                    "holder's SetFlag would be lost)",
                    api, EventName(event), id));
  c->ev_hold[event][id] = kEvFree;
}

STRATA_EXPORT void* CurrentPipe() { return t_core ? t_core->pipe : nullptr; }
STRATA_EXPORT void SetCurrentPipe(void* pipe) {
  if (t_core) t_core->pipe = pipe;
}

STRATA_EXPORT void ScalarLoad(const void* p, void* out, uint64_t bytes, const char* op) {
  CoreState* c = Cur(op);
  CheckGmImpl(p, bytes, op);
  LedgerRead(p, bytes, op);
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint8_t* o = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    uintptr_t line = a / kCacheLineBytes * kCacheLineBytes;
    uint64_t at = a - line, n = std::min<uint64_t>(bytes, kCacheLineBytes - at);
    bool cached = g_dcache[c->idx].count(line) != 0;
    DLine& e = LineFill(c, line);
    // only the bytes read count: the line's other bytes may be stale in the cache without harm
    // until they are read (a later read fails then) or written back (a lost write)
    const uint64_t read = (n == kCacheLineBytes ? ~uint64_t(0) : ((uint64_t(1) << n) - 1) << at);
    std::string which;
    if (cached && LineChanged(e, line, ~read, &which))
      FailStr(Sprintf("%s: stale read: GetValue of GM written by another agent since this core cached the line: "
                      "call DataCacheCleanAndInvalid first (asc-devkit GlobalTensor/GetValue.md); element at %s, "
                      "bytes %s of its 64-byte line changed (by another core, rank, DMA, SDMA or the host, in "
                      "this launch or between launches)",
                      op, GmWhere(reinterpret_cast<const void*>(a)).c_str(), which.c_str()));
    std::memcpy(o, e.data + at, n);
    a += n;
    o += n;
    bytes -= n;
  }
}

STRATA_EXPORT void ScalarStore(void* p, const void* in, uint64_t bytes, const char* op) {
  CoreState* c = Cur(op);
  CheckGmImpl(p, bytes, op);
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint8_t* i = static_cast<const uint8_t*>(in);
  while (bytes > 0) {
    uintptr_t line = a / kCacheLineBytes * kCacheLineBytes;
    uint64_t at = a - line, n = std::min<uint64_t>(bytes, kCacheLineBytes - at);
    int other = -1;
    {
      std::lock_guard<std::mutex> lk(c->launch->scalar_mu);
      auto ins = c->launch->scalar_writer.emplace(line, c->idx);
      if (ins.second == false && ins.first->second != c->idx) other = ins.first->second;
    }
    if (other >= 0)
      FailStr(Sprintf("%s: two cores scalar-store into one 64-byte line (at %s): core %d already SetValue'd "
                      "into it in this launch; the hardware loses one of the writes (asc-devkit "
                      "DataCacheCleanAndInvalid.md example 3): give each core's scalar data lines of its own, or "
                      "write through UB with DataCopyPad",
                      op, GmWhere(reinterpret_cast<const void*>(line)).c_str(), other));
    DLine& e = LineFill(c, line);
    std::memcpy(e.data + at, i, n);
    for (uint64_t b = at; b < at + n; ++b) e.dirty |= uint64_t(1) << b;
    a += n;
    i += n;
    bytes -= n;
  }
}

STRATA_EXPORT void DataCacheCleanInvalidate(const void* p, bool entire, const char* op) {
  CoreState* c = Cur(op);
  if (entire) {
    std::vector<uintptr_t> lines;
    lines.reserve(g_dcache[c->idx].size());
    for (auto& kv : g_dcache[c->idx]) lines.push_back(kv.first);
    std::sort(lines.begin(), lines.end());
    for (uintptr_t line : lines) LineCleanInvalidate(c, line, op);
  } else {
    if (p == nullptr) FailStr(Sprintf("%s: GlobalTensor has no buffer (SetGlobalBuffer missing)", op));
    CheckGmImpl(p, 1, op);
    LineCleanInvalidate(c, reinterpret_cast<uintptr_t>(p) / kCacheLineBytes * kCacheLineBytes, op);
  }
  PollHint(op);
}

STRATA_EXPORT void Fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

STRATA_EXPORT void PollHint(const char* op) {
  CoreState* c = Cur(op);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  AbortCheck(c, op);
  if ((++c->poll_calls & 15u) == 0 && !SdmaHelp() && !CoreYield(false)) sched_yield();  // a poll is a wait too
}

STRATA_EXPORT void SyncAllCores(bool aiv_only) {
  CoreState* c = Cur("SyncAll");
  if (c->ktype != 2)
    FailStr(Sprintf("SyncAll needs KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0) (hard sync needs a MIX "
                    "kernel type); this kernel %s%s",
                    c->ktype == kNoKernelType ? "declared no kernel type" : "declared ",
                    c->ktype == kNoKernelType ? "" : KernelTypeName(c->ktype)));
  if (!aiv_only)
    FailStr("SyncAll<false>() also waits for cube cores, which a MIX_AIV_1_0 kernel does not launch (hangs)");
  AbortCheck(c, "SyncAll");
  Launch* L = c->launch;
  struct Span {  // the wait shows in a trace
    CoreState* c;
    double t0;
    ~Span() {
      if (t0 > 0) TraceAdd(c->idx, t0, Now(), "SyncAll", "wait");
    }
  } span{c, Tracing() ? Now() : 0};
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::unique_lock<std::mutex> lk(L->bar_mu);
  uint64_t gen = L->bar_gen.load();
  if (++L->bar_arrived == L->blocks) {
    L->bar_arrived = 0;
    L->bar_gen.fetch_add(1);
    lk.unlock();
    Notify();
    return;
  }
  lk.unlock();
  // polled: the other cores may be fibers of this thread, which run while this one pauses.
  // A quarter of the timeout longer than a flag wait: when a core of this rank is stuck on a
  // peer's flag (the cause) and the others wait for it here, that core's wait reports first, even
  // when the thread was descheduled past both deadlines and the fibers poll in any order.
  const double limit = L->timeout * 1.25;
  double deadline = Now() + limit;
  CoreWaiter waiter(c->launch);
  while (L->bar_gen.load() == gen) {
    if (L->failed.load()) Unwind();
    if (L->exited.load() > 0) {
      lk.lock();
      int first = L->first_exited;
      uint32_t arrived = L->bar_arrived;
      lk.unlock();
      if (L->bar_gen.load() != gen) break;
      FailStr(Sprintf("SyncAll can never complete: core %d returned from the kernel without reaching it (%u of "
                      "%u cores arrived; on hardware this hangs)",
                      first, arrived, L->blocks));
    }
    if (AbortState() != 0 || Now() > deadline) {
      lk.lock();
      uint32_t arrived = L->bar_arrived;
      lk.unlock();
      if (L->bar_gen.load() != gen) break;
      AbortCheck(c, "SyncAll");
      FailStr(Sprintf("SyncAll timed out after %g s: %u of %u cores arrived", limit, arrived, L->blocks));
    }
    waiter.Pause();
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// ---- SHMEM ----

STRATA_EXPORT int MyPe() {
  if (!g_pool.inited) FailStr("aclshmem_my_pe: no pool (strata_cpu_init missing)");
  return g_pool.rank;
}
STRATA_EXPORT int NPes() {
  if (!g_pool.inited) FailStr("aclshmem_n_pes: no pool (strata_cpu_init missing)");
  return g_pool.world;
}

STRATA_EXPORT void* PeerPtr(const void* local_sym, int pe, const char* op) {
  if (!g_pool.inited) FailStr(Sprintf("%s: no pool (strata_cpu_init missing)", op));
  const uint8_t* p = static_cast<const uint8_t*>(local_sym);
  uint8_t* mine = HeapOf(g_pool.rank);
  if (p < mine || p >= mine + g_pool.heap_bytes)
    FailStr(Sprintf("%s: %p is not in this rank's heap instance (rank %d heap [%p, %p)); it is %s", op, local_sym,
                    g_pool.rank, (void*)mine, (void*)(mine + g_pool.heap_bytes), GmWhere(local_sym).c_str()));
  if (pe < 0 || pe >= g_pool.world) FailStr(Sprintf("%s: pe %d is outside [0, %d)", op, pe, g_pool.world));
  return HeapOf(pe) + (p - mine);
}

// A signal is a scalar store plus a flush of its whole 64-byte D-cache line (SHMEM
// shmem_device_so.hpp: aclshmemi_store + dcci_cacheline), so neighbouring signals in one line
// overwrite each other; SHMEM requires "separate elements ... on different cachelines" and pads
// its own to ACLSHMEM_SYNCBIT_SIZE = 64. The model requires each signal at the start of a line.
static void CheckSignalLine(const int32_t* sig_addr, const char* op) {
  if (reinterpret_cast<uintptr_t>(sig_addr) % kCacheLineBytes == 0) return;
  int owner = OwnerOf(sig_addr);
  std::string where = GmWhere(sig_addr);
  if (owner >= 0) {
    uint64_t off = reinterpret_cast<const uint8_t*>(sig_addr) - HeapOf(owner);
    where += Sprintf(", %llu bytes into its 64-byte line", (unsigned long long)(off % kCacheLineBytes));
  }
  FailStr(Sprintf("%s: signal address %s is not 64-byte aligned: each signal needs a D-cache line of its own "
                  "(a signal is a scalar store plus a flush of its whole line, so signals sharing a line "
                  "overwrite each other and one can be lost; SHMEM pads its signals to "
                  "ACLSHMEM_SYNCBIT_SIZE = 64 bytes)", op, where.c_str()));
}

STRATA_EXPORT void SignalOp(int32_t* sig_addr, int32_t signal, int sig_op, int pe) {
  const char* op = "aclshmemx_signal_op";
  CoreState* c = Cur(op);
  AbortCheck(c, op);
  CheckSignalLine(sig_addr, op);
  int32_t* remote = static_cast<int32_t*>(PeerPtr(sig_addr, pe, op));
  CheckGmImpl(remote, 4, op);
  // the store and the flush of its line (dcci_cacheline): this core's copy of the line is gone
  LineCleanInvalidate(c, reinterpret_cast<uintptr_t>(remote), op);
  LedgerSignal(remote);   // before the store: a waiter that sees the value finds its signal number
  if (sig_op == 0)
    __atomic_store_n(remote, signal, __ATOMIC_SEQ_CST);
  else if (sig_op == 1)
    __atomic_fetch_add(remote, signal, __ATOMIC_SEQ_CST);
  else
    FailStr(Sprintf("%s: sig_op %d is neither ACLSHMEM_SIGNAL_SET nor ACLSHMEM_SIGNAL_ADD", op, sig_op));
  Notify();
}

namespace {
constexpr int64_t kSlotInts = int64_t(kCacheLineBytes / sizeof(int32_t));  // sync slots: one line each

// Sync slots i in [0, count) (one line each from `group`) whose flag is below stamp, as "1, 3, 5"
// (at most 16, then how many in all).
std::string SlotsBelow(const int32_t* group, int64_t count, int32_t stamp) {
  std::string out;
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (__atomic_load_n(group + i * kSlotInts, __ATOMIC_SEQ_CST) >= stamp) continue;
    if (n < 16) out += Sprintf("%s%lld", n ? ", " : "", (long long)i);
    ++n;
  }
  if (n > 16) out += Sprintf(", ... (%lld in all)", (long long)n);
  return out;
}

// What a wait is for, from the core's STRATA_WAIT_NOTE or the described sync area:
// e.g. "barrier slot of rank 2", plus who has not arrived ("" when unknown).
void DescribeWait(const char* note_what, const int32_t* group, int64_t count, int64_t index,
                  const int32_t* addr, int cmp, int32_t value, std::string* what, std::string* pending) {
  what->clear();
  pending->clear();
  bool ge = cmp == 3;  // ACLSHMEM_CMP_GE: the device library's stamp waits
  if (note_what && group + index * kSlotInts == addr) {
    if (strcmp(note_what, "barrier") == 0) {
      *what = Sprintf("barrier slot of rank %lld", (long long)index);
      std::string below = ge ? SlotsBelow(group, count, value) : "";
      if (!below.empty()) *pending = "; ranks that have not arrived at this barrier: " + below;
    } else {
      *what = Sprintf("%s slot %lld", note_what, (long long)index);
      std::string below = ge ? SlotsBelow(group, count, value) : "";
      if (!below.empty()) *pending = Sprintf("; slots of %s not yet signalled in this call: ", note_what) + below;
    }
    return;
  }
  std::lock_guard<std::mutex> lk(g_sync_mu);
  const uint8_t* a = reinterpret_cast<const uint8_t*>(addr);
  if (!g_sync.sync || a < g_sync.sync || (a - g_sync.sync) % kCacheLineBytes != 0) return;
  int64_t slot = (a - g_sync.sync) / kCacheLineBytes;
  const int32_t* base = reinterpret_cast<const int32_t*>(g_sync.sync);
  if (slot < g_sync.barrier_slots) {
    *what = Sprintf("barrier slot of rank %lld", (long long)slot);
    std::string below = ge ? SlotsBelow(base, g_sync.barrier_slots, value) : "";
    if (!below.empty()) *pending = "; ranks that have not arrived at this barrier: " + below;
    return;
  }
  for (const SyncFlag& f : g_sync.flags) {
    if (slot < f.base || slot >= f.base + f.size) continue;
    *what = Sprintf("flag %s[%lld]", f.name.c_str(), (long long)(slot - f.base));
    std::string below = ge ? SlotsBelow(base + f.base * kSlotInts, f.size, value) : "";
    if (!below.empty())
      *pending = Sprintf("; slots of %s on rank %d not yet signalled in this call: %s (of %lld)", f.name.c_str(),
                         g_pool.rank, below.c_str(), (long long)f.size);
    return;
  }
}

// "barrier slot of rank 2 (flag at rank 0 heap offset ...): ACLSHMEM_CMP_GE (expected >= 9), seen 6 (...)"
std::string WaitText(const std::string& what, const int32_t* addr, int cmp, int32_t value, int32_t seen) {
  std::string where = what.empty() ? Sprintf("flag at %s", GmWhere(addr).c_str())
                                   : Sprintf("%s (flag at %s)", what.c_str(), GmWhere(addr).c_str());
  const char* why = "";
  if (!what.empty() && cmp == 3 && seen < value) why = seen == 0 ? " (never signalled)" : " (an earlier stamp)";
  return Sprintf("%s: %s (expected %s %d), seen %d%s", where.c_str(), CmpApi(cmp), CmpName(cmp), value, seen, why);
}
}  // namespace

STRATA_EXPORT void NoteWait(const char* what, const int32_t* group, int64_t count, int64_t index) {
  CoreState* c = t_core;
  if (!c) return;
  c->note_what = what;
  c->note_group = group;
  c->note_count = count;
  c->note_index = index;
}

STRATA_EXPORT int32_t SignalWaitUntil(int32_t* sig_addr, int cmp, int32_t value) {
  const char* op = "aclshmem_signal_wait_until";
  CoreState* c = Cur(op);
  const char* note_what = c->note_what;
  const int32_t* note_group = c->note_group;
  int64_t note_count = c->note_count, note_index = c->note_index;
  c->note_what = nullptr;
  c->note_group = nullptr;
  if (cmp < 0 || cmp > 5) FailStr(Sprintf("%s: invalid comparison %d", op, cmp));
  CheckGmImpl(sig_addr, 4, op);
  CheckSignalLine(sig_addr, op);
  LineCleanInvalidate(c, reinterpret_cast<uintptr_t>(sig_addr), op);  // each poll flushes the line
  double deadline = -1, next_live = 0;
  CoreWaiter waiter(c->launch);
  double t0 = Tracing() ? Now() : 0;
  for (uint64_t iter = 0;; ++iter) {
    int32_t v = __atomic_load_n(sig_addr, __ATOMIC_SEQ_CST);
    if (Compare(v, cmp, value)) {
      LedgerSeen(sig_addr);
      if (t0 > 0)
        TraceAdd(c->idx, t0, Now(), "wait flag", "wait",
                 Sprintf("\"flag\": \"%s\", \"until\": \"%s %d\", \"seen\": %d, \"polls\": %llu",
                         GmWhere(sig_addr).c_str(), CmpName(cmp), value, v, (unsigned long long)iter));
      return v;
    }
    AbortCheck(c, op);
    if (iter >= 8) {
      double now = Now();
      if (deadline < 0) {
        deadline = now + c->launch->timeout;
        next_live = now + kPeerCheckSec;
      }
      bool expired = now > deadline;
      std::string gone;
      if (!expired && now >= next_live) {
        next_live = now + kPeerCheckSec;
        DeadRank(&gone, /*force=*/false, /*masked=*/true);
      }
      if (expired || !gone.empty()) {
        v = __atomic_load_n(sig_addr, __ATOMIC_SEQ_CST);
        if (Compare(v, cmp, value)) {
          LedgerSeen(sig_addr);
          return v;
        }
        AbortCheck(c, op);
        std::string what, pending;
        DescribeWait(note_what, note_group, note_count, note_index, sig_addr, cmp, value, &what, &pending);
        std::string text = WaitText(what, sig_addr, cmp, value, v);
        if (!gone.empty())
          FailStr(Sprintf("%s: %s; this core was waiting for %s%s", op, gone.c_str(), text.c_str(), pending.c_str()));
        FailStr(Sprintf("%s timed out after %g s: %s%s", op, c->launch->timeout, text.c_str(), pending.c_str()));
      }
      waiter.Pause();
    }
  }
}

STRATA_EXPORT void SdmaPost(bool put, void* dst, const void* src, uint64_t bytes, const void* ub_buf,
                            uint32_t ub_size, int pe, const char* op) {
  CoreState* c = Cur(op);
  AbortCheck(c, op);
  CheckSdmaScratch(c, ub_buf, ub_size, op);
  if (pe < 0 || pe >= g_pool.world) FailStr(Sprintf("%s: pe %d is outside [0, %d)", op, pe, g_pool.world));
  void* d = dst;
  const void* s = src;
  if (put) {
    d = PeerPtr(dst, pe, op);
  } else {
    s = PeerPtr(src, pe, op);
  }
  CheckGmImpl(s, bytes, op);
  CheckGmImpl(d, bytes, op);
  LedgerRead(s, bytes, op);
  // The local symmetric range must stay inside its heap instance too.
  if (put ? (OwnerOf(d) != pe || static_cast<uint8_t*>(d) + bytes > HeapOf(pe) + g_pool.heap_bytes)
          : (OwnerOf(s) != pe || static_cast<const uint8_t*>(s) + bytes > HeapOf(pe) + g_pool.heap_bytes))
    FailStr(Sprintf("%s: %llu bytes from the symmetric address run past the end of rank %d's heap", op,
                    (unsigned long long)bytes, pe));
  if (bytes == 0) return;
  // The post is split into SQEs of at most 1 MiB, each one entry of the core's SQ until a quiet.
  const uint64_t sqes = (bytes + STRATA_SDMA_SQE_BYTES - 1) / STRATA_SDMA_SQE_BYTES;
  if (c->sdma_sqes_held + sqes > STRATA_SDMA_SQ_DEPTH)
    FailStr(Sprintf("%s: SDMA queue of core %d holds %llu SQEs > depth %d: quiet earlier (%llu SQEs since the "
                    "last aclshmemx_sdma_quiet + %llu for this %llu-byte post in 1 MiB SQEs; on hardware the SQ "
                    "ring overflows unchecked)",
                    op, c->idx, (unsigned long long)(c->sdma_sqes_held + sqes), STRATA_SDMA_SQ_DEPTH,
                    (unsigned long long)c->sdma_sqes_held, (unsigned long long)sqes, (unsigned long long)bytes));
  c->sdma_sqes_held += sqes;
  Count(c->idx, STRATA_CTR_SDMA, bytes);
  Count(c->idx, STRATA_CTR_SDMA_POSTS, 1);
  Count(c->idx, STRATA_CTR_SDMA_SQES, sqes);
  if (OwnerOf(s) != g_pool.rank) Count(c->idx, STRATA_CTR_REMOTE_READ, bytes);
  if (OwnerOf(d) != g_pool.rank) Count(c->idx, STRATA_CTR_REMOTE_WRITE, bytes);
  SpinCore(c, c->launch->sdma_sqe_us * double(sqes), op);  // the AIV's descriptor work, per SQE
  SdmaEngine* e = Engine(c);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lk(e->mu);
    const Launch* L = c->launch;
    const double now = L->sdma_delay_us ? Now() : 0;
    for (uint64_t k = 0; k < sqes; ++k) {
      uint64_t off = k * STRATA_SDMA_SQE_BYTES, n = std::min<uint64_t>(STRATA_SDMA_SQE_BYTES, bytes - off);
      double due = 0;
      if (L->sdma_delay_us) {
        uint64_t us = L->sdma_delay_us;
        if (L->sdma_delay_seeded)  // the copy's index in this core's queue over the process's launches
          us = Mix64(L->sdma_delay_seed ^ Mix64((uint64_t(g_pool.rank) << 40) ^ (uint64_t(c->idx) << 32) ^
                                                e->posted)) % (us + 1);
        due = now + double(us) * 1e-6;
      }
      e->queue.push_back(SdmaJob{static_cast<uint8_t*>(d) + off, static_cast<const uint8_t*>(s) + off, n, c->idx,
                                 due, L->spin});
      ++e->posted;
    }
  }
  // With a CPU for every thread of every rank (Launch::spin) the engine thread starts at once and
  // the copy overlaps what the core does next. Otherwise the CPUs are oversubscribed: waking a
  // thread per post costs a context switch (and a time slice when it preempts a core), so the
  // copies wait in the queue for the core's next wait or quiet, which runs them (SdmaHelp): still
  // after the post, in queue order, before the quiet returns, as an engine may.
  if (c->launch->spin) e->cv_work.notify_one();
  LedgerPost(c->idx, d, bytes);
  ++c->sdma_unquieted;
}

STRATA_EXPORT void SetMteUb(uint64_t offset, uint32_t bytes) {
  CoreState* c = Cur("aclshmemx_set_mte_config");
  if (offset + bytes > kUbBytes)
    FailStr(Sprintf("aclshmemx_set_mte_config: UB region [%llu, +%u) is outside the %u-byte Unified Buffer",
                    (unsigned long long)offset, bytes, kUbBytes));
  c->mte_ub_off = offset;
  c->mte_ub_bytes = bytes;
}
STRATA_EXPORT void GetMteUb(uint64_t* offset, uint32_t* bytes) {
  CoreState* c = Cur("SHMEM MTE config");
  *offset = c->mte_ub_off;
  *bytes = c->mte_ub_bytes;
}

STRATA_EXPORT void SdmaQuiet(const void* ub_buf, uint32_t ub_size, const char* op) {
  CoreState* c = Cur(op);
  CheckSdmaScratch(c, ub_buf, ub_size, op);
  SdmaEngine* e = g_workers->sdma[c->idx];  // none if this core never posted a copy
  double t_quiet = Tracing() ? Now() : 0;
  if (c->sdma_sqes_held > 0) {
    // The quiet is one more SQE (an 8-byte flag write) in the same queue, then a poll loop.
    if (c->sdma_sqes_held + 1 > STRATA_SDMA_SQ_DEPTH)
      FailStr(Sprintf("%s: SDMA queue of core %d holds %llu SQEs > depth %d: quiet earlier (the quiet's flag SQE "
                      "does not fit behind the %llu posted since the last quiet)",
                      op, c->idx, (unsigned long long)(c->sdma_sqes_held + 1), STRATA_SDMA_SQ_DEPTH,
                      (unsigned long long)c->sdma_sqes_held));
    SpinCore(c, c->launch->sdma_sqe_us, op);
  }
  if (e) {  // polled: other cores of this thread run while this one pauses
    double deadline = -1;
    CoreWaiter waiter(c->launch);
    for (;;) {
      uint64_t left;
      {
        std::lock_guard<std::mutex> lk(e->mu);
        left = e->posted - e->done;
      }
      if (left == 0) break;
      AbortCheck(c, op);
      if (e->TakeOne()) continue;  // the engine had not started it: the quiet runs it
      double now = Now();
      if (deadline < 0) deadline = now + c->launch->timeout;
      if (now > deadline)
        FailStr(Sprintf("%s timed out after %g s with %llu copies outstanding", op, c->launch->timeout,
                        (unsigned long long)left));
      waiter.Pause();
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  LedgerQuiet(c->idx);
  c->sdma_unquieted = 0;
  c->sdma_sqes_held = 0;
  if (t_quiet > 0) TraceAdd(c->idx, t_quiet, Now(), "sdma quiet", "wait");
}

}  // namespace strata_cpu

// =============================================================================================
// Host C API

using namespace strata_cpu;

extern "C" {

STRATA_EXPORT int strata_cpu_init(int rank, int world, const char* shm_name, uint64_t heap_bytes, int create) {
  if (g_pool.inited) return Error("strata_cpu_init: already initialised (call strata_cpu_finalize first)");
  if (world < 1 || world > 4096) return Error(Sprintf("strata_cpu_init: world %d is outside [1, 4096]", world));
  if (rank < 0 || rank >= world) return Error(Sprintf("strata_cpu_init: rank %d is outside [0, %d)", rank, world));
  if (!shm_name || !*shm_name) return Error("strata_cpu_init: empty segment name");
  if (heap_bytes == 0 || heap_bytes % kAlign != 0)
    return Error(Sprintf("strata_cpu_init: heap_bytes %llu must be a positive multiple of %llu",
                         (unsigned long long)heap_bytes, (unsigned long long)kAlign));
  if (heap_bytes > (uint64_t(1) << 40) / uint64_t(world))
    return Error("strata_cpu_init: pool too large (world * heap_bytes > 1 TiB)");
  std::string name = shm_name[0] == '/' ? shm_name : std::string("/") + shm_name;
  uint64_t total = kHeaderBytes + uint64_t(world) * heap_bytes;
  int fd;
  if (create) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return Error(Sprintf("strata_cpu_init: shm_open(%s, O_CREAT|O_EXCL): %s", name.c_str(), strerror(errno)));
    if (fchmod(fd, 0600) != 0) {  // whatever the umask: private to the user
      int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      return Error(Sprintf("strata_cpu_init: fchmod(%s, 0600): %s", name.c_str(), strerror(err)));
    }
    if (ftruncate(fd, off_t(total)) != 0) {
      int err = errno;
      close(fd);
      shm_unlink(name.c_str());
      return Error(Sprintf("strata_cpu_init: ftruncate(%s, %llu): %s", name.c_str(), (unsigned long long)total,
                           strerror(err)));
    }
  } else {
    fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) return Error(Sprintf("strata_cpu_init: shm_open(%s): %s (has the creator run?)", name.c_str(), strerror(errno)));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      int err = errno;
      close(fd);
      return Error(Sprintf("strata_cpu_init: fstat(%s): %s", name.c_str(), strerror(err)));
    }
    // Only a segment this user created privately is a pool: anything else may be someone's trap.
    if (st.st_uid != geteuid() || (st.st_mode & 07777) != 0600) {
      close(fd);
      return Error(Sprintf("strata_cpu_init: refusing segment %s: it is owned by uid %u with mode %04o, but a "
                           "pool must belong to this user (uid %u) with mode 0600 (was it created by someone "
                           "else?)",
                           name.c_str(), unsigned(st.st_uid), unsigned(st.st_mode & 07777), unsigned(geteuid())));
    }
    if (uint64_t(st.st_size) != total) {
      close(fd);
      return Error(Sprintf("strata_cpu_init: segment %s has %lld bytes, expected %llu for world %d and heap_bytes "
                           "%llu",
                           name.c_str(), (long long)st.st_size, (unsigned long long)total, world,
                           (unsigned long long)heap_bytes));
    }
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  int map_err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    return Error(Sprintf("strata_cpu_init: mmap of %llu bytes: %s", (unsigned long long)total, strerror(map_err)));
  }
  PoolHeader* hdr = static_cast<PoolHeader*>(base);
  if (create) {
    hdr->version = kVersion;
    hdr->world = world;
    hdr->heap_bytes = heap_bytes;
    hdr->pool_bytes = total;
    hdr->abort_state = 0;
    hdr->abort_rank = -1;
    hdr->bar_count = 0;
    hdr->bar_gen = 0;
    __atomic_store_n(&hdr->magic, kMagic, __ATOMIC_RELEASE);
  } else {
    if (__atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE) != kMagic || hdr->version != kVersion ||
        hdr->world != world || hdr->heap_bytes != heap_bytes) {
      munmap(base, total);
      return Error(Sprintf("strata_cpu_init: segment %s is not a pool for world %d and heap_bytes %llu (or its "
                           "creator has not finished)",
                           name.c_str(), world, (unsigned long long)heap_bytes));
    }
  }
  g_pool.inited = true;
  DCacheReset();
  g_pool.rank = rank;
  g_pool.world = world;
  g_pool.name = name;
  g_pool.base = static_cast<uint8_t*>(base);
  g_pool.total = total;
  g_pool.hdr = hdr;
  g_pool.heaps = g_pool.base + kHeaderBytes;
  g_pool.heap_bytes = heap_bytes;
  {
    std::lock_guard<std::mutex> lk(g_alloc_mu);
    AllocReset();
  }
  LiveReset();
  RankSlot& me = hdr->ranks[rank];
  __atomic_store_n(&me.state, int32_t(kRankAbsent), __ATOMIC_RELEASE);
  __atomic_store_n(&me.pid, int32_t(getpid()), __ATOMIC_RELEASE);
  __atomic_store_n(&me.start, SelfStart(), __ATOMIC_RELEASE);
  __atomic_store_n(&me.state, int32_t(kRankJoined), __ATOMIC_RELEASE);
  return 0;
}

STRATA_EXPORT int strata_cpu_finalize(int unlink_segment) {
  if (!g_pool.inited) return Error("strata_cpu_finalize: not initialised");
  StopWorkers(true);  // joins this process's core and SDMA threads; a later pool starts new ones
  std::string name = g_pool.name;
  __atomic_store_n(&g_pool.hdr->ranks[g_pool.rank].state, int32_t(kRankLeft), __ATOMIC_RELEASE);
  munmap(g_pool.base, g_pool.total);
  LiveReset();
  DCacheReset();
  g_pool = Pool();
  {
    std::lock_guard<std::mutex> lk(g_alloc_mu);
    AllocReset();
  }
  if (unlink_segment && shm_unlink(name.c_str()) != 0)
    return Error(Sprintf("strata_cpu_finalize: shm_unlink(%s): %s", name.c_str(), strerror(errno)));
  return 0;
}

STRATA_EXPORT const char* strata_cpu_last_error(void) {
  std::lock_guard<std::mutex> lk(g_err_mu);
  return g_last_error.c_str();
}

STRATA_EXPORT void* strata_cpu_heap_base(void) { return g_pool.inited ? HeapOf(g_pool.rank) : nullptr; }
STRATA_EXPORT uint64_t strata_cpu_heap_bytes(void) { return g_pool.heap_bytes; }
STRATA_EXPORT uint64_t strata_cpu_heap_used(void) {
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  return g_used_bytes;
}

STRATA_EXPORT void strata_cpu_set_timeout(double seconds) { g_timeout.store(seconds); }

STRATA_EXPORT int strata_cpu_set_aiv_cores(int n) {
  if (n < 1 || n > STRATA_SOC_MAX_AIV)
    return Error(Sprintf("strata_cpu_set_aiv_cores(%d): outside [1, %d] (A2/A3 SoCs have 40 or 48 vector cores)",
                         n, STRATA_SOC_MAX_AIV));
  g_aiv_cores.store(n);
  return 0;
}

STRATA_EXPORT void strata_cpu_reset_counters(void) {
  for (auto& core : g_ctr)
    for (auto& c : core.v) c.store(0);
  g_max_cores.store(0);
}

STRATA_EXPORT int strata_cpu_read_counters(uint64_t* out, int max_cores) {
  int n = std::min(std::max(max_cores, 0), int(STRATA_MAX_CORES));
  for (int i = 0; out && i < n; ++i)
    for (int k = 0; k < STRATA_NUM_CTRS; ++k) out[i * STRATA_NUM_CTRS + k] = g_ctr[i].v[k].load();
  return g_max_cores.load();
}

STRATA_EXPORT void strata_cpu_trace_enable(int on) { g_trace.store(on != 0); }

STRATA_EXPORT int strata_cpu_trace_write(const char* path) {
  std::vector<TraceSpan> spans;
  {
    std::lock_guard<std::mutex> lk(g_trace_mu);
    spans.swap(g_trace_spans);
  }
  FILE* f = fopen(path, "a");
  if (!f) return Error(Sprintf("strata_cpu_trace_write: cannot open %s: %s", path, strerror(errno)));
  int pid = g_pool.inited ? g_pool.rank : 0;
  for (const TraceSpan& s : spans)
    fprintf(f,
            "{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"name\": \"%s\", "
            "\"cat\": \"%s\", \"args\": {%s}}\n",
            pid, s.tid, s.t0 * 1e6, (s.t1 - s.t0) * 1e6, s.name.c_str(), s.cat.c_str(), s.args.c_str());
  bool ok = fflush(f) == 0;
  fclose(f);
  return ok ? 0 : Error(Sprintf("strata_cpu_trace_write: cannot write %s", path));
}

STRATA_EXPORT int strata_cpu_aborted(void) { return AbortState() != 0; }

STRATA_EXPORT int strata_cpu_take_signal(void) { return g_held_signal.exchange(0); }

STRATA_EXPORT void strata_cpu_watch_signals(int on) {
  for (int i = 0; i < 2; ++i) {
    struct sigaction cur;
    if (sigaction(kWatchedSignals[i], nullptr, &cur) != 0) continue;
    if (!on) {
      if (Watching(cur)) sigaction(kWatchedSignals[i], &g_replaced[i], nullptr);
      continue;
    }
    if (Watching(cur) || (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)) continue;
    g_replaced[i] = cur;   // before the handler that reads it is installed
    struct sigaction mine;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = OnHostSignal;
    mine.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&mine.sa_mask);
    sigaction(kWatchedSignals[i], &mine, nullptr);
  }
}

STRATA_EXPORT const char* strata_cpu_abort_message(void) {
  std::lock_guard<std::mutex> lk(g_err_mu);
  if (AbortState() == 0) {
    g_abort_copy.clear();
  } else {
    int rank;
    std::string msg;
    ReadAbort(&rank, &msg);
    g_abort_copy = msg;
  }
  return g_abort_copy.c_str();
}

STRATA_EXPORT int strata_cpu_barrier(void) {
  if (!g_pool.inited) return Error("strata_cpu_barrier: not initialised");
  PoolHeader* h = g_pool.hdr;
  int32_t mine = __atomic_add_fetch(&h->ranks[g_pool.rank].barriers, 1, __ATOMIC_ACQ_REL);
  int32_t gen = __atomic_load_n(&h->bar_gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&h->bar_count, 1, __ATOMIC_ACQ_REL) == g_pool.world) {
    __atomic_store_n(&h->bar_count, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&h->bar_gen, 1, __ATOMIC_ACQ_REL);
    Notify();  // the waiters below
    return 0;
  }
  double start = Now(), deadline = start + g_timeout.load();
  Idler idle;
  while (__atomic_load_n(&h->bar_gen, __ATOMIC_ACQUIRE) == gen) {
    if (AbortState() != 0) {
      int rank;
      std::string msg;
      ReadAbort(&rank, &msg);
      return Error(Sprintf("strata_cpu_barrier: the pool is aborted: rank %d failed: %s", rank, msg.c_str()));
    }
    std::string gone;
    if (DeadRank(&gone) >= 0) {
      std::string msg = Sprintf("strata_cpu_barrier: rank %d: %s", g_pool.rank, gone.c_str());
      PoolAbort(g_pool.rank, msg);
      return Error(msg);
    }
    if (Now() > deadline) {
      std::string late;
      int n = 0;
      for (int r = 0; r < g_pool.world; ++r) {
        if (__atomic_load_n(&h->ranks[r].barriers, __ATOMIC_ACQUIRE) >= mine) continue;
        if (n < 16) late += Sprintf("%s%d", n ? ", " : "", r);
        ++n;
      }
      if (n > 16) late += Sprintf(", ... (%d in all)", n);
      std::string msg = Sprintf("strata_cpu_barrier: rank %d timed out after %g s in host barrier %d; ranks that "
                                "have not arrived: %s",
                                g_pool.rank, g_timeout.load(), mine, late.empty() ? "(none)" : late.c_str());
      PoolAbort(g_pool.rank, msg);
      return Error(msg);
    }
    idle.Idle();
  }
  return 0;
}

STRATA_EXPORT int strata_cpu_dead_rank(void) {
  std::string why;
  int r = DeadRank(&why, /*force=*/true);
  if (r >= 0) SetLastError(why);
  return r;
}

STRATA_EXPORT void strata_cpu_set_active_ranks(uint64_t active) { g_active.store(active); }

STRATA_EXPORT void strata_cpu_leave(void) {
  if (g_pool.inited) {
    __atomic_store_n(&g_pool.hdr->ranks[g_pool.rank].state, int32_t(kRankLeft), __ATOMIC_RELEASE);
    Notify();
  }
}

STRATA_EXPORT void strata_cpu_describe_sync(const void* sync, int64_t barrier_slots, const char* layout) {
  SyncLayout d;
  d.sync = static_cast<const uint8_t*>(sync);
  d.barrier_slots = barrier_slots;
  const char* p = layout ? layout : "";
  while (*p) {  // "name base size;name base size;..."
    char name[128];
    long long base = 0, size = 0;
    int used = 0;
    if (sscanf(p, "%127s %lld %lld%n", name, &base, &size, &used) != 3) break;
    d.flags.push_back(SyncFlag{name, base, size});
    p += used;
    while (*p == ';' || *p == ' ') ++p;
  }
  std::lock_guard<std::mutex> lk(g_sync_mu);
  g_sync = std::move(d);
}

// SHMEM's aclshmem_malloc aligns only to 16 bytes (src/host/mem/shmem_mgr.cpp:241-245,
// `align_size = 16UL`); so does the model's, so that a host which needs more (a 64-byte signal
// line, a 32-byte DMA block) and forgets aclshmem_align fails here as it would on the NPU.
STRATA_EXPORT void* aclshmem_malloc(size_t size) { return AllocAligned(kMallocAlign, size, "aclshmem_malloc"); }

STRATA_EXPORT void* aclshmem_align(size_t alignment, size_t size) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kAlign) {
    Error(Sprintf("aclshmem_align(%zu, %zu): the alignment must be a power of two no larger than %llu", alignment,
                  size, (unsigned long long)kAlign));
    return nullptr;
  }
  return AllocAligned(std::max<uint64_t>(alignment, kMallocAlign), size, "aclshmem_align");
}

STRATA_EXPORT void* aclshmem_calloc(size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) {
    Error(Sprintf("aclshmem_calloc(%zu, %zu): size overflows", count, size));
    return nullptr;
  }
  void* p = aclshmem_malloc(count * size);
  if (p) std::memset(p, 0, count * size);
  return p;
}

STRATA_EXPORT void aclshmem_free(void* ptr) {
  if (!ptr) return;
  if (!g_pool.inited) {
    Error("aclshmem_free: not initialised");
    return;
  }
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  uint8_t* mine = HeapOf(g_pool.rank);
  uint8_t* p = static_cast<uint8_t*>(ptr);
  auto it = (p >= mine && p < mine + g_pool.heap_bytes) ? g_used.find(uint64_t(p - mine)) : g_used.end();
  if (it == g_used.end()) {
    Error(Sprintf("aclshmem_free(%p): not a live allocation of this rank's heap", ptr));
    return;
  }
  uint64_t off = it->first, sz = it->second;
  g_used.erase(it);
  g_used_bytes -= sz;
  auto next = g_free.lower_bound(off);
  if (next != g_free.end() && off + sz == next->first) {
    sz += next->second;
    g_free.erase(next);
  }
  auto prev = g_free.lower_bound(off);
  if (prev != g_free.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      prev->second += sz;
      return;
    }
  }
  g_free[off] = sz;
}

}  // extern "C"
