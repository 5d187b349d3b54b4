// Launches and cores: the kernel launch (<<<blocks>>> on the NPU; LaunchBlocks here) and the life of
// one vector core (CoreMain: fresh state, a UB of 0xff, the kernel, the checks at its return). Also
// the device hooks of a launch (GetBlockIdx, GetBlockNum, KERNEL_TASK_TYPE_DEFAULT, strata: line
// markers). In: the kernel, its block count and context; out: 0 or the launch's first failure.
// Rules of runtime/README.md's table: "core count" (LaunchBlocks), "kernel type"
// (DeclareKernelType), "UB holds garbage when a kernel starts", "SDMA completion" and "dirty at
// return" (CoreMain).
#include "model_internal.h"

namespace strata_cpu {

thread_local CoreState* t_core = nullptr;

void CoreMain(Launch* L, int idx, BlockFn fn, void* ctx) {
  CoreState cs;
  cs.launch = L;
  cs.idx = idx;
  cs.ub = g_arenas[idx];
  cs.costing = g_costs.load(std::memory_order_relaxed);
  if (cs.costing) cs.cost[STRATA_COST_START] = Now();
  // UB starts as garbage: NaN for floats, -1 for integers (see g_ub_dirty)
  const uint64_t refilled = UbRefill(idx, cs.ub);
  if (cs.costing) {
    cs.cost[STRATA_COST_UB_REFILL_BYTES] = double(refilled);
    cs.cost[STRATA_COST_KERNEL] = Now();
  }
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
  if (cs.costing) {
    cs.cost[STRATA_COST_END] = Now();
    CostsCoreDone(cs);
  }
  Notify();  // a SyncAll waiting for a core that returned fails now
  t_core = nullptr;
}

// =============================================================================================
// C++ interface (strata_cpu.h)

STRATA_EXPORT int LaunchBlocks(uint32_t blocks, const char* kernel_name, BlockFn fn, void* ctx) {
  if (t_core) return Error("LaunchBlocks: nested launch from inside a kernel");
  const bool costs = g_costs.load(std::memory_order_relaxed);
  const double t_enter = costs ? Now() : 0;
  // one launch at a time per process; taken before the pool checks, so that a launch queued
  // behind another sees a pool that was aborted or finalized meanwhile
  WorkerPool* pool = g_workers;
  std::unique_lock<std::mutex> launch_lock(pool->launch_mu);
  if (!CurPool().inited) return Error("LaunchBlocks: no pool (call strata_cpu_init first)");
  if (blocks == 0 || blocks > STRATA_MAX_CORES)
    return Error(Sprintf("LaunchBlocks(%s): %u blocks is outside [1, %d]", kernel_name ? kernel_name : "?",
                         blocks, STRATA_MAX_CORES));
  int aiv = CurPool().aiv_cores.load();
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
  L.spin = int(blocks) <= T && CurPool().world * T <= MachineCpus();
  L.oversub = !L.spin && int(blocks) <= T && OversubSpinSec() > 0 && OneSchedGroup();
  L.timeout = CurPool().timeout.load();
  if (const char* d = getenv("STRATA_CPU_SDMA_DELAY_US")) L.sdma_delay_us = uint32_t(strtoul(d, nullptr, 10));
  if (const char* d = getenv("STRATA_CPU_SDMA_DELAY_SEED")) {
    L.sdma_delay_seeded = true;
    L.sdma_delay_seed = strtoull(d, nullptr, 10);
  }
  if (const char* d = getenv("STRATA_CPU_SDMA_SQE_US")) L.sdma_sqe_us = std::max(0.0, strtod(d, nullptr));
  if (costs) {
    CostsLaunch(STRATA_LCOST_ENTER, t_enter);
    CostsLaunch(STRATA_LCOST_THREADS, T);
    CostsLaunch(STRATA_LCOST_BLOCKS, blocks);
    CostsLaunch(STRATA_LCOST_SQE_US, L.sdma_sqe_us);
    for (uint32_t i = 0; i < blocks; ++i) g_engine_ns[i].store(0);
  }
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
  if (costs) CostsLaunch(STRATA_LCOST_DISPATCH, Now());
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
  if (costs) CostsLaunch(STRATA_LCOST_EXIT, Now());
  if (L.failed.load()) return Error(L.first_failure);
  return 0;
}

STRATA_EXPORT void SetLine(int line) {
  if (!t_core) return;
  if (line != t_core->trace_line && Tracing()) TraceStage(t_core, line);
  t_core->line = line;
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

}  // namespace strata_cpu
