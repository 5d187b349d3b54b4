// The device library of stratac's generated kernels: work partitioning, tiled UB copies and
// reductions, SDMA copies, barriers and flags. Written only against the public Ascend C and
// SHMEM-for-Ascend APIs so that the same file compiles with CANN for the NPU and with g++ against
// the CPU model in runtime/cpu (which defines STRATA_CPU_MODEL).
#ifndef STRATA_DEVICE_H
#define STRATA_DEVICE_H

#include "kernel_operator.h"
#include "shmem.h"

#ifdef STRATA_CPU_MODEL
#include "strata_cpu.h"
// Tells the CPU model which .strata line the core is executing, for its error messages.
#define STRATA_LINE(n) ::strata_cpu::SetLine(n)
// Tells the CPU model what the next wait is for (`what` over `count` slots at `group`, waiting on
// slot `index`), so that a timeout can say which flag and who has not arrived.
#define STRATA_WAIT_NOTE(what, group, count, index) ::strata_cpu::NoteWait(what, group, count, index)
#else
#define STRATA_LINE(n) ((void)0)
#define STRATA_WAIT_NOTE(what, group, count, index) ((void)0)
#endif

namespace strata {

enum class Red { kSum, kMax, kMin };
enum class Via { kAiv, kSdma, kAuto };

constexpr uint32_t kBlockBytes = 32;       // DataCopy granularity
constexpr uint32_t kSdmaScratchBytes = 64; // SDMA descriptor scratch in UB (>= 64, 64-aligned)
// SHMEM splits every SDMA post into descriptors (SQEs) of at most 1 MiB in the core's one SQ
// (shmem_device_sdma.hpp:339-401), whose depth is not in SHMEM's source and is not checked there.
// A core quiets before the SQEs it has posted since its last quiet would exceed kSdmaSqeLimit: below
// the CPU model's STRATA_SDMA_SQ_DEPTH (256, UNVERIFIED) with room for the quiet's own flag SQE.
// A quiet's poll budget on the NPU is 10^6 polls, after which it returns silently; bounding the
// bytes in flight per core (kSdmaSqeLimit MiB) also bounds how long a quiet has to wait.
constexpr int64_t kSdmaSqeBytes = 1 << 20;
constexpr uint32_t kSdmaSqeLimit = 192;    // outstanding SQEs per core before a quiet

__aicore__ inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
__aicore__ inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }

// Address of element `off` of a symmetric buffer, on rank `pe`.
template <typename T>
__aicore__ inline __gm__ T* At(__gm__ T* base, int64_t off, int64_t pe) {
  return reinterpret_cast<__gm__ T*>(aclshmem_ptr(base + off, static_cast<int>(pe)));
}

// Splits the elements a stage moves, laid end to end in program order, evenly over the cores by
// bytes (in whole 32-byte blocks), so that every core finishes together however uneven the
// individual copies are. Take() walks the items and returns this core's share of each.
class Partition {
 public:
  __aicore__ inline Partition(int64_t total, int64_t elemBytes) {
    const int64_t per = kBlockBytes / elemBytes;
    const int64_t blocks = (total + per - 1) / per;
    const int64_t c = AscendC::GetBlockIdx(), n = AscendC::GetBlockNum();
    lo_ = Min(total, blocks * c / n * per);
    hi_ = Min(total, blocks * (c + 1) / n * per);
  }
  __aicore__ inline bool Take(int64_t count, int64_t& off, int64_t& len) {
    const int64_t a = Max(lo_, cursor_), b = Min(hi_, cursor_ + count);
    off = a - cursor_;
    len = b - a;
    cursor_ += count;
    return len > 0;
  }

 private:
  int64_t lo_ = 0, hi_ = 0, cursor_ = 0;
};

// GM -> UB of m elements: DataCopy for whole 32-byte blocks, DataCopyPad otherwise.
template <typename T>
__aicore__ inline void LoadTile(AscendC::LocalTensor<T>& dst, AscendC::GlobalTensor<T>& src, uint32_t m) {
  if ((m * sizeof(T)) % kBlockBytes == 0) {
    AscendC::DataCopy(dst, src, m);
  } else {
    AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(m * sizeof(T)), 0, 0, 0};
    AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, T(0)};
    AscendC::DataCopyPad(dst, src, p, pad);
  }
}

