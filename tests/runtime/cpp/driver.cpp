// Host driver for the CPU-model tests: sets up pools, forks ranks, launches the kernels of
// libtestkernels.so and writes results (binary dumps in OUT_DIR, key=value lines on stdout) for
// the Python tests to compare against independently computed expectations.
//
//   driver exchange OUT_DIR W C N        driver atomic OUT_DIR W C M ROUNDS
//   driver syncall OUT_DIR C ROUNDS      driver numeric OUT_DIR N   (reads OUT_DIR/numeric_in.bin)
//   driver fail OUT_DIR CASE W C TIMEOUT
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
}

static std::string g_out;
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
  void* p = aclshmem_calloc(1, bytes);
  if (!p) Die(rank, "aclshmem_calloc");
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
    uint8_t* flags = Alloc(r, C * 32);
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
    Dump(std::string("exchange_flags_") + std::to_string(r) + ".bin", flags, C * 32);
    printf("rank %d: heap_used %llu\n", r, (unsigned long long)strata_cpu_heap_used());
    PrintCounters(r);
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
    uint8_t* slots = Alloc(r, C * 4);
    uint8_t* sums = Alloc(r, size_t(rounds) * C * 4);
    if (launch_syncall(C, slots, sums, rounds) != 0) Die(r, "launch_syncall");
    Dump("syncall_sums.bin", sums, size_t(rounds) * C * 4);
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
    strata_cpu_describe_sync(buf + 2048, W, layout);  // names the flags of case 21
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
  fprintf(stderr, "unknown scenario %s\n", what.c_str());
  return 1;
}
