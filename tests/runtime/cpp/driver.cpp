// Host driver for the CPU-model tests: sets up pools, forks ranks, launches the kernels of
// libtestkernels.so and writes results (binary dumps in OUT_DIR, key=value lines on stdout) for
// the Python tests to compare against independently computed expectations.
//
//   driver exchange OUT_DIR W C N        driver atomic OUT_DIR W C M ROUNDS
//   driver syncall OUT_DIR C ROUNDS      driver numeric OUT_DIR N   (reads OUT_DIR/numeric_in.bin)
//   driver fail OUT_DIR CASE W C TIMEOUT
//   driver reuse OUT_DIR W N             driver relaunch OUT_DIR
//   driver stale_host OUT_DIR          driver progress OUT_DIR C N
//   driver big_put OUT_DIR N SKEW
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "strata_cpu.h"

extern "C" {
int launch_exchange(uint32_t, uint8_t*, uint8_t*, uint8_t*, uint8_t*, uint8_t*, uint32_t);
int launch_atomic(uint32_t, uint8_t*, uint8_t*, uint8_t*, uint32_t, uint32_t);
int launch_syncall(uint32_t, uint8_t*, uint8_t*, uint32_t);
int launch_numeric(uint8_t*, uint8_t*, uint32_t);
int launch_fail(uint32_t, uint8_t*, int32_t);
int launch_sdma_progress(uint32_t, uint8_t*, uint8_t*, uint8_t*, uint8_t*, uint8_t*, uint32_t);
int launch_big_put(uint8_t*, uint8_t*, uint32_t, uint32_t);
}

static std::string g_out;
static std::string g_pool_name;  // of the pool RunRanks made
static const uint64_t kHeap = 4u << 20;

static void Dump(const std::string& name, const void* p, size_t bytes) {
  std::string path = g_out + "/" + name;
  FILE* f = fopen(path.c_str(), "wb");
  if (!f || fwrite(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot write %s\n", path.c_str());
    exit(3);
  }
  fclose(f);
}

static void Die(int rank, const char* what) {
  printf("rank %d: %s failed: %s\n", rank, what, strata_cpu_last_error());
  fflush(stdout);
  exit(2);
}

static uint8_t* Alloc(int rank, size_t bytes) {
  // as stratac's hosts allocate: aclshmem_align(512, ...) (aclshmem_malloc aligns to 16 bytes only), zeroed
  void* p = aclshmem_align(STRATA_HEAP_ALIGN, bytes);
  if (!p) Die(rank, "aclshmem_align");
  memset(p, 0, bytes);
  printf("rank %d: alloc %zu at %llu\n", rank, bytes,
         (unsigned long long)((uint8_t*)p - (uint8_t*)strata_cpu_heap_base()));
  return static_cast<uint8_t*>(p);
}

static void PrintCounters(int rank) {
  uint64_t ctr[STRATA_MAX_CORES * STRATA_NUM_CTRS];
  int n = strata_cpu_read_counters(ctr, STRATA_MAX_CORES);
  printf("rank %d: cores %d\n", rank, n);
  for (int c = 0; c < n; ++c) {
    printf("rank %d: counters %d", rank, c);
    for (int k = 0; k < STRATA_NUM_CTRS; ++k) printf(" %llu", (unsigned long long)ctr[c * STRATA_NUM_CTRS + k]);
    printf("\n");
  }
}

// Creates the pool, forks W rank processes that open it and run body(rank), waits for them.
static int RunRanks(int world, uint64_t heap, double timeout, const std::function<int(int)>& body) {
  char name[64];
  snprintf(name, sizeof name, "/strata_test_%d_%ld", (int)getpid(), (long)time(nullptr));
  g_pool_name = name;
  if (strata_cpu_init(0, world, name, heap, 1) != 0 || strata_cpu_finalize(0) != 0) {
    printf("pool: %s\n", strata_cpu_last_error());
    return 2;
  }
  fflush(stdout);
  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      if (strata_cpu_init(r, world, name, heap, 0) != 0) Die(r, "strata_cpu_init");
      strata_cpu_set_timeout(timeout);
      strata_cpu_reset_counters();
      int rc = body(r);
      fflush(stdout);
      strata_cpu_finalize(0);
      exit(rc);
    }
    kids.push_back(pid);
  }
  int worst = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc > worst) worst = rc;
  }
  shm_unlink(name);
  return worst;
}