// UB -> GM of m elements.
template <typename T>
__aicore__ inline void StoreTile(AscendC::GlobalTensor<T>& dst, AscendC::LocalTensor<T>& src, uint32_t m) {
  if ((m * sizeof(T)) % kBlockBytes == 0) {
    AscendC::DataCopy(dst, src, m);
  } else {
    AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(m * sizeof(T)), 0, 0, 0};
    AscendC::DataCopyPad(dst, src, p);
  }
}

// A buffer of element type D seen as elements of the kernel's type T (copies move bytes).
template <typename T, typename D>
__aicore__ inline __gm__ T* Reinterpret(__gm__ D* p) {
  return reinterpret_cast<__gm__ T*>(p);
}
template <typename D, typename T>
__aicore__ inline constexpr int64_t Ratio() {
  static_assert(sizeof(D) % sizeof(T) == 0, "a buffer's elements must be whole multiples of the kernel type");
  return static_cast<int64_t>(sizeof(D) / sizeof(T));
}

// One core's data mover. UB holds a double-buffered copy queue, double-buffered reduce input and
// output queues (each only if the kernel needs it) and a small scratch area.
template <typename T>
class Mover {
 public:
  __aicore__ inline void Init(AscendC::TPipe* pipe, uint32_t tileBytes, uint32_t copyTiles,
                              uint32_t reduceTiles, uint32_t scratchBytes) {
    pipe_ = pipe;
    tile_ = tileBytes / sizeof(T);
    if (copyTiles) pipe->InitBuffer(copyQ_, copyTiles, tileBytes);
    if (reduceTiles) {
      pipe->InitBuffer(inQ_, reduceTiles / 2, tileBytes);
      pipe->InitBuffer(outQ_, reduceTiles / 2, tileBytes);
    }
    pipe->InitBuffer(scratch_, scratchBytes);
  }

  __aicore__ inline int64_t Tile() const { return tile_; }

  // dst[0, n) = src[0, n); each side is (local symmetric address, rank). `via` picks the engine;
  // kAuto sends this call to SDMA when it moves at least `sdmaThreshold` bytes. The call is one
  // core's piece of a copy (one SDMA post), so the threshold applies per post: what pays for a
  // post's fixed descriptor work on the core is the bytes that post moves (dsl/README.md, engines).
  __aicore__ inline void Copy(Via via, __gm__ T* dst, int64_t dstPe, __gm__ T* src, int64_t srcPe,
                              int64_t n, int64_t myPe, int64_t sdmaThreshold) {
    if (n <= 0) return;
    if (via == Via::kAuto) {
      via = n * static_cast<int64_t>(sizeof(T)) >= sdmaThreshold ? Via::kSdma : Via::kAiv;
    }
    if (via == Via::kSdma) {
      SdmaCopy(dst, dstPe, src, srcPe, n, myPe);
    } else {
      AivCopy(At(dst, 0, dstPe), At(src, 0, srcPe), n);
    }
  }

  // Reduce on write: dst op= src through UB, the write an atomic DMA accumulate, so that several
  // cores and ranks may accumulate into the same elements at once.
  template <Red op>
  __aicore__ inline void AccumulateInto(__gm__ T* dst, int64_t dstPe, __gm__ T* src, int64_t srcPe,
                                        int64_t n) {
    if (n <= 0) return;
    if (op == Red::kSum) {
      AscendC::SetAtomicAdd<T>();
    } else if (op == Red::kMax) {
      AscendC::SetAtomicMax<T>();
    } else {
      AscendC::SetAtomicMin<T>();
    }
    AivCopy(At(dst, 0, dstPe), At(src, 0, srcPe), n);
    AscendC::SetAtomicNone();
  }

  // Tile reduction: call Fold once per source (first = true for the first), then Store.
  template <Red op>
  __aicore__ inline void Fold(__gm__ T* src, uint32_t m, bool first) {
    AscendC::GlobalTensor<T> g;
    g.SetGlobalBuffer(src, m);
    AscendC::LocalTensor<T> in = inQ_.template AllocTensor<T>();
    LoadTile(in, g, m);
    inQ_.EnQue(in);
    in = inQ_.template DeQue<T>();
    if (first) {
      acc_ = outQ_.template AllocTensor<T>();
      AscendC::DataCopy(acc_, in, AlignUp(m));
    } else if (op == Red::kSum) {
      AscendC::Add(acc_, acc_, in, static_cast<int32_t>(m));
    } else if (op == Red::kMax) {
      AscendC::Max(acc_, acc_, in, static_cast<int32_t>(m));
    } else {
      AscendC::Min(acc_, acc_, in, static_cast<int32_t>(m));
    }
    inQ_.FreeTensor(in);
  }

