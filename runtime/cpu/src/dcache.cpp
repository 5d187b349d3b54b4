// The scalar data cache of each vector core: GlobalTensor::GetValue/SetValue go through a private,
// non-coherent, write-back cache of 64-byte lines (DMA and signals do not). A cached line keeps the
// memory it was loaded from, so that a change by any other agent is seen. In: scalar loads and
// stores, DataCacheCleanAndInvalid; out: the core's view of GM, write-backs, failures. Rules of
// runtime/README.md's table: "stale read" (ScalarLoad), "one scalar writer per line" (ScalarStore),
// "lost write" (LineCleanInvalidate); "dirty at return" is checked by CoreMain (launch.cpp).
#include "model_internal.h"

namespace strata_cpu {

std::unordered_map<uintptr_t, DLine> g_dcache[STRATA_MAX_CORES];

void DCacheForget(const uint8_t* lo, const uint8_t* hi) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(lo), b = reinterpret_cast<uintptr_t>(hi);
  for (auto& c : g_dcache)
    for (auto it = c.begin(); it != c.end();) it = (it->first >= a && it->first < b) ? c.erase(it) : std::next(it);
}

// ---- scalar data cache (see g_dcache) ----
namespace {

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

}  // namespace

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

STRATA_EXPORT void ScalarLoad(const void* p, void* out, uint64_t bytes, const char* op) {
  CoreState* c = Cur(op);
  CostScope scope(c, STRATA_COST_DCACHE);
  if (c->costing) c->cost[STRATA_COST_DCACHE_OPS] += 1;
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
  CostScope scope(c, STRATA_COST_DCACHE);
  if (c->costing) c->cost[STRATA_COST_DCACHE_OPS] += 1;
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
  CostScope scope(c, STRATA_COST_DCACHE);
  if (c->costing) c->cost[STRATA_COST_DCACHE_OPS] += 1;
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

}  // namespace strata_cpu
