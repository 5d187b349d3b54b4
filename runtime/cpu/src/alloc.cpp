// The symmetric allocator: aclshmem_malloc / aclshmem_calloc / aclshmem_align / aclshmem_free over
// this rank's heap instance, a deterministic first fit with coalescing, so that equal calls give
// equal offsets on every rank (what makes the heap symmetric, as SHMEM's is). In: sizes and
// alignments; out: pointers into the rank's heap (or null and an error). Rule of runtime/README.md's
// table: "allocation alignment" (AllocAligned: 16 bytes only for aclshmem_malloc, as SHMEM's).
#include "model_internal.h"

namespace strata_cpu {

// ---------------------------------------------------------------------------------------------
// Symmetric allocator: deterministic first fit with coalescing over [0, heap_bytes).

std::mutex g_alloc_mu;



namespace {

constexpr uint64_t kMallocAlign = 16;  // SHMEM aclshmem_malloc: shmem_mgr.cpp:241-245 (align_size = 16)

// First fit of `size` bytes (rounded up to `align`) at an offset that is a multiple of `align`; the
// bytes skipped before it stay free. Deterministic: equal calls give equal offsets on every rank.
void* AllocAligned(uint64_t align, size_t size, const char* api) {
  if (!CurPool().inited) {
    Error(Sprintf("%s: not initialised", api));
    return nullptr;
  }
  if (size == 0) {
    Error(Sprintf("%s(0): zero-byte request", api));
    return nullptr;
  }
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  uint64_t need = (uint64_t(size) + align - 1) / align * align;
  for (auto it = CurPool().free_blocks.begin(); it != CurPool().free_blocks.end(); ++it) {
    uint64_t off = it->first, sz = it->second;
    uint64_t at = (off + align - 1) / align * align;
    if (at - off > sz || sz - (at - off) < need) continue;
    CurPool().free_blocks.erase(it);
    if (at > off) CurPool().free_blocks[off] = at - off;
    if (off + sz > at + need) CurPool().free_blocks[at + need] = off + sz - (at + need);
    CurPool().used_blocks[at] = need;
    CurPool().used_bytes += need;
    return HeapOf(CurPool().rank) + at;
  }
  uint64_t free_bytes = 0, largest = 0;
  for (auto& f : CurPool().free_blocks) {
    free_bytes += f.second;
    largest = std::max(largest, f.second);
  }
  Error(Sprintf("%s(%llu): symmetric heap exhausted: request of %llu bytes (%llu-byte aligned), %llu bytes free "
                "(largest free block %llu) of %llu",
                api, (unsigned long long)size, (unsigned long long)need, (unsigned long long)align,
                (unsigned long long)free_bytes, (unsigned long long)largest, (unsigned long long)CurPool().heap_bytes));
  return nullptr;
}
}  // namespace

}  // namespace strata_cpu


using namespace strata_cpu;

extern "C" {

STRATA_EXPORT uint64_t strata_cpu_heap_used(void) {
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  return CurPool().used_bytes;
}

// SHMEM's aclshmem_malloc aligns only to 16 bytes (src/host/mem/shmem_mgr.cpp:241-245,
// `align_size = 16UL`); so does the model's, so that a host which needs more (a 64-byte signal
// line, a 32-byte DMA block) and forgets aclshmem_align fails here as it would on the NPU.
STRATA_EXPORT void* aclshmem_malloc(size_t size) { return AllocAligned(kMallocAlign, size, "aclshmem_malloc"); }

STRATA_EXPORT void* aclshmem_align(size_t alignment, size_t size) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kAlign) {
    Error(Sprintf("aclshmem_align(%zu, %zu): the alignment must be a power of two no larger than %llu", alignment,
                  size, (unsigned long long)kAlign));
    return nullptr;
  }
  return AllocAligned(std::max<uint64_t>(alignment, kMallocAlign), size, "aclshmem_align");
}

STRATA_EXPORT void* aclshmem_calloc(size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) {
    Error(Sprintf("aclshmem_calloc(%zu, %zu): size overflows", count, size));
    return nullptr;
  }
  void* p = aclshmem_malloc(count * size);
  if (p) std::memset(p, 0, count * size);
  return p;
}

STRATA_EXPORT void aclshmem_free(void* ptr) {
  if (!ptr) return;
  if (!CurPool().inited) {
    Error("aclshmem_free: not initialised");
    return;
  }
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  uint8_t* mine = HeapOf(CurPool().rank);
  uint8_t* p = static_cast<uint8_t*>(ptr);
  auto it = (p >= mine && p < mine + CurPool().heap_bytes) ? CurPool().used_blocks.find(uint64_t(p - mine)) : CurPool().used_blocks.end();
  if (it == CurPool().used_blocks.end()) {
    Error(Sprintf("aclshmem_free(%p): not a live allocation of this rank's heap", ptr));
    return;
  }
  uint64_t off = it->first, sz = it->second;
  CurPool().used_blocks.erase(it);
  CurPool().used_bytes -= sz;
  auto next = CurPool().free_blocks.lower_bound(off);
  if (next != CurPool().free_blocks.end() && off + sz == next->first) {
    sz += next->second;
    CurPool().free_blocks.erase(next);
  }
  auto prev = CurPool().free_blocks.lower_bound(off);
  if (prev != CurPool().free_blocks.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      prev->second += sz;
      return;
    }
  }
  CurPool().free_blocks[off] = sz;
}

}  // extern "C"