  __aicore__ inline void Store(__gm__ T* dst, uint32_t m) {
    AscendC::GlobalTensor<T> g;
    g.SetGlobalBuffer(dst, m);
    outQ_.EnQue(acc_);
    AscendC::LocalTensor<T> out = outQ_.template DeQue<T>();
    StoreTile(g, out, m);
    outQ_.FreeTensor(out);
  }

  // Waits until every SDMA copy this core posted has completed, and gives back the event id the
  // SHMEM SDMA calls used since the last quiet.
  __aicore__ inline void Quiet() {
    if (sqes_ == 0) return;
    AscendC::LocalTensor<T> s = scratch_.template Get<T>();
    aclshmemx_sdma_quiet(reinterpret_cast<__ubuf__ T*>(s.GetPhyAddr()), kSdmaScratchBytes,
                         static_cast<uint32_t>(syncId_));
    pipe_->template ReleaseEventID<AscendC::HardEvent::MTE3_MTE2>(syncId_);
    sqes_ = 0;
  }

 private:
  __aicore__ inline uint32_t AlignUp(uint32_t m) const {
    const uint32_t per = kBlockBytes / sizeof(T);
    return (m + per - 1) / per * per;
  }

  // GM -> UB -> GM through the double-buffered copy queue (both addresses already translated).
  __aicore__ inline void AivCopy(__gm__ T* dst, __gm__ T* src, int64_t n) {
    AscendC::GlobalTensor<T> d, s;
    d.SetGlobalBuffer(dst, n);
    s.SetGlobalBuffer(src, n);
    for (int64_t i = 0; i < n; i += tile_) {
      const uint32_t m = static_cast<uint32_t>(Min(tile_, n - i));
      AscendC::LocalTensor<T> t = copyQ_.template AllocTensor<T>();
      AscendC::GlobalTensor<T> si = s[i];
      LoadTile(t, si, m);
      copyQ_.EnQue(t);
      t = copyQ_.template DeQue<T>();
      AscendC::GlobalTensor<T> di = d[i];
      StoreTile(di, t, m);
      copyQ_.FreeTensor(t);
    }
  }

  // SDMA copies are GM -> GM; the data moves off the core, but every post costs its core the
  // descriptor writes, pipeline drains and a whole-D-cache flush of SHMEM's post path, per 1 MiB
  // SQE (docs/npu.md, "SDMA"). A put names the destination by its local symmetric address and rank;
  // a get names the source that way. The SHMEM sync_id (an MTE3_MTE2 event id SHMEM sets and waits
  // on internally) comes from TPipe::AllocEventID, so no TQue holds it; it is released at Quiet.
  __aicore__ inline void SdmaCopy(__gm__ T* dst, int64_t dstPe, __gm__ T* src, int64_t srcPe,
                                  int64_t n, int64_t myPe) {
    AscendC::LocalTensor<T> s = scratch_.template Get<T>();
    __ubuf__ T* ub = reinterpret_cast<__ubuf__ T*>(s.GetPhyAddr());
    const int64_t maxElems = kSdmaSqeLimit * kSdmaSqeBytes / static_cast<int64_t>(sizeof(T));
    for (int64_t i = 0; i < n; i += maxElems) {  // posts of at most kSdmaSqeLimit SQEs
      const int64_t m = Min(maxElems, n - i);
      const uint32_t sqes = static_cast<uint32_t>((m * static_cast<int64_t>(sizeof(T)) + kSdmaSqeBytes - 1) /
                                                  kSdmaSqeBytes);
      if (sqes_ + sqes > kSdmaSqeLimit) Quiet();
      if (sqes_ == 0) syncId_ = pipe_->template AllocEventID<AscendC::HardEvent::MTE3_MTE2>();
      if (dstPe != myPe || srcPe == myPe) {
        aclshmemx_sdma_put_nbi(dst + i, At(src, i, srcPe), ub, kSdmaScratchBytes, static_cast<uint32_t>(m),
                               static_cast<int>(dstPe), static_cast<uint32_t>(syncId_));
      } else {
        aclshmemx_sdma_get_nbi(dst + i, src + i, ub, kSdmaScratchBytes, static_cast<uint32_t>(m),
                               static_cast<int>(srcPe), static_cast<uint32_t>(syncId_));
      }
      sqes_ += sqes;
    }
  }

  AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, 2> copyQ_;
  AscendC::TQue<AscendC::TPosition::VECIN, 2> inQ_;
  AscendC::TQue<AscendC::TPosition::VECOUT, 2> outQ_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> scratch_;
  AscendC::LocalTensor<T> acc_;
  AscendC::TPipe* pipe_ = nullptr;
  int64_t tile_ = 0;
  uint32_t sqes_ = 0;                 // SQEs posted since the last quiet
  AscendC::TEventID syncId_ = 0;      // held from the first post after a quiet until the next quiet
};

// ---- MoE routing (dsl/README.md, "Routing") ----
// Expert ids, counts and offsets are int32 in GM. Expert e lives on rank e / L as its local expert
// e % L, L = experts / world; id -1 (or any id outside [0, experts)) routes nowhere.
template <typename T> struct IsF32 { static constexpr bool value = false; };
template <> struct IsF32<float> { static constexpr bool value = true; };

constexpr int64_t kMaxExperts = 8192;          // per-core running counters live in UB
constexpr uint32_t kMetaBytes = kMaxExperts * sizeof(int32_t);
constexpr uint32_t kGatherElems = 2048;        // columns per gather chunk

template <typename T>
class Router {
 public:
  __aicore__ inline void Init(AscendC::TPipe* pipe, bool gather) {
    pipe->InitBuffer(meta_, kMetaBytes);
    if (gather) {
      pipe->InitBuffer(inQ_, 2, kGatherElems * sizeof(T));
      pipe->InitBuffer(outQ_, 2, kGatherElems * sizeof(T));
      pipe->InitBuffer(acc_, kGatherElems * sizeof(float));
      pipe->InitBuffer(tmp_, kGatherElems * sizeof(float));
    }
  }

  // dst[e] = number of the n ids equal to e (one core counts; the metadata is small).
  __aicore__ inline void Histogram(__gm__ int32_t* dst, __gm__ int32_t* ids, int64_t n, int64_t experts) {
    if (AscendC::GetBlockIdx() != 0) return;
    AscendC::LocalTensor<int32_t> c = Counters(experts);
    AscendC::GlobalTensor<int32_t> g;
    g.SetGlobalBuffer(ids, n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = g.GetValue(i);
      if (e >= 0 && e < experts) c.SetValue(e, c.GetValue(e) + 1);
    }
    AscendC::GlobalTensor<int32_t> d;
    d.SetGlobalBuffer(dst, experts);
    for (int64_t e = 0; e < experts; ++e) d.SetValue(e, c.GetValue(e));
    Flush(d);
  }

  // Packed windows: dst[e] = the first row, on e's owner, of this rank's rows for expert e: the
  // rows of the owner's earlier local experts from every rank, then e's rows from lower ranks.
  // counts is world x experts, row s = rank s's histogram. The owners are independent, so the
  // cores split them (the table has world x experts entries).
  __aicore__ inline void Exscan(__gm__ int32_t* dst, __gm__ int32_t* counts, int64_t experts,
                                int64_t rank, int64_t world) {
    const int64_t core = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    AscendC::GlobalTensor<int32_t> c, d;
    c.SetGlobalBuffer(counts, world * experts);
    d.SetGlobalBuffer(dst, experts);
    const int64_t local = experts / world;
    for (int64_t o = world * core / cores; o < world * (core + 1) / cores; ++o) {
      int64_t row = 0;
      for (int64_t l = 0; l < local; ++l) {
        const int64_t e = o * local + l;
        int64_t before = 0, all = 0;
        for (int64_t s = 0; s < world; ++s) {
          const int64_t n = c.GetValue(s * experts + e);
          all += n;
          if (s < rank) before += n;
        }
        d.SetValue(e, static_cast<int32_t>(row + before));
        row += all;
      }
    }
    Flush(d);
  }

  // Fixed-capacity windows: rank r's rows for local expert l start at row (l * world + r) * capacity.
  __aicore__ inline void Slots(__gm__ int32_t* dst, int64_t experts, int64_t capacity, int64_t rank,
                               int64_t world) {
    if (AscendC::GetBlockIdx() != 0) return;
    AscendC::GlobalTensor<int32_t> d;
    d.SetGlobalBuffer(dst, experts);
    const int64_t local = experts / world;
    for (int64_t e = 0; e < experts; ++e) {
      d.SetValue(e, static_cast<int32_t>(((e % local) * world + rank) * capacity));
    }
    Flush(d);
  }

