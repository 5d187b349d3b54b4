// The SDMA ledger: on the NPU only aclshmemx_sdma_quiet says a core's SDMA copies have landed, so a
// flag announcing them must be raised after the quiet. The ledger (in the pool header, shared by the
// ranks) records the copies a signal announces and the signal numbers each rank has seen, so that a
// read of another rank's announced copy through a too-early flag fails whatever the timing. In:
// posts, signals, satisfied waits, quiets and reads; out: failures. Rule of runtime/README.md's
// table: "a flag raised before the quiet of the SDMA copies it announces" (LedgerSignal,
// LedgerQuiet, LedgerSeen, LedgerRead).
#include "model_internal.h"

namespace strata_cpu {

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
namespace {

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

Ledger* TheLedger() { return reinterpret_cast<Ledger*>(CurPool().base + kLedgerOffset); }
struct LedgerLock {
  Ledger* l;
  explicit LedgerLock(Ledger* x) : l(x) {
    while (__atomic_exchange_n(&l->lock, 1, __ATOMIC_ACQUIRE) != 0) sched_yield();
  }
  ~LedgerLock() { __atomic_store_n(&l->lock, 0, __ATOMIC_RELEASE); }
};
uint64_t PoolOff(const void* p) { return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - CurPool().base); }

}  // namespace

// Launch start (one per process): forget this rank's entries and what it had seen.
void LedgerLaunchStart() {
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  for (int i = 0; i < STRATA_MAX_CORES; ++i) {
    g_posted[i].clear();
    g_announced[i].clear();
  }
  for (int r = 0; r < CurPool().world && r < kMaxWorld; ++r) CurPool().seen[r].store(-1);
  Ledger* l = TheLedger();
  LedgerLock g(l);
  if (CurPool().world > kLedgerRanks) l->off = 1;
  for (LedgerEntry& e : l->e)
    if (e.state != 0 && e.rank == CurPool().rank) {
      e.state = 0;
      --l->announced;
    }
}
void LedgerPost(int core, const void* dst, uint64_t bytes) {
  CostScope scope(t_core, STRATA_COST_LEDGER);
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  std::vector<Posted>& v = g_posted[core];
  uint64_t d = PoolOff(dst);
  if (!v.empty() && v.back().dst + v.back().bytes == d) v.back().bytes += bytes;   // coalesce
  else v.push_back(Posted{d, bytes});
}
// A signal of this rank to `flag` (a pool address): announces every core's unquieted copies.
void LedgerSignal(const void* flag) {
  CostScope scope(t_core, STRATA_COST_LEDGER);
  Ledger* l = TheLedger();
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  LedgerLock g(l);
  if (l->off) return;
  const int32_t seq = ++l->seq[CurPool().rank];
  for (int c = 0; c < STRATA_MAX_CORES; ++c) {
    for (const Posted& p : g_posted[c]) {
      int slot = -1;
      for (int i = 0; i < kLedgerEntries && slot < 0; ++i)
        if (l->e[i].state == 0) slot = i;
      if (slot < 0) {
        l->off = 1;
        return;
      }
      l->e[slot] = LedgerEntry{1, CurPool().rank, c, seq, 0, 0, p.dst, p.bytes};
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
      f = LedgerFlag{key, CurPool().rank, seq};
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
  CostScope scope(t_core, STRATA_COST_LEDGER);
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
  for (int r = 0; r < CurPool().world; ++r) {
    const int32_t got = r == writer ? wseq : l->seq[r];
    int32_t cur = CurPool().seen[r].load();
    while (got > cur && !CurPool().seen[r].compare_exchange_weak(cur, got)) {
    }
  }
}
// The quiet of `core`: its copies have landed; announced ones record the signal number now.
void LedgerQuiet(int core) {
  CostScope scope(t_core, STRATA_COST_LEDGER);
  std::lock_guard<std::mutex> lk(g_ledger_mu);
  g_posted[core].clear();
  if (g_announced[core].empty()) return;
  Ledger* l = TheLedger();
  LedgerLock g(l);
  for (int i : g_announced[core])
    if (l->e[i].state == 1 && l->e[i].rank == CurPool().rank && l->e[i].core == core) {
      l->e[i].state = 2;
      l->e[i].quiet = l->seq[CurPool().rank];
    }
  g_announced[core].clear();
}
// A read of [p, p + bytes) by the calling core (see above).
void LedgerRead(const void* p, uint64_t bytes, const char* op) {
  CostScope scope(t_core, STRATA_COST_LEDGER);
  Ledger* l = TheLedger();
  if (!CurPool().inited || __atomic_load_n(&l->announced, __ATOMIC_ACQUIRE) == 0 || bytes == 0) return;
  const uint64_t lo = PoolOff(p), hi = lo + bytes;
  std::string why;
  {
    LedgerLock g(l);
    if (l->off) return;
    for (const LedgerEntry& e : l->e) {
      if (e.state == 0 || e.rank == CurPool().rank || e.dst >= hi || lo >= e.dst + e.bytes) continue;
      const int32_t seen = CurPool().seen[e.rank].load();
      if (seen < e.announce || (e.state == 2 && seen > e.quiet)) continue;
      why = Sprintf("%s: reads %s, which an SDMA copy of rank %d core %d writes, and the newest signal this rank "
                    "has seen from rank %d (its signal %d) was raised before that copy's aclshmemx_sdma_quiet: a "
                    "flag raised before the quiet of the SDMA copy it announces (SHMEM orders nothing between an "
                    "SDMA copy and a later signal; only the quiet says the copy landed, shmem_device_sdma.h)%s",
                    op, GmWhere(CurPool().base + std::max(lo, e.dst)).c_str(), e.rank, e.core, e.rank, seen,
                    e.state == 1 ? "; the quiet has not returned yet" : "");
      break;
    }
  }
  if (!why.empty()) FailStr(why);
}

}  // namespace strata_cpu
