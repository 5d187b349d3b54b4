// The pool: what stands in for the NPUs' pooled HBM. Ranks are processes; strata_cpu_init maps one
// POSIX shared-memory segment (a header page: abort state, host barrier, per-rank liveness slots,
// the SDMA ledger; then `world` equal heaps, rank r's heap being its symmetric heap instance), and
// strata_cpu_finalize unmaps it. Also the model's error reporting (strata_cpu_last_error), the
// clock, and the pool-wide abort (PoolAbort/ReadAbort: the first failure's rank and message, which
// every rank's waits see). In: the host's rank, world, segment name and heap size; out: the mapped
// pool and error strings. A process may map several pools (one per communicator); each has an id,
// one is current (CurPool()), and strata_cpu_select_pool makes another current between launches. Rules of runtime/README.md's table: none directly; the segment
// checks (private to the user, mode 0600, sizes) are described in its "Ranks are processes".
#include "model_internal.h"

namespace strata_cpu {

namespace {

std::mutex g_err_mu;
std::string g_last_error;
std::string g_abort_copy;

}  // namespace

namespace {
Pool g_no_pool;                                  // current while no pool is: inited == false
std::map<int, std::unique_ptr<Pool>> g_pools;   // by id
int g_next_pool_id = 1;
constexpr int kMaxPools = 256;                   // per process
}  // namespace
Pool* g_cur = &g_no_pool;

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

int32_t AbortState() {
  return CurPool().hdr ? __atomic_load_n(&CurPool().hdr->abort_state, __ATOMIC_ACQUIRE) : 0;
}
// Marks the pool aborted; the first caller's rank and message win.
void PoolAbort(int rank, const std::string& msg) {
  if (!CurPool().hdr) return;
  int32_t expected = 0;
  if (!__atomic_compare_exchange_n(&CurPool().hdr->abort_state, &expected, 1, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  CurPool().hdr->abort_rank = rank;
  snprintf(CurPool().hdr->abort_msg, sizeof CurPool().hdr->abort_msg, "%s", msg.c_str());
  __atomic_store_n(&CurPool().hdr->abort_state, 2, __ATOMIC_RELEASE);
  Notify();
}
// Waits (briefly) for the abort message to be complete.
void ReadAbort(int* rank, std::string* msg) {
  for (int i = 0; i < 100000 && AbortState() == 1; ++i) sched_yield();
  *rank = CurPool().hdr->abort_rank;
  *msg = AbortState() == 2 ? std::string(CurPool().hdr->abort_msg) : std::string("(message not available)");
}

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT int strata_cpu_init(int rank, int world, const char* shm_name, uint64_t heap_bytes, int create) {
  if (g_pools.size() >= size_t(kMaxPools))
    return Error(Sprintf("strata_cpu_init: this process already maps %d pools (close a communicator first)",
                         kMaxPools));
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
  std::unique_ptr<Pool> p(new Pool);
  p->id = g_next_pool_id++;
  p->inited = true;
  p->rank = rank;
  p->world = world;
  p->name = name;
  p->base = static_cast<uint8_t*>(base);
  p->total = total;
  p->hdr = hdr;
  p->heaps = p->base + kHeaderBytes;
  p->heap_bytes = heap_bytes;
  p->free_blocks[0] = heap_bytes;
  {
    // made current under the launch lock: a launch of another thread keeps its pool to the end
    std::lock_guard<std::mutex> launch(g_workers->launch_mu);
    g_cur = p.get();
    g_pools[p->id] = std::move(p);
  }
  RankSlot& me = hdr->ranks[rank];
  __atomic_store_n(&me.state, int32_t(kRankAbsent), __ATOMIC_RELEASE);
  __atomic_store_n(&me.pid, int32_t(getpid()), __ATOMIC_RELEASE);
  __atomic_store_n(&me.start, SelfStart(), __ATOMIC_RELEASE);
  __atomic_store_n(&me.state, int32_t(kRankJoined), __ATOMIC_RELEASE);
  return 0;
}

STRATA_EXPORT int strata_cpu_finalize(int unlink_segment) {
  if (!CurPool().inited) return Error("strata_cpu_finalize: not initialised");
  Pool* p = g_cur;
  // the last pool: join this process's core and SDMA threads (a later pool starts new ones)
  if (g_pools.size() == 1) StopWorkers(true);
  std::string name = p->name;
  __atomic_store_n(&p->hdr->ranks[p->rank].state, int32_t(kRankLeft), __ATOMIC_RELEASE);
  {
    std::lock_guard<std::mutex> launch(g_workers->launch_mu);
    DCacheForget(p->base, p->base + p->total);
    munmap(p->base, p->total);
    g_cur = &g_no_pool;
    g_pools.erase(p->id);
  }
  if (unlink_segment && shm_unlink(name.c_str()) != 0)
    return Error(Sprintf("strata_cpu_finalize: shm_unlink(%s): %s", name.c_str(), strerror(errno)));
  return 0;
}

STRATA_EXPORT int strata_cpu_current_pool(void) { return CurPool().id; }

STRATA_EXPORT int strata_cpu_select_pool(int id) {
  if (t_core) return Error("strata_cpu_select_pool: called from inside a kernel");
  std::lock_guard<std::mutex> launch(g_workers->launch_mu);   // never in the middle of a launch
  auto it = g_pools.find(id);
  if (it == g_pools.end()) return Error(Sprintf("strata_cpu_select_pool(%d): no such pool in this process", id));
  g_cur = it->second.get();
  return 0;
}

STRATA_EXPORT const char* strata_cpu_last_error(void) {
  std::lock_guard<std::mutex> lk(g_err_mu);
  return g_last_error.c_str();
}

STRATA_EXPORT void* strata_cpu_heap_base(void) { return CurPool().inited ? HeapOf(CurPool().rank) : nullptr; }
STRATA_EXPORT uint64_t strata_cpu_heap_bytes(void) { return CurPool().heap_bytes; }

STRATA_EXPORT int strata_cpu_aborted(void) { return AbortState() != 0; }

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

}  // extern "C"