  // Row t of x goes to row offs[e] + j of win on e's owner, for every entry (t, k) with expert e,
  // j counting this rank's earlier entries for e. The cores split the routed rows evenly (not the
  // experts or the peers), so a skewed routing keeps them balanced.
  __aicore__ inline void Place(Mover<T>& mv, Via via, __gm__ T* win, int64_t rows, __gm__ T* x,
                               __gm__ int32_t* ids, __gm__ int32_t* offs, int64_t tokens, int64_t topk,
                               int64_t hidden, int64_t experts, int64_t rank, int64_t world,
                               int64_t sdmaThreshold) {
    AscendC::GlobalTensor<int32_t> g, o;
    g.SetGlobalBuffer(ids, tokens * topk);
    o.SetGlobalBuffer(offs, experts);
    const int64_t n = tokens * topk, local = experts / world;
    int64_t routed = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t e = g.GetValue(i);
      routed += (e >= 0 && e < experts) ? 1 : 0;
    }
    const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    const int64_t lo = routed * c / cores, hi = routed * (c + 1) / cores;
    AscendC::LocalTensor<int32_t> seen = Counters(experts);
    int64_t index = 0;
    for (int64_t i = 0; i < n && index < hi; ++i) {
      const int32_t e = g.GetValue(i);
      if (e < 0 || e >= experts) continue;
      const int64_t j = seen.GetValue(e);
      seen.SetValue(e, static_cast<int32_t>(j + 1));
      if (index++ < lo) continue;
      const int64_t row = o.GetValue(e) + j;
      if (row < 0 || row >= rows) {
        Fault("place: a token's row is outside the window (offsets or window size wrong)");
        continue;
      }
      mv.Copy(via, win + row * hidden, e / local, x + (i / topk) * hidden, rank, hidden, rank,
              sdmaThreshold);
    }
  }

  // y[t] = sum over k of weights[t, k] * (the window row of entry (t, k)), accumulated in float.
  // The cores split the tokens evenly.
  __aicore__ inline void Gather(__gm__ T* y, __gm__ T* win, int64_t rows, __gm__ int32_t* ids,
                                __gm__ float* weights, __gm__ int32_t* offs, int64_t tokens,
                                int64_t topk, int64_t hidden, int64_t experts, int64_t world) {
    AscendC::GlobalTensor<int32_t> g, o;
    AscendC::GlobalTensor<float> w;
    g.SetGlobalBuffer(ids, tokens * topk);
    w.SetGlobalBuffer(weights, tokens * topk);
    o.SetGlobalBuffer(offs, experts);
    const int64_t local = experts / world;
    const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    const int64_t first = tokens * c / cores, last = tokens * (c + 1) / cores;
    AscendC::LocalTensor<int32_t> seen = Counters(experts);
    for (int64_t i = 0; i < first * topk; ++i) {   // the earlier tokens' rows, for j
      const int32_t e = g.GetValue(i);
      if (e >= 0 && e < experts) seen.SetValue(e, seen.GetValue(e) + 1);
    }
    AscendC::LocalTensor<float> acc = acc_.template Get<float>();
    AscendC::LocalTensor<float> tmp = tmp_.template Get<float>();
    for (int64_t t = first; t < last; ++t) {
      int64_t row[kMaxTopk];
      int64_t pe[kMaxTopk];
      float wt[kMaxTopk];
      int64_t m = 0;
      for (int64_t k = 0; k < topk; ++k) {
        const int32_t e = g.GetValue(t * topk + k);
        if (e < 0 || e >= experts) continue;
        const int64_t j = seen.GetValue(e);
        seen.SetValue(e, static_cast<int32_t>(j + 1));
        const int64_t r = o.GetValue(e) + j;
        if (r < 0 || r >= rows || m >= kMaxTopk) {
          Fault("gather: an entry's row is outside the window (offsets or window size wrong)");
          continue;
        }
        row[m] = r;
        pe[m] = e / local;
        wt[m] = w.GetValue(t * topk + k);
        ++m;
      }
      for (int64_t h = 0; h < hidden; h += kGatherElems) {
        const uint32_t len = static_cast<uint32_t>(Min(kGatherElems, hidden - h));
        AscendC::Duplicate(acc, 0.0f, static_cast<int32_t>(len));
        for (int64_t k = 0; k < m; ++k) {
          AscendC::GlobalTensor<T> src;
          src.SetGlobalBuffer(At(win + row[k] * hidden + h, 0, pe[k]), len);
          AscendC::LocalTensor<T> in = inQ_.template AllocTensor<T>();
          LoadTile(in, src, len);
          inQ_.EnQue(in);
          in = inQ_.template DeQue<T>();
          if constexpr (IsF32<T>::value) {
            AscendC::Muls(tmp, in, wt[k], static_cast<int32_t>(len));
          } else {
            AscendC::Cast(tmp, in, AscendC::RoundMode::CAST_NONE, len);
            AscendC::Muls(tmp, tmp, wt[k], static_cast<int32_t>(len));
          }
          inQ_.FreeTensor(in);
          AscendC::Add(acc, acc, tmp, static_cast<int32_t>(len));
        }
        AscendC::LocalTensor<T> out = outQ_.template AllocTensor<T>();
        if constexpr (IsF32<T>::value) {
          AscendC::DataCopy(out, acc, (len + 7) / 8 * 8);
        } else {
          AscendC::Cast(out, acc, AscendC::RoundMode::CAST_RINT, len);
        }
        outQ_.EnQue(out);
        out = outQ_.template DeQue<T>();
        AscendC::GlobalTensor<T> dst;
        dst.SetGlobalBuffer(y + t * hidden + h, len);
        StoreTile(dst, out, len);
        outQ_.FreeTensor(out);
      }
    }
  }

  static constexpr int64_t kMaxTopk = 64;

 private:
  __aicore__ inline AscendC::LocalTensor<int32_t> Counters(int64_t experts) {
    if (experts > kMaxExperts) Fault("more experts than the kernel's counters hold (8192)");
    AscendC::LocalTensor<int32_t> c = meta_.template Get<int32_t>();
    AscendC::Duplicate(c, 0, static_cast<int32_t>(Min(experts, kMaxExperts)));
    return c;
  }

  // Scalar GM writes become visible to the DMA engines and other cores.
  __aicore__ inline void Flush(AscendC::GlobalTensor<int32_t>& d) {
    AscendC::DataCacheCleanAndInvalid<int32_t, AscendC::CacheLine::ENTIRE_DATA_CACHE,
                                      AscendC::DcciDst::CACHELINE_OUT>(d);
  }

  __aicore__ inline void Fault(const char* what) {
#ifdef STRATA_CPU_MODEL
    ::strata_cpu::Fail("%s", what);
#else
    (void)what;   // on the NPU the entry is skipped: nothing is written outside the window
#endif
  }

  AscendC::TBuf<AscendC::TPosition::VECCALC> meta_;
  AscendC::TQue<AscendC::TPosition::VECIN, 2> inQ_;
  AscendC::TQue<AscendC::TPosition::VECOUT, 2> outQ_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> acc_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> tmp_;
};

