// SHMEM on the device: a rank's pe and the world (aclshmem_my_pe, aclshmem_n_pes), symmetric pointers
// (aclshmem_ptr: PeerPtr), signals (aclshmemx_signal_op: a scalar store plus a flush of its 64-byte
// line) and signal waits (aclshmem_signal_wait_until, with a deadline and a message naming the flag:
// STRATA_WAIT_NOTE, strata_cpu_describe_sync). In: the device calls of shmem.h; out: pointers,
// signal values, failures. Rules of runtime/README.md's table: "`aclshmem_ptr`" and "`aclshmem_ptr`,
// SDMA: `pe`" (PeerPtr), "signal alignment" (CheckSignalLine), "waits" (SignalWaitUntil,
// DescribeWait), "dead peers" (SignalWaitUntil).
#include "model_internal.h"

namespace strata_cpu {

namespace {

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

std::mutex g_sync_mu;  // Pool::sync
}  // namespace

// ---- SHMEM ----

STRATA_EXPORT int MyPe() {
  if (!CurPool().inited) FailStr("aclshmem_my_pe: no pool (strata_cpu_init missing)");
  return CurPool().rank;
}
STRATA_EXPORT int NPes() {
  if (!CurPool().inited) FailStr("aclshmem_n_pes: no pool (strata_cpu_init missing)");
  return CurPool().world;
}

STRATA_EXPORT void* PeerPtr(const void* local_sym, int pe, const char* op) {
  if (!CurPool().inited) FailStr(Sprintf("%s: no pool (strata_cpu_init missing)", op));
  const uint8_t* p = static_cast<const uint8_t*>(local_sym);
  uint8_t* mine = HeapOf(CurPool().rank);
  if (p < mine || p >= mine + CurPool().heap_bytes)
    FailStr(Sprintf("%s: %p is not in this rank's heap instance (rank %d heap [%p, %p)); it is %s", op, local_sym,
                    CurPool().rank, (void*)mine, (void*)(mine + CurPool().heap_bytes), GmWhere(local_sym).c_str()));
  if (pe < 0 || pe >= CurPool().world) FailStr(Sprintf("%s: pe %d is outside [0, %d)", op, pe, CurPool().world));
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
  if (!CurPool().sync.sync || a < CurPool().sync.sync || (a - CurPool().sync.sync) % kCacheLineBytes != 0) return;
  int64_t slot = (a - CurPool().sync.sync) / kCacheLineBytes;
  const int32_t* base = reinterpret_cast<const int32_t*>(CurPool().sync.sync);
  if (slot < CurPool().sync.barrier_slots) {
    *what = Sprintf("barrier slot of rank %lld", (long long)slot);
    std::string below = ge ? SlotsBelow(base, CurPool().sync.barrier_slots, value) : "";
    if (!below.empty()) *pending = "; ranks that have not arrived at this barrier: " + below;
    return;
  }
  for (const SyncFlag& f : CurPool().sync.flags) {
    if (slot < f.base || slot >= f.base + f.size) continue;
    *what = Sprintf("flag %s[%lld]", f.name.c_str(), (long long)(slot - f.base));
    std::string below = ge ? SlotsBelow(base + f.base * kSlotInts, f.size, value) : "";
    if (!below.empty())
      *pending = Sprintf("; slots of %s on rank %d not yet signalled in this call: %s (of %lld)", f.name.c_str(),
                         CurPool().rank, below.c_str(), (long long)f.size);
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
  CostScope scope(c, STRATA_COST_FLAG_WAIT);
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

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

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
  CurPool().sync = std::move(d);
}

}  // extern "C"