static int Exchange(int W, int C, uint32_t n) {
  return RunRanks(W, kHeap, 20.0, [&](int r) {
    size_t chunk = size_t(n) * 4;
    uint8_t* src = Alloc(r, C * chunk);
    uint8_t* mte = Alloc(r, W * C * chunk);
    uint8_t* sdma = Alloc(r, W * C * chunk);
    uint8_t* get = Alloc(r, C * chunk);
    uint8_t* flags = Alloc(r, C * 64);
    float* s = reinterpret_cast<float*>(src);
    for (int c = 0; c < C; ++c)
      for (uint32_t i = 0; i < n; ++i) s[c * n + i] = float(r * 1000000 + c * 10000 + int(i));
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    if (launch_exchange(C, src, mte, sdma, get, flags, n) != 0) Die(r, "launch_exchange");
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    char name[64];
    snprintf(name, sizeof name, "exchange_mte_%d.bin", r);
    Dump(name, mte, W * C * chunk);
    snprintf(name, sizeof name, "exchange_sdma_%d.bin", r);
    Dump(name, sdma, W * C * chunk);
    snprintf(name, sizeof name, "exchange_get_%d.bin", r);
    Dump(name, get, C * chunk);
    Dump(std::string("exchange_flags_") + std::to_string(r) + ".bin", flags, C * 64);
    printf("rank %d: heap_used %llu\n", r, (unsigned long long)strata_cpu_heap_used());
    PrintCounters(r);
    return 0;
  });
}

static int Progress(int C, uint32_t n) {
  return RunRanks(2, kHeap, 10.0, [&](int r) {
    uint8_t* src = Alloc(r, C * n * 4);
    uint8_t* dst = Alloc(r, C * n * 4);
    uint8_t* got = Alloc(r, C * n * 4);
    uint8_t* flags = Alloc(r, 2 * C * 64);
    uint8_t* one = Alloc(r, 64);
    float* s = reinterpret_cast<float*>(src);
    for (uint32_t i = 0; i < C * n; ++i) s[i] = float(r * 1000000 + int(i));
    *reinterpret_cast<float*>(one) = 1.0f;
    // twice: the first launch starts the SDMA engine threads (one finds its copy queued already);
    // the second finds them asleep
    for (int round = 0; round < 2; ++round) {
      memset(dst, 0, C * n * 4);
      memset(got, 0, C * n * 4);
      memset(flags, 0, 2 * C * 64);
      if (strata_cpu_barrier() != 0) Die(r, "barrier");
      if (launch_sdma_progress(C, src, dst, got, flags, one, n) != 0) Die(r, "launch_sdma_progress");
      if (strata_cpu_barrier() != 0) Die(r, "barrier");
      if (r == 1) Dump("progress_got_" + std::to_string(round) + ".bin", got, C * n * 4);
    }
    return 0;
  });
}

// Two ranks, one SDMA put of n floats each to the other (at float `skew` of dst); dumps dst after
// the launch.
static int BigPut(uint32_t n, uint32_t skew) {
  const uint64_t src_bytes = uint64_t(n) * 4, dst_bytes = (uint64_t(n) + skew + 1) * 4;
  return RunRanks(2, (src_bytes + dst_bytes + (1u << 20)) / 512 * 512, 20.0, [&](int r) {
    uint8_t* src = Alloc(r, src_bytes);
    uint8_t* dst = Alloc(r, dst_bytes);
    float* s = reinterpret_cast<float*>(src);
    for (uint32_t i = 0; i < n; ++i) s[i] = float(r * 4000000 + int(i));
    memset(dst, 0, dst_bytes);
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    if (launch_big_put(src, dst, n, skew) != 0) Die(r, "launch_big_put");
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    Dump("big_put_dst_" + std::to_string(r) + ".bin", dst, dst_bytes);
    return 0;
  });
}

