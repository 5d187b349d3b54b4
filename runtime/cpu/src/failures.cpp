// Rule-check failures: what the NPU does silently (garbage, a hang) the model stops with a message.
// A failing core records the launch's first failure ("rank R core C strata:LINE kernel K: ..."),
// aborts the pool and unwinds (FailStr, RecordFailure, Unwind); a call outside a kernel aborts the
// process. AbortCheck stops a core whose launch failed, whose pool another rank aborted, or whose
// host got SIGINT/SIGTERM. Also the GM bounds check every GM access goes through (CheckGmImpl),
// the name tables of messages (kernel types, dtypes) and GM addresses (GmWhere: rank, heap offset).
// In: a rule's message; out: the failure. Rules of runtime/README.md's table: "GM bounds"
// (CheckGmImpl), "dead peers" (AbortCheck: a peer's failure aborts this rank's waits).
#include "model_internal.h"

namespace strata_cpu {

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

namespace {

std::string Prefix(const CoreState* c) {
  char line[32];
  if (c->line > 0)
    snprintf(line, sizeof line, "%d", c->line);
  else
    snprintf(line, sizeof line, "?");
  return Sprintf("rank %d core %d strata:%s kernel %s: ", CurPool().rank, c->idx, line, c->launch->kernel);
}
}  // namespace

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
  if (first) PoolAbort(CurPool().rank, msg);
  Notify();  // waiting cores (SyncAll, quiets, flags) re-check and unwind
}

[[noreturn]] void Unwind() { throw CoreUnwind{}; }

namespace {

[[noreturn]] void FailOutsideCore(const std::string& body) {
  std::string msg = Sprintf("rank %d (not on a core): %s", CurPool().rank, body.c_str());
  SetLastError(msg);
  PoolAbort(CurPool().rank, msg);
  fprintf(stderr, "strata_cpu: %s\n", msg.c_str());
  fflush(stderr);
  std::abort();
}
}  // namespace

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

std::string GmWhere(const void* p) {
  int owner = OwnerOf(p);
  if (owner < 0) return Sprintf("%p (not in the pool)", p);
  uint64_t off = static_cast<const uint8_t*>(p) - HeapOf(owner);
  return Sprintf("rank %d heap offset %llu (0x%llx)", owner, (unsigned long long)off, (unsigned long long)off);
}

void CheckGmImpl(const void* p, uint64_t bytes, const char* op) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (!CurPool().inited) FailStr(Sprintf("%s: no pool (strata_cpu_init missing)", op));
  if (b < CurPool().heaps || b > HeapsEnd() || bytes > uint64_t(HeapsEnd() - b)) {
    const char* where = (b >= CurPool().base && b < CurPool().heaps) ? " (the pool's header page)" : "";
    FailStr(Sprintf("%s: GM range [%p, +%llu bytes) is outside the pool's heaps [%p, %p)%s", op, p,
                    (unsigned long long)bytes, (void*)CurPool().heaps, (void*)HeapsEnd(), where));
  }
}

STRATA_EXPORT void Fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string body = Format(fmt, ap);
  va_end(ap);
  FailStr(body);
}

STRATA_EXPORT void CheckGm(const void* p, uint64_t bytes, const char* op) { CheckGmImpl(p, bytes, op); }

STRATA_EXPORT void CheckAbort(const char* op) { AbortCheck(Cur(op), op); }

}  // namespace strata_cpu