// End of a stage: this core's SDMA copies are complete and its MTE writes are out, then every core
// of the rank has reached the same point.
template <typename T>
__aicore__ inline void EndStage(Mover<T>& mv) {
  mv.Quiet();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
}

// Sets flag slot `slot` (a local symmetric address) on rank `pe` to `stamp`.
__aicore__ inline void Signal(__gm__ int32_t* slot, int32_t stamp, int64_t pe) {
  aclshmemx_signal_op(slot, stamp, ACLSHMEM_SIGNAL_SET, static_cast<int>(pe));
}

// Waits until this rank's flag slot holds `stamp` or a later call's stamp.
__aicore__ inline void WaitFlag(__gm__ int32_t* slot, int32_t stamp) {
  aclshmem_signal_wait_until(slot, ACLSHMEM_CMP_GE, stamp);
}

// Cross-rank barrier over the slots [0, world) of the sync area: slot p of rank q holds the stamp
// of the last barrier rank p announced to q. The cores share the peers between them.
__aicore__ inline void Barrier(__gm__ int32_t* slots, int32_t stamp) {
  const int64_t me = aclshmem_my_pe(), world = aclshmem_n_pes();
  const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
  for (int64_t p = c; p < world; p += cores) Signal(slots + me, stamp, p);
  for (int64_t p = c; p < world; p += cores) {
    STRATA_WAIT_NOTE("barrier", slots, world, p);
    WaitFlag(slots + p, stamp);
  }
  AscendC::SyncAll<true>();
}

}  // namespace strata

#endif  // STRATA_DEVICE_H