static int Atomic(int W, int C, uint32_t m, uint32_t rounds) {
  return RunRanks(W, kHeap, 20.0, [&](int r) {
    uint8_t* f = Alloc(r, m * 4);
    uint8_t* i = Alloc(r, m * 4);
    uint8_t* mx = Alloc(r, m * 4);
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    if (launch_atomic(C, f, i, mx, m, rounds) != 0) Die(r, "launch_atomic");
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    if (r == 0) {
      Dump("atomic_f.bin", f, m * 4);
      Dump("atomic_i.bin", i, m * 4);
      Dump("atomic_max.bin", mx, m * 4);
    }
    return 0;
  });
}

static int SyncAllTest(int C, uint32_t rounds) {
  return RunRanks(1, kHeap, 20.0, [&](int r) {
    const size_t stride = (rounds + 15) / 16 * 16;  // core c's sums: row c, 64-byte lines of its own
    uint8_t* slots = Alloc(r, C * 64);
    uint8_t* sums = Alloc(r, stride * C * 4);
    if (launch_syncall(C, slots, sums, rounds) != 0) Die(r, "launch_syncall");
    Dump("syncall_sums.bin", sums, stride * C * 4);
    return 0;
  });
}

static int Numeric(uint32_t n) {
  return RunRanks(1, kHeap, 20.0, [&](int r) {
    size_t in_bytes = size_t(n) * 20, out_bytes = size_t(n) * (7 * 2 + 7 * 2 + 7 * 4 + 7 * 4 + 7 * 2 + 8 + 14 + 14 + 20 + 4);
    uint8_t* in = Alloc(r, in_bytes);
    uint8_t* out = Alloc(r, out_bytes);
    std::string path = g_out + "/numeric_in.bin";
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(in, 1, in_bytes, f) != in_bytes) Die(r, "reading numeric_in.bin");
    fclose(f);
    if (launch_numeric(in, out, n) != 0) Die(r, "launch_numeric");
    Dump("numeric_out.bin", out, out_bytes);
    return 0;
  });
}

static int FailCase(int which, int W, int C, double timeout) {
  return RunRanks(W, kHeap, timeout, [&](int r) {
    uint8_t* buf = Alloc(r, 4096);
    char layout[64];
    snprintf(layout, sizeof layout, "go %d 4", W);
    strata_cpu_describe_sync(buf + 2048, W, layout);  // names the flags of case 21 (64 B per slot)
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = launch_fail(C, buf, which);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
    if (rc == 0)
      printf("rank %d: LAUNCH_OK %.3f\n", r, dt);
    else
      printf("rank %d: LAUNCH_FAILED %.3f %s\n", r, dt, strata_cpu_last_error());
    printf("rank %d: aborted %d\n", r, strata_cpu_aborted());
    if (strata_cpu_aborted()) printf("rank %d: abort_message %s\n", r, strata_cpu_abort_message());
    // A failed pool refuses later launches.
    if (rc != 0 && launch_fail(1, buf, -1) == 0) printf("rank %d: RELAUNCH_OK\n", r);
    return 0;
  });
}

// One rank, one core: the host writes an int at buf + 3072 between launches that read it with
// GetValue (case 29; 30 invalidates the line first). The core's data cache persists across the
// launches: with the flush every launch reads the host's value; without it the second read of a
// cached line that the host changed fails as a stale read.
static int StaleHost() {
  return RunRanks(1, kHeap, 10.0, [&](int r) {
    uint8_t* buf = Alloc(r, 4096);
    int32_t* x = reinterpret_cast<int32_t*>(buf + 3072);
    const int cases[] = {30, 30, 29, 29};
    for (int k = 0; k < 4; ++k) {
      *x = 100 + k;
      int rc = launch_fail(1, buf, cases[k]);
      printf("rank %d: launch %d case %d rc %d %s\n", r, k, cases[k], rc, rc ? strata_cpu_last_error() : "");
      if (rc) break;
    }
    return 0;
  });
}

