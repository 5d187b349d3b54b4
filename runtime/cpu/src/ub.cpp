// The Unified Buffer: each vector core's 192 KiB on-chip buffer, here an arena per core kept across
// launches. Every launch starts with a UB of 0xff (garbage: NaN for floats, -1 for integers), as
// what UB holds at a launch is not documented; only the 256-byte chunks some write reached since the
// last refill are refilled (UbMark, UbRefill; UbWrote, called by every UB write path of
// kernel_operator.h). In: UB writes and bounds failures from kernel_operator.h; out: the arena and
// UB offsets. Rules of runtime/README.md's table: "UB holds garbage when a kernel starts" (UbRefill,
// UbWrote), "UB bounds" (FailUb).
#include "model_internal.h"

namespace strata_cpu {

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
namespace {

constexpr uint64_t kUbChunk = 256;
constexpr int kUbChunkWords = int((kUbBytes / kUbChunk + 63) / 64);
static_assert(kUbBytes % kUbChunk == 0, "UB chunks");
uint64_t g_ub_dirty[STRATA_MAX_CORES][kUbChunkWords] = {};
}  // namespace

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
uint64_t UbRefill(int idx, uint8_t* ub) {  // every dirty chunk back to 0xff, in runs; bytes refilled
  uint64_t* w = g_ub_dirty[idx];
  uint64_t k = 0, filled = 0;
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
    filled += (e - k) * kUbChunk;
    k = e;
  }
  std::memset(w, 0, sizeof(g_ub_dirty[idx]));
  return filled;
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

}  // namespace strata_cpu
