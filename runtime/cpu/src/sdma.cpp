// SDMA: each core's SDMA queue (SHMEM's aclshmemx_sdma_put/get and aclshmemx_sdma_quiet). A post is
// split into 1 MiB SQEs that cost the issuing core time, queued to the core's copy engine (a
// persistent thread, SdmaEngine in model_internal.h, or the core's own waits: SdmaHelp), optionally
// delayed (STRATA_CPU_SDMA_DELAY_US, Mix64); the quiet waits until the queue is empty. Also
// SHMEM's MTE UB window (aclshmemx_set_mte_config). In: posts and quiets; out: copies landed,
// counters, failures. Rules of runtime/README.md's table: "`aclshmem_ptr`, SDMA: `pe` in
// `[0, world)`" and "SDMA overlap" (SdmaPost), "SDMA scratch" (CheckSdmaScratch), "SDMA queue
// depth" and "SQE cost" (SdmaPost, SdmaQuiet), "waits" (SdmaQuiet's deadline); "SDMA completion"
// is CoreMain's (launch.cpp).
#include "model_internal.h"
#if defined(__x86_64__)
#include <emmintrin.h>  // _mm_stream_si128, _mm_sfence (StreamCopy)
#endif

namespace strata_cpu {

namespace {

// A copy's latency in the model (none by default). STRATA_CPU_SDMA_DELAY_US=D delays every copy by
// D us, which exposes a signal raised before the quiet of the copy it announces. With
// STRATA_CPU_SDMA_DELAY_SEED=S as well, each copy's delay is drawn from [0, D] us by a hash of S,
// the rank, the core and the copy's index in the core's queue (reproducible for one S): copies of
// different cores and ranks then land in an order other than their posts', and a copy still in
// flight when a later access overtakes it (a barrier does not quiet the SDMA queue) is seen as a
// wrong result. On the NPU an SDMA copy's latency varies with size, engine load and links.
uint64_t Mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Busy-waits the calling core for `us` microseconds of wall time (the modelled AIV cost of SDMA
// descriptor writes), unwinding if the launch fails meanwhile.
void SpinCore(CoreState* c, double us, const char* op) {
  if (us <= 0) return;
  CostScope scope(c, STRATA_COST_SQE);
  if (c->costing) c->cost[STRATA_COST_SQE_CHARGED] += us * 1e-6;
  const double end = Now() + us * 1e-6;
  for (uint32_t k = 1; Now() < end; ++k)  // other cores of the thread run meanwhile
    if (CoreYield(false) || (k & 255u) == 0) AbortCheck(c, op);
}

// Scratch rules of the SDMA path (UB address, size) and the channel limit.
void CheckSdmaScratch(CoreState* c, const void* buf, uint32_t ub_size, const char* op) {
  if (c->idx >= STRATA_SDMA_MAX_CORE)
    FailStr(Sprintf("%s: core index %d >= %d has no SDMA channel (on hardware the request is silently skipped)",
                    op, c->idx, STRATA_SDMA_MAX_CORE));
  if (buf == nullptr) FailStr(Sprintf("%s: UB scratch buffer is null", op));
  if (ub_size < 64 || ub_size % 64 != 0)
    FailStr(Sprintf("%s: ub_size %u must be at least 64 and a multiple of 64 bytes", op, ub_size));
  const uint8_t* b = static_cast<const uint8_t*>(buf);
  bool in_arena = b >= c->ub && uint64_t(b - c->ub) + ub_size <= kUbBytes;
  bool ub_offset = reinterpret_cast<uintptr_t>(buf) + ub_size <= kUbBytes;  // hardware-style UB address
  if (!in_arena && !ub_offset)
    FailStr(Sprintf("%s: scratch %p (+%u bytes) is not inside the core's Unified Buffer", op, buf, ub_size));
}

SdmaEngine* Engine(CoreState* c) {
  SdmaEngine*& e = g_workers->sdma[c->idx];
  if (!e) {
    SdmaEngine* raw = new SdmaEngine;
    try {
      raw->worker = std::thread([raw] { raw->Run(); });
    } catch (const std::exception& ex) {
      delete raw;
      FailStr(Sprintf("cannot start the SDMA engine thread: %s", ex.what()));
    }
    e = raw;
  }
  return e;
}
}  // namespace

// An SDMA engine is a DMA engine: its copies pass no core's cache. A large post copied with
// memmove here would instead fill the CPU caches with bytes nobody reads soon and pay a read for
// ownership of every destination line, so posts of at least StreamBytes() = 8 MiB are copied with
// non-temporal stores. Measured on the 2-CPU host of docs/bench.md ("SDMA copies around the
// cache"), 1 MiB pieces of a copy of S bytes: S = 4 MiB 23.9 GB/s with memmove against 21.5 GB/s
// streamed, 16 MiB 12.6 against 18.4, 64 MiB 9.8 against 15.5. The threshold is a constant, not the
// cache size: on that host sysconf(_SC_LEVEL3_CACHE_SIZE) gives 256 MiB where lscpu shows 32.
// Only a speed matter: the bytes are memmove's (a post never overlaps its own source but in full,
// which is not streamed: SdmaPost).
uint64_t StreamBytes() { return uint64_t(8) << 20; }

namespace {
void StreamCopy(void* dst, const void* src, uint64_t bytes) {
#if defined(__x86_64__)
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const uint64_t head = std::min<uint64_t>(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  uint64_t i = head;
  for (; i + 64 <= bytes; i += 64) {  // SSE2 is in every x86-64
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
  _mm_sfence();  // the streamed stores are ordered before whatever the engine does next
#else
  std::memmove(dst, src, bytes);
#endif
}
}  // namespace

void SdmaCopyBytes(const SdmaJob& job) {
  CostScope scope(t_core, STRATA_COST_SDMA_BY_CORE);  // a core's wait or quiet runs it
  const double c0 = !t_core && g_costs.load(std::memory_order_relaxed) ? Now() : 0;
  if (job.stream)
    StreamCopy(job.dst, job.src, job.bytes);
  else
    std::memmove(job.dst, job.src, job.bytes);
  if (c0 > 0) g_engine_ns[job.core].fetch_add(uint64_t((Now() - c0) * 1e9), std::memory_order_relaxed);
}

// A core about to pause in a wait (flag, SyncAll, quiet) runs the next copy of its own SDMA queue
// if the engine has not started it (SdmaEngine::TakeOne); true if it ran one.
bool SdmaHelp() {
  CoreState* c = t_core;
  if (!c) return false;
  SdmaEngine* e = g_workers->sdma[c->idx];
  return e && e->TakeOne();
}

STRATA_EXPORT void SdmaPost(bool put, void* dst, const void* src, uint64_t bytes, const void* ub_buf,
                            uint32_t ub_size, int pe, const char* op) {
  CoreState* c = Cur(op);
  AbortCheck(c, op);
  CheckSdmaScratch(c, ub_buf, ub_size, op);
  if (pe < 0 || pe >= CurPool().world) FailStr(Sprintf("%s: pe %d is outside [0, %d)", op, pe, CurPool().world));
  void* d = dst;
  const void* s = src;
  if (put) {
    d = PeerPtr(dst, pe, op);
  } else {
    s = PeerPtr(src, pe, op);
  }
  CheckGmImpl(s, bytes, op);
  CheckGmImpl(d, bytes, op);
  const uintptr_t da = reinterpret_cast<uintptr_t>(d), sa = reinterpret_cast<uintptr_t>(s);
  if (bytes != 0 && da != sa && da < sa + bytes && sa < da + bytes)
    FailStr(Sprintf("%s: source and destination of this %llu-byte copy overlap by %llu bytes (destination %s "
                    "the source by %llu bytes): what an SDMA engine does with an overlapping copy is not "
                    "documented, so the model refuses it (a copy onto its own range is allowed)",
                    op, (unsigned long long)bytes,
                    (unsigned long long)(bytes - (da > sa ? da - sa : sa - da)), da > sa ? "after" : "before",
                    (unsigned long long)(da > sa ? da - sa : sa - da)));
  LedgerRead(s, bytes, op);
  // The local symmetric range must stay inside its heap instance too.
  if (put ? (OwnerOf(d) != pe || static_cast<uint8_t*>(d) + bytes > HeapOf(pe) + CurPool().heap_bytes)
          : (OwnerOf(s) != pe || static_cast<const uint8_t*>(s) + bytes > HeapOf(pe) + CurPool().heap_bytes))
    FailStr(Sprintf("%s: %llu bytes from the symmetric address run past the end of rank %d's heap", op,
                    (unsigned long long)bytes, pe));
  if (bytes == 0) return;
  // The post is split into SQEs of at most 1 MiB, each one entry of the core's SQ until a quiet.
  const uint64_t sqes = (bytes + STRATA_SDMA_SQE_BYTES - 1) / STRATA_SDMA_SQE_BYTES;
  if (c->sdma_sqes_held + sqes > STRATA_SDMA_SQ_DEPTH)
    FailStr(Sprintf("%s: SDMA queue of core %d holds %llu SQEs > depth %d: quiet earlier (%llu SQEs since the "
                    "last aclshmemx_sdma_quiet + %llu for this %llu-byte post in 1 MiB SQEs; on hardware the SQ "
                    "ring overflows unchecked)",
                    op, c->idx, (unsigned long long)(c->sdma_sqes_held + sqes), STRATA_SDMA_SQ_DEPTH,
                    (unsigned long long)c->sdma_sqes_held, (unsigned long long)sqes, (unsigned long long)bytes));
  c->sdma_sqes_held += sqes;
  Count(c->idx, STRATA_CTR_SDMA, bytes);
  Count(c->idx, STRATA_CTR_SDMA_POSTS, 1);
  Count(c->idx, STRATA_CTR_SDMA_SQES, sqes);
  if (OwnerOf(s) != CurPool().rank) Count(c->idx, STRATA_CTR_REMOTE_READ, bytes);
  if (OwnerOf(d) != CurPool().rank) Count(c->idx, STRATA_CTR_REMOTE_WRITE, bytes);
  SpinCore(c, c->launch->sdma_sqe_us * double(sqes), op);  // the AIV's descriptor work, per SQE
  SdmaEngine* e = Engine(c);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lk(e->mu);
    const Launch* L = c->launch;
    const double now = L->sdma_delay_us ? Now() : 0;
    const bool stream = bytes >= StreamBytes() && da != sa;  // overlaps are refused above
    for (uint64_t k = 0; k < sqes; ++k) {
      uint64_t off = k * STRATA_SDMA_SQE_BYTES, n = std::min<uint64_t>(STRATA_SDMA_SQE_BYTES, bytes - off);
      double due = 0;
      if (L->sdma_delay_us) {
        uint64_t us = L->sdma_delay_us;
        if (L->sdma_delay_seeded)  // the copy's index in this core's queue over the process's launches
          us = Mix64(L->sdma_delay_seed ^ Mix64((uint64_t(CurPool().rank) << 40) ^ (uint64_t(c->idx) << 32) ^
                                                e->posted)) % (us + 1);
        due = now + double(us) * 1e-6;
      }
      e->queue.push_back(SdmaJob{static_cast<uint8_t*>(d) + off, static_cast<const uint8_t*>(s) + off, n, c->idx,
                                 due, L->spin, stream});
      ++e->posted;
    }
  }
  // With a CPU for every thread of every rank (Launch::spin) the engine thread starts at once and
  // the copy overlaps what the core does next. Otherwise the CPUs are oversubscribed: waking a
  // thread per post costs a context switch (and a time slice when it preempts a core), so the
  // copies wait in the queue for the core's next wait or quiet, which runs them (SdmaHelp): still
  // after the post, in queue order, before the quiet returns, as an engine may.
  if (c->launch->spin) e->cv_work.notify_one();
  LedgerPost(c->idx, d, bytes);
  ++c->sdma_unquieted;
}

STRATA_EXPORT void SetMteUb(uint64_t offset, uint32_t bytes) {
  CoreState* c = Cur("aclshmemx_set_mte_config");
  if (offset + bytes > kUbBytes)
    FailStr(Sprintf("aclshmemx_set_mte_config: UB region [%llu, +%u) is outside the %u-byte Unified Buffer",
                    (unsigned long long)offset, bytes, kUbBytes));
  c->mte_ub_off = offset;
  c->mte_ub_bytes = bytes;
}
STRATA_EXPORT void GetMteUb(uint64_t* offset, uint32_t* bytes) {
  CoreState* c = Cur("SHMEM MTE config");
  *offset = c->mte_ub_off;
  *bytes = c->mte_ub_bytes;
}

STRATA_EXPORT void SdmaQuiet(const void* ub_buf, uint32_t ub_size, const char* op) {
  CoreState* c = Cur(op);
  CheckSdmaScratch(c, ub_buf, ub_size, op);
  SdmaEngine* e = g_workers->sdma[c->idx];  // none if this core never posted a copy
  CostScope scope(c, STRATA_COST_QUIET);
  double t_quiet = Tracing() ? Now() : 0;
  if (c->sdma_sqes_held > 0) {
    // The quiet is one more SQE (an 8-byte flag write) in the same queue, then a poll loop.
    if (c->sdma_sqes_held + 1 > STRATA_SDMA_SQ_DEPTH)
      FailStr(Sprintf("%s: SDMA queue of core %d holds %llu SQEs > depth %d: quiet earlier (the quiet's flag SQE "
                      "does not fit behind the %llu posted since the last quiet)",
                      op, c->idx, (unsigned long long)(c->sdma_sqes_held + 1), STRATA_SDMA_SQ_DEPTH,
                      (unsigned long long)c->sdma_sqes_held));
    SpinCore(c, c->launch->sdma_sqe_us, op);
  }
  if (e) {  // polled: other cores of this thread run while this one pauses
    double deadline = -1;
    CoreWaiter waiter(c->launch);
    for (;;) {
      uint64_t left;
      {
        std::lock_guard<std::mutex> lk(e->mu);
        left = e->posted - e->done;
      }
      if (left == 0) break;
      AbortCheck(c, op);
      if (e->TakeOne()) continue;  // the engine had not started it: the quiet runs it
      double now = Now();
      if (deadline < 0) deadline = now + c->launch->timeout;
      if (now > deadline)
        FailStr(Sprintf("%s timed out after %g s with %llu copies outstanding", op, c->launch->timeout,
                        (unsigned long long)left));
      waiter.Pause();
    }
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  LedgerQuiet(c->idx);
  c->sdma_unquieted = 0;
  c->sdma_sqes_held = 0;
  if (t_quiet > 0) TraceAdd(c->idx, t_quiet, Now(), "sdma quiet", "wait");
}

}  // namespace strata_cpu