// Threads of this process (the model's persistent core and SDMA workers, and the main thread).
static int CountThreads() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// One exchange launch on C cores with buffers sized for kMaxC cores; checks what every core
// received (MTE and SDMA from every rank, SDMA get from the next rank, flags) and returns the
// number of wrong values.
static const int kMaxC = 8;
struct ExchangeBufs {
  uint8_t *src, *mte, *sdma, *get, *flags;
};
static ExchangeBufs ExchangeAlloc(int r, int W, uint32_t n) {
  size_t chunk = size_t(n) * 4;
  ExchangeBufs b{Alloc(r, kMaxC * chunk), Alloc(r, W * kMaxC * chunk), Alloc(r, W * kMaxC * chunk),
                 Alloc(r, kMaxC * chunk), Alloc(r, kMaxC * 64)};
  float* s = reinterpret_cast<float*>(b.src);
  for (int c = 0; c < kMaxC; ++c)
    for (uint32_t i = 0; i < n; ++i) s[c * n + i] = float(r * 1000000 + c * 10000 + int(i));
  return b;
}
static long ExchangeOnce(int r, int W, int C, uint32_t n, const ExchangeBufs& b) {
  size_t chunk = size_t(n) * 4;
  if (strata_cpu_barrier() != 0) Die(r, "barrier");
  memset(b.mte, 0, W * kMaxC * chunk);
  memset(b.sdma, 0, W * kMaxC * chunk);
  memset(b.get, 0, kMaxC * chunk);
  memset(b.flags, 0, kMaxC * 64);
  if (strata_cpu_barrier() != 0) Die(r, "barrier");
  if (launch_exchange(C, b.src, b.mte, b.sdma, b.get, b.flags, n) != 0) Die(r, "launch_exchange");
  if (strata_cpu_barrier() != 0) Die(r, "barrier");
  long bad = 0;
  const float* mte = reinterpret_cast<const float*>(b.mte);
  const float* sdma = reinterpret_cast<const float*>(b.sdma);
  const float* get = reinterpret_cast<const float*>(b.get);
  const int32_t* flags = reinterpret_cast<const int32_t*>(b.flags);
  int next = (r + 1) % W;
  for (int p = 0; p < W; ++p)
    for (int c = 0; c < C; ++c)
      for (uint32_t i = 0; i < n; ++i) {
        float want = float(p * 1000000 + c * 10000 + int(i));
        size_t k = (size_t(p) * C + c) * n + i;
        bad += mte[k] != want;
        bad += sdma[k] != want;
        if (p == next) bad += get[size_t(c) * n + i] != want;
      }
  for (int c = 0; c < C; ++c) bad += flags[c * 16] != W || flags[c * 16 + 1] != 0 || flags[c * 16 + 2] != 0;
  return bad;
}

// Launch after launch on one pool with changing core counts (the workers are reused: the thread
// count stays at main + cores + SDMA engines of the widest launch), counters and a trace of a
// narrower launch after wider ones, then finalize (the workers are joined) and the pool again.
static int Reuse(int W, uint32_t n) {
  return RunRanks(W, kHeap, 20.0, [&](int r) {
    ExchangeBufs b = ExchangeAlloc(r, W, n);
    const int cores[] = {2, 5, 3, 8, 1, 8, 4, 6, 2, 7};
    for (int round = 0; round < 3; ++round)
      for (int C : cores) printf("rank %d: exchange %d bad %ld\n", r, C, ExchangeOnce(r, W, C, n, b));
    printf("rank %d: threads_pool %d\n", r, CountThreads());
    strata_cpu_reset_counters();
    std::string trace = g_out + "/reuse_trace_" + std::to_string(r) + ".jsonl";
    strata_cpu_trace_enable(1);
    printf("rank %d: exchange 3 bad %ld\n", r, ExchangeOnce(r, W, 3, n, b));
    strata_cpu_trace_enable(0);
    if (strata_cpu_trace_write(trace.c_str()) != 0) Die(r, "trace_write");
    PrintCounters(r);
    if (strata_cpu_barrier() != 0) Die(r, "barrier");
    if (strata_cpu_finalize(0) != 0) Die(r, "finalize");
    printf("rank %d: threads_after_finalize %d\n", r, CountThreads());
    if (strata_cpu_init(r, W, g_pool_name.c_str(), kHeap, 0) != 0) Die(r, "strata_cpu_init again");
    ExchangeBufs b2 = ExchangeAlloc(r, W, n);
    printf("rank %d: again exchange 4 bad %ld\n", r, ExchangeOnce(r, W, 4, n, b2));
    printf("rank %d: threads_again %d\n", r, CountThreads());
    return 0;
  });
}

