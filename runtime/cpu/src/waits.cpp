// Waits and the idler: how a core (or the host) that waits for another agent spends the time. On the
// NPU a wait spins in hardware; here Notify (every write a waiter may wait for) bumps a futex word in
// the pool header, and Idler yields, then sleeps on it (SpinSec, OversubSpinSec). Also the waits
// that are not SHMEM flag waits: SyncAll (the hard sync of all cores of a launch), the polling
// D-cache flush (PollHint) and the host barrier (strata_cpu_barrier). In: the launch's cores or the
// ranks arriving; out: a completed barrier or a failure naming who has not arrived.
// Rules of runtime/README.md's table: "`SyncAll` only in kernels declared KERNEL_TYPE_MIX_AIV_1_0",
// "`SyncAll` that a core which already returned can never join" (SyncAllCores), "waits" (deadlines:
// SyncAllCores, strata_cpu_barrier).
#include "model_internal.h"

namespace strata_cpu {

long Futex(uint32_t* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, addr, op, val, ts, nullptr, 0);
}

// Something a waiter may wait for happened (a GM write by a core, a signal, an SDMA copy done, a
// SyncAll completed, a core returned, a failure or abort, a host barrier): wakes the threads of
// every rank that sleep in Idler::Idle. Costs an atomic add; a futex wake only when one sleeps.
void Notify() {
  PoolHeader* h = CurPool().hdr;
  if (!h) return;
  __atomic_add_fetch(&h->wake_epoch, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&h->wake_sleepers, __ATOMIC_SEQ_CST) != 0 &&
      __atomic_exchange_n(&h->wake_sleepers, 0, __ATOMIC_SEQ_CST) != 0)
    Futex(&h->wake_epoch, FUTEX_WAKE, INT_MAX, nullptr);
}

double SpinSec() {
  static const double s = [] {
    const char* e = getenv("STRATA_CPU_SPIN_US");
    return e ? std::max(0.0, strtod(e, nullptr)) * 1e-6 : 100e-6;
  }();
  return s;
}
std::atomic<double> g_spin_off_until{0};
double OversubSpinSec() {
  static const double s = [] {
    const char* e = getenv("STRATA_CPU_OVERSUB_SPIN_US");
    return (e ? std::max(0.0, strtod(e, nullptr)) : 0.0) * 1e-6;
  }();
  return s;
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
  CostScope scope(c, STRATA_COST_SYNCALL);
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

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT int strata_cpu_barrier(void) {
  if (!CurPool().inited) return Error("strata_cpu_barrier: not initialised");
  PoolHeader* h = CurPool().hdr;
  int32_t mine = __atomic_add_fetch(&h->ranks[CurPool().rank].barriers, 1, __ATOMIC_ACQ_REL);
  int32_t gen = __atomic_load_n(&h->bar_gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&h->bar_count, 1, __ATOMIC_ACQ_REL) == CurPool().world) {
    __atomic_store_n(&h->bar_count, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&h->bar_gen, 1, __ATOMIC_ACQ_REL);
    Notify();  // the waiters below
    return 0;
  }
  double start = Now(), deadline = start + CurPool().timeout.load();
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
      std::string msg = Sprintf("strata_cpu_barrier: rank %d: %s", CurPool().rank, gone.c_str());
      PoolAbort(CurPool().rank, msg);
      return Error(msg);
    }
    if (Now() > deadline) {
      std::string late;
      int n = 0;
      for (int r = 0; r < CurPool().world; ++r) {
        if (__atomic_load_n(&h->ranks[r].barriers, __ATOMIC_ACQUIRE) >= mine) continue;
        if (n < 16) late += Sprintf("%s%d", n ? ", " : "", r);
        ++n;
      }
      if (n > 16) late += Sprintf(", ... (%d in all)", n);
      std::string msg = Sprintf("strata_cpu_barrier: rank %d timed out after %g s in host barrier %d; ranks that "
                                "have not arrived: %s",
                                CurPool().rank, CurPool().timeout.load(), mine, late.empty() ? "(none)" : late.c_str());
      PoolAbort(CurPool().rank, msg);
      return Error(msg);
    }
    idle.Idle();
  }
  return 0;
}

}  // extern "C"
