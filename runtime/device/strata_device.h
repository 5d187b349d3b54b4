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
constexpr uint32_t kSdmaIssueLimit = 256;  // outstanding SDMA posts per core before a quiet

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

// One core's data mover. UB holds a double-buffered copy queue, double-buffered reduce input and
// output queues (each only if the kernel needs it) and a small scratch area.
template <typename T>
class Mover {
 public:
  __aicore__ inline void Init(AscendC::TPipe* pipe, uint32_t tileBytes, uint32_t copyTiles,
                              uint32_t reduceTiles, uint32_t scratchBytes) {
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
  // kAuto sends copies of at least `sdmaThreshold` bytes to SDMA.
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
    Load(in, g, m);
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

  // Waits until every SDMA copy this core posted has completed.
  __aicore__ inline void Quiet() {
    if (posted_ == 0) return;
    AscendC::LocalTensor<T> s = scratch_.template Get<T>();
    aclshmemx_sdma_quiet(reinterpret_cast<__ubuf__ T*>(s.GetPhyAddr()), kSdmaScratchBytes, EVENT_ID0);
    posted_ = 0;
  }

 private:
  __aicore__ inline uint32_t AlignUp(uint32_t m) const {
    const uint32_t per = kBlockBytes / sizeof(T);
    return (m + per - 1) / per * per;
  }

  __aicore__ inline void Load(AscendC::LocalTensor<T>& dst, AscendC::GlobalTensor<T>& src, uint32_t m) {
    if ((m * sizeof(T)) % kBlockBytes == 0) {
      AscendC::DataCopy(dst, src, m);
    } else {
      AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(m * sizeof(T)), 0, 0, 0};
      AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, T(0)};
      AscendC::DataCopyPad(dst, src, p, pad);
    }
  }

  __aicore__ inline void StoreTile(AscendC::GlobalTensor<T>& dst, AscendC::LocalTensor<T>& src, uint32_t m) {
    if ((m * sizeof(T)) % kBlockBytes == 0) {
      AscendC::DataCopy(dst, src, m);
    } else {
      AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(m * sizeof(T)), 0, 0, 0};
      AscendC::DataCopyPad(dst, src, p);
    }
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
      Load(t, si, m);
      copyQ_.EnQue(t);
      t = copyQ_.template DeQue<T>();
      AscendC::GlobalTensor<T> di = d[i];
      StoreTile(di, t, m);
      copyQ_.FreeTensor(t);
    }
  }

  // SDMA copies are GM -> GM and cost no core time. A put names the destination by its local
  // symmetric address and rank; a get names the source that way.
  __aicore__ inline void SdmaCopy(__gm__ T* dst, int64_t dstPe, __gm__ T* src, int64_t srcPe,
                                  int64_t n, int64_t myPe) {
    AscendC::LocalTensor<T> s = scratch_.template Get<T>();
    __ubuf__ T* ub = reinterpret_cast<__ubuf__ T*>(s.GetPhyAddr());
    if (dstPe != myPe || srcPe == myPe) {
      aclshmemx_sdma_put_nbi(dst, At(src, 0, srcPe), ub, kSdmaScratchBytes,
                             static_cast<uint32_t>(n), static_cast<int>(dstPe), EVENT_ID0);
    } else {
      aclshmemx_sdma_get_nbi(dst, src, ub, kSdmaScratchBytes, static_cast<uint32_t>(n),
                             static_cast<int>(srcPe), EVENT_ID0);
    }
    if (++posted_ >= kSdmaIssueLimit) Quiet();
  }

  AscendC::TQueBind<AscendC::TPosition::VECIN, AscendC::TPosition::VECOUT, 2> copyQ_;
  AscendC::TQue<AscendC::TPosition::VECIN, 2> inQ_;
  AscendC::TQue<AscendC::TPosition::VECOUT, 2> outQ_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> scratch_;
  AscendC::LocalTensor<T> acc_;
  int64_t tile_ = 0;
  uint32_t posted_ = 0;
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