// One rank: launches that fail (a core breaks a rule while the others wait in SyncAll; a core
// returns with an SDMA copy still in flight; a core returns while the others wait in SyncAll),
// each on a pool of its own, each followed by a launch on a fresh pool that must work.
static int Relaunch() {
  return RunRanks(1, kHeap, 10.0, [&](int r) {
    if (strata_cpu_finalize(0) != 0) Die(r, "finalize");
    const int cases[] = {1 /* DataCopy of 36 bytes */, 6 /* SDMA without quiet */, 15 /* SyncAll after exit */};
    for (int which : cases) {
      std::string failed = g_pool_name + "_f" + std::to_string(which);
      if (strata_cpu_init(0, 1, failed.c_str(), kHeap, 1) != 0) Die(r, "strata_cpu_init (pool to fail)");
      strata_cpu_set_timeout(10.0);
      uint8_t* buf = Alloc(r, 4096);
      int rc = launch_fail(4, buf, which);
      printf("rank %d: case %d rc %d %s\n", r, which, rc, rc ? strata_cpu_last_error() : "");
      printf("rank %d: case %d refused %d\n", r, which, launch_fail(1, buf, -1) != 0);
      if (strata_cpu_finalize(1) != 0) Die(r, "finalize (failed pool)");
      std::string fresh = g_pool_name + "_ok" + std::to_string(which);
      if (strata_cpu_init(0, 1, fresh.c_str(), kHeap, 1) != 0) Die(r, "strata_cpu_init (fresh pool)");
      strata_cpu_set_timeout(10.0);
      ExchangeBufs b = ExchangeAlloc(r, 1, 100);
      printf("rank %d: case %d then exchange bad %ld\n", r, which, ExchangeOnce(r, 1, 4, 100, b));
      if (strata_cpu_finalize(1) != 0) Die(r, "finalize (fresh pool)");
    }
    if (strata_cpu_init(0, 1, g_pool_name.c_str(), kHeap, 0) != 0) Die(r, "strata_cpu_init again");
    return 0;
  });
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: driver SCENARIO OUT_DIR ...\n");
    return 1;
  }
  std::string what = argv[1];
  g_out = argv[2];
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto arg = [&](int i) { return i < argc ? atof(argv[i]) : 0.0; };
  if (what == "exchange") return Exchange(int(arg(3)), int(arg(4)), uint32_t(arg(5)));
  if (what == "atomic") return Atomic(int(arg(3)), int(arg(4)), uint32_t(arg(5)), uint32_t(arg(6)));
  if (what == "syncall") return SyncAllTest(int(arg(3)), uint32_t(arg(4)));
  if (what == "numeric") return Numeric(uint32_t(arg(3)));
  if (what == "fail") return FailCase(int(arg(3)), int(arg(4)), int(arg(5)), arg(6));
  if (what == "reuse") return Reuse(int(arg(3)), uint32_t(arg(4)));
  if (what == "relaunch") return Relaunch();
  if (what == "stale_host") return StaleHost();
  if (what == "progress") return Progress(int(arg(3)), uint32_t(arg(4)));
  if (what == "big_put") return BigPut(uint32_t(arg(3)), uint32_t(arg(4)));
  fprintf(stderr, "unknown scenario %s\n", what.c_str());
  return 1;
}
