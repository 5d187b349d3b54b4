// The device library of stratac's generated kernels: work partitioning, tiled UB copies and
// reductions, SDMA copies, barriers and flags. Written only against the public Ascend C and
// SHMEM-for-Ascend APIs so that the same file compiles with CANN for the NPU and with g++ against
// the CPU model in runtime/cpu (which defines STRATA_CPU_MODEL).
// One header above 700 lines on purpose: it is the one file a generated kernel includes beside the
// Ascend C and SHMEM headers, compiled inside each kernel's translation unit on both builds
// (docs/architecture.md, "Modules over 500 lines"); its MoE routing is the part that may move out.
#ifndef STRATA_DEVICE_H
#define STRATA_DEVICE_H

#include "kernel_operator.h"
#include "shmem.h"

#ifdef STRATA_CPU_MODEL
#include "strata_cpu.h"
// Tells the CPU model which .strata line the core is executing, for its error messages.
#define STRATA_LINE(n) ::strata_cpu::SetLine(n)
// Tells the CPU model what the next wait is for (`what` over `count` sync slots, one 64-byte line
// each, from `group`, waiting on slot `index`), so that a timeout can say which flag and who has
// not arrived.
#define STRATA_WAIT_NOTE(what, group, count, index) ::strata_cpu::NoteWait(what, group, count, index)
// Tells the CPU model that the core's DMAs from here are sync traffic (the ranks' agreement on the
// call, the read of the call's mask), which its data counters leave out, as they leave out signals.
#define STRATA_SYNC_TRAFFIC(on) ::strata_cpu::SyncTraffic(on)
#else
#define STRATA_LINE(n) ((void)0)
#define STRATA_WAIT_NOTE(what, group, count, index) ((void)0)
#define STRATA_SYNC_TRAFFIC(on) ((void)0)
#endif

namespace strata {

enum class Red { kSum, kMax, kMin };
enum class Via { kAiv, kSdma, kAuto };
// What a packed window's bound limits (Router::Exscan): an owner's rows (the window's rows), or each
// expert's (its region of the window, `exscan(counts, R)`).
enum class Bound { kPerOwner, kPerExpert };

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

// The sync area (barrier slots, then the named flags) is an array of slots, one 64-byte line
// each, as SHMEM pads its own sync words (ACLSHMEM_SYNCBIT_SIZE = 64): a signal is a scalar store
// plus a flush of its whole D-cache line, so two flags in one line can overwrite each other and a
// signal can be lost. Slot i is the int32 at SyncSlot(sync, i). The host allocates
// (world + SYNC_SLOTS) * kSyncSlotBytes bytes (stratac/host/schedule.py: SYNC_SLOT_BYTES).
constexpr int64_t kSyncSlotBytes = 64;
constexpr int64_t kSyncSlotInts = kSyncSlotBytes / static_cast<int64_t>(sizeof(int32_t));
#ifdef STRATA_CPU_MODEL
static_assert(static_cast<uint64_t>(kSyncSlotBytes) == ::strata_cpu::kCacheLineBytes, "one sync slot per D-cache line");
#endif
// After the barrier slots and the SYNC_SLOTS flag slots: the rank's status line (stratac/codegen/abi.py
// STATUS_*), written only by DMA from UB by one core of the rank and read by the host after the call.
// Packed MoE: [0] 1 when some owner would receive more rows than its window holds (nothing was
// placed or gathered), [1] the owner with the most rows, [2] its rows, [3] the window's rows,
// [4] how many owners are over; the rest 0.
constexpr int64_t kSyncSlots = 4096;
constexpr int64_t kStatusInts = kSyncSlotInts;
__aicore__ inline __gm__ int32_t* StatusLine(__gm__ int32_t* sync, int64_t world) {
  return sync + (world + kSyncSlots) * kSyncSlotInts;
}
// After the status line: two agreement records of kAgreeLines lines (the one of a call is chosen by
// the parity of its epoch), then the verdict line (stratac/codegen/abi.py AGREE_*; Agree below).
constexpr int64_t kAgreeLines = 4;
constexpr uint32_t kAgreeInts = 8;   // the compared head of a record: 32 bytes, one DataCopy
__aicore__ inline __gm__ int32_t* AgreeRecord(__gm__ int32_t* sync, int64_t world, int64_t parity) {
  return StatusLine(sync, world) + (1 + parity * kAgreeLines) * kSyncSlotInts;
}
__aicore__ inline __gm__ int32_t* AgreeVerdict(__gm__ int32_t* sync, int64_t world) {
  return AgreeRecord(sync, world, 2);
}
// After the verdict line: the rank's mask of active ranks, bit p of int32 word p / 32 for rank p
// (stratac/codegen/abi.py mask_offset; Ranks below).
__aicore__ inline __gm__ int32_t* MaskBits(__gm__ int32_t* sync, int64_t world) {
  return AgreeVerdict(sync, world) + kSyncSlotInts;
}

__aicore__ inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

// The ranks that take part in a call (MoE calls, docs/robustness.md "Masked ranks"). Default
// constructed: every rank (the kernels without a mask). Load: the mask the host wrote into the sync
// area before the launch (MaskBits, one bit per rank), copied into UB once by DMA and read there by
// the scalar unit; a GM scalar read could meet a stale D-cache line of an earlier call's mask. The
// UB buffer holds kMaskMaxWorld bits (ir.MASK_MAX_WORLD; stratac/ir/passes.py MASK_BYTES). The
// host refuses a larger world; should one reach the kernel, the CPU model fails and the NPU kernel
// counts no rank from kMaskMaxWorld on as live (it neither writes to nor waits for them).
constexpr int64_t kMaskMaxWorld = 16384;
constexpr uint32_t kMaskBytes = kMaskMaxWorld / 8;
class Ranks {
 public:
  __aicore__ inline void Load(AscendC::TPipe* pipe, AscendC::TBuf<AscendC::TPosition::VECCALC>& buf,
                              __gm__ int32_t* sync, int64_t world) {
#ifdef STRATA_CPU_MODEL
    if (world > kMaskMaxWorld) ::strata_cpu::Fail("a mask of active ranks holds at most %lld ranks, the world has %lld",
                                                  static_cast<long long>(kMaskMaxWorld), static_cast<long long>(world));
#endif
    limit_ = Min(world, kMaskMaxWorld);
    pipe->InitBuffer(buf, kMaskBytes);
    bits_ = buf.template Get<int32_t>();
    // whole 32-byte blocks (the mask's lines in the sync area are 64-byte lines)
    const uint32_t words = static_cast<uint32_t>((limit_ + 255) / 256 * 8);
    AscendC::GlobalTensor<int32_t> g;
    g.SetGlobalBuffer(MaskBits(sync, world), words);
    STRATA_SYNC_TRAFFIC(true);
    AscendC::DataCopy(bits_, g, words);
    AscendC::PipeBarrier<PIPE_ALL>();   // in UB before the scalar unit reads it
    STRATA_SYNC_TRAFFIC(false);
    all_ = false;
  }
  __aicore__ inline bool Has(int64_t pe) const {
    if (all_) return true;
    if (pe >= limit_) return false;
    return ((static_cast<uint32_t>(bits_.GetValue(static_cast<uint32_t>(pe >> 5))) >> (pe & 31)) & 1u) != 0;
  }

 private:
  AscendC::LocalTensor<int32_t> bits_;
  int64_t limit_ = 0;
  bool all_ = true;
};
__aicore__ inline bool Live(const Ranks& ranks, int64_t pe) { return ranks.Has(pe); }
__aicore__ inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
// The .strata language's a % b: floored, in [0, b) for b > 0 (the verifier refuses b <= 0), so
// that (rank - s - 1) % world is a rank. C++'s % truncates toward zero.
__aicore__ inline int64_t Mod(int64_t a, int64_t b) {
  const int64_t r = a % b;
  return r < 0 ? r + b : r;
}
// floor(log2(a)) for a >= 1 (the verifier refuses a < 1).
__aicore__ inline int64_t Log2(int64_t a) {
  int64_t k = 0;
  while (a > 1) {
    a >>= 1;
    ++k;
  }
  return k;
}

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

// 16-bit floats are reduced in float: A2/A3 have no bfloat16_t Add/Max/Min (asc-devkit docs Add.md,
// Max.md, Min.md), and production kernels accumulate half and bfloat16_t in float in UB, rounding
// once when the result is stored.
template <typename T> struct IsWideAcc {
  static constexpr bool value = sizeof(T) == 2;   // half, bfloat16_t
};

// One core's data mover. UB holds a double-buffered copy queue, the reduction's buffers (each only
// if the kernel needs it) and a small scratch area. The reduction takes `reduceTiles` tiles of
// `tileBytes` (4 = 2 * the queue depth, or 0) and works on tiles of tileBytes / 4 elements:
//   32-bit T: input queue 2 x tileBytes, output queue 2 x tileBytes (its tile is the accumulator);
//   16-bit T: input and output queues 2 x tileBytes / 2 each, a float accumulator and a float
//             temporary of tileBytes each.
// Either way 4 x tileBytes (tileBytes a multiple of 64, so that half tiles stay 32-byte aligned).
template <typename T>
class Mover {
 public:
  __aicore__ inline void Init(AscendC::TPipe* pipe, uint32_t tileBytes, uint32_t copyTiles,
                              uint32_t reduceTiles, uint32_t scratchBytes) {
    pipe_ = pipe;
    tile_ = tileBytes / sizeof(T);
    rtile_ = tileBytes / sizeof(float);
    if (copyTiles) pipe->InitBuffer(copyQ_, copyTiles, tileBytes);
    if (reduceTiles) {
      const uint32_t bytes = static_cast<uint32_t>(rtile_ * sizeof(T));
      pipe->InitBuffer(inQ_, reduceTiles / 2, bytes);
      pipe->InitBuffer(outQ_, reduceTiles / 2, bytes);
      if constexpr (IsWideAcc<T>::value) {
        pipe->InitBuffer(accBuf_, static_cast<uint32_t>(rtile_ * sizeof(float)));
        pipe->InitBuffer(tmpBuf_, static_cast<uint32_t>(rtile_ * sizeof(float)));
      }
    }
    pipe->InitBuffer(scratch_, scratchBytes);
  }

  // Elements per reduction tile (the generated reduce loops step by it).
  __aicore__ inline int64_t Tile() const { return rtile_; }

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

  // Tile reduction of m <= Tile() elements: call Fold once per source (first = true for the
  // first), then Store. 16-bit T: the first source initialises the float accumulator by its Cast.
  // 32-bit T: the first source's tile is held in the input queue (its depth is 2) and the second
  // is combined with it straight into the accumulator (acc = first op second: one vector pass for
  // the two, no UB -> UB DataCopy); a lone source reaches the accumulator by Muls(1) in Store,
  // exact for every value (x * 1 == x, -0 and NaN included).
  template <Red op>
  __aicore__ inline void Fold(__gm__ T* src, uint32_t m, bool first) {
    AscendC::GlobalTensor<T> g;
    g.SetGlobalBuffer(src, m);
    AscendC::LocalTensor<T> in = inQ_.template AllocTensor<T>();
    LoadTile(in, g, m);
    inQ_.EnQue(in);
    in = inQ_.template DeQue<T>();
    const int32_t n = static_cast<int32_t>(m);
    if constexpr (IsWideAcc<T>::value) {
      AscendC::LocalTensor<float> acc = accBuf_.template Get<float>();
      if (first) {
        AscendC::Cast(acc, in, AscendC::RoundMode::CAST_NONE, m);
      } else {
        AscendC::LocalTensor<float> x = tmpBuf_.template Get<float>();
        AscendC::Cast(x, in, AscendC::RoundMode::CAST_NONE, m);
        Combine<op, float>(acc, acc, x, n);
      }
    } else {
      if (first) {
        held_ = in;   // freed once the second source is combined with it, or by Store
        holding_ = true;
        return;
      }
      if (holding_) {
        acc_ = outQ_.template AllocTensor<T>();
        Combine<op, T>(acc_, held_, in, n);
        inQ_.FreeTensor(held_);   // in allocation order
        holding_ = false;
      } else {
        Combine<op, T>(acc_, acc_, in, n);
      }
    }
    inQ_.FreeTensor(in);
  }

  __aicore__ inline void Store(__gm__ T* dst, uint32_t m) {
    AscendC::GlobalTensor<T> g;
    g.SetGlobalBuffer(dst, m);
    if constexpr (IsWideAcc<T>::value) {
      acc_ = outQ_.template AllocTensor<T>();
      AscendC::Cast(acc_, accBuf_.template Get<float>(), AscendC::RoundMode::CAST_RINT, m);
    } else if (holding_) {   // one source: its tile is the result
      acc_ = outQ_.template AllocTensor<T>();
      AscendC::Muls(acc_, held_, static_cast<T>(1), static_cast<int32_t>(m));
      inQ_.FreeTensor(held_);
      holding_ = false;
    }
    outQ_.EnQue(acc_);
    AscendC::LocalTensor<T> out = outQ_.template DeQue<T>();
    StoreTile(g, out, m);
    outQ_.FreeTensor(out);
  }

  // The UB scratch as int32 words, for the ranks' agreement (Agree), which runs before any copy.
  __aicore__ inline AscendC::LocalTensor<int32_t> Words() { return scratch_.template Get<int32_t>(); }

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
  // dst = a op b, elementwise (dst may be a: acc op= x).
  template <Red op, typename A>
  __aicore__ inline void Combine(AscendC::LocalTensor<A>& dst, AscendC::LocalTensor<A>& a,
                                 AscendC::LocalTensor<A>& b, int32_t n) {
    if (op == Red::kSum) {
      AscendC::Add(dst, a, b, n);
    } else if (op == Red::kMax) {
      AscendC::Max(dst, a, b, n);
    } else {
      AscendC::Min(dst, a, b, n);
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
  AscendC::TBuf<AscendC::TPosition::VECCALC> accBuf_;   // 16-bit T: the float accumulator
  AscendC::TBuf<AscendC::TPosition::VECCALC> tmpBuf_;   // 16-bit T: a source cast to float
  AscendC::LocalTensor<T> acc_;   // 32-bit T: the accumulator; 16-bit T: the rounded result
  AscendC::LocalTensor<T> held_;  // 32-bit T: the first source of a tile until the second (Fold)
  bool holding_ = false;
  AscendC::TPipe* pipe_ = nullptr;
  int64_t tile_ = 0;    // elements per copy tile
  int64_t rtile_ = 0;   // elements per reduction tile
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
constexpr int64_t kRouteChunk = 1024;          // ids (and weights) staged in UB per DMA
constexpr uint32_t kStageBytes = kRouteChunk * (sizeof(int32_t) + sizeof(float));
constexpr uint32_t kGatherElems = 2048;        // columns per gather chunk

// Routing data (ids, weights, counts, offsets) is written by DMA, SDMA, other kernels or the host,
// so the scalar unit never reads it from GM (its D-cache would be stale: asc-devkit
// GlobalTensor/GetValue.md): each piece is copied into UB by DMA and scanned there, and results
// leave UB by DMA, each core writing byte ranges of its own (no two cores' scalar stores in one
// 64-byte line). Counters, cursors and staged ids live in UB (meta_: kMaxExperts int32; stage_:
// kRouteChunk ids and kRouteChunk weights).
template <typename T>
class Router {
 public:
  __aicore__ inline void Init(AscendC::TPipe* pipe, bool gather) {
    active_ = Ranks();
    world_ = aclshmem_n_pes();
    pipe->InitBuffer(meta_, kMetaBytes);
    pipe->InitBuffer(stage_, kStageBytes);
    if (gather) {
      pipe->InitBuffer(inQ_, 2, kGatherElems * sizeof(T));
      pipe->InitBuffer(outQ_, 2, kGatherElems * sizeof(T));
      pipe->InitBuffer(acc_, kGatherElems * sizeof(float));
      pipe->InitBuffer(tmp_, kGatherElems * sizeof(float));
    }
  }

  // The ranks of a masked call (Live): an entry whose expert lives on a masked rank is dropped
  // (counted nowhere, placed nowhere, weight 0 in the combine), and a masked rank's row of the
  // count table is read as zeros (it may hold a dead rank's stale counts). Without Mask: no mask.
  __aicore__ inline void Mask(const Ranks& active) {
    active_ = active;
    masked_ = true;
  }

  // dst[e] = number of the n ids equal to e (one core counts in UB; the metadata is small);
  // entries of a masked rank's experts are not counted.
  __aicore__ inline void Histogram(__gm__ int32_t* dst, __gm__ int32_t* ids, int64_t n, int64_t experts) {
    if (AscendC::GetBlockIdx() != 0) return;
    AscendC::LocalTensor<int32_t> c = Counters(experts);
    AscendC::LocalTensor<int32_t> ib = Ids();
    for (int64_t i0 = 0; i0 < n; i0 += kRouteChunk) {
      const int64_t m = Min(kRouteChunk, n - i0);
      Fetch(ib, ids + i0, m);
      for (int64_t i = 0; i < m; ++i) {
        const int32_t e = ib.GetValue(static_cast<uint32_t>(i));
        if (Routed(e, experts)) c.SetValue(e, c.GetValue(e) + 1);
      }
    }
    Emit(dst, c, experts);
  }

  // Packed windows: dst[e] = the first row, on e's owner, of this rank's rows for expert e: the
  // rows of the owner's earlier local experts from every rank, then e's rows from lower ranks.
  // counts is world x experts, row s = rank s's histogram. The owners are independent, so the
  // cores split them; a core loads its owners' columns of every row into UB in chunks, sums them
  // there and writes its owners' offsets (a contiguous range of dst) with one DMA per chunk.
  // Bound::kPerExpert (exscan(counts, R)): local expert l's rows start at row l * rows instead,
  // one region of `rows` rows per local expert.
  // Also the bound: core 0 sums every owner's rows (the whole table) and writes the status line
  // (StatusLine): over when an owner would receive more than `rows` (its window's rows), or
  // (kPerExpert) an expert more than its region's. Every rank holds the same table, so every rank
  // reaches the same verdict with no extra exchange; Place and Gather read the line after the
  // stage's SyncAll and do nothing when it is set.
  __aicore__ inline void Exscan(__gm__ int32_t* dst, __gm__ int32_t* counts, int64_t experts,
                                int64_t rank, int64_t world, Bound per, int64_t rows,
                                __gm__ int32_t* status) {
    const int64_t core = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    const int64_t local = experts / world;
    if (core == 0) {
      if (per == Bound::kPerExpert) {
        ExpertBound(counts, experts, world, rows, status);
      } else {
        OwnerBound(counts, experts, world, rows, status);
      }
    }
    const int64_t lo = world * core / cores * local, hi = world * (core + 1) / cores * local;
    if (lo >= hi) return;
    Counters(experts);   // the experts bound
    AscendC::LocalTensor<int32_t> meta = meta_.template Get<int32_t>();
    AscendC::LocalTensor<int32_t> before = meta, all = meta[kRouteChunk];
    AscendC::LocalTensor<int32_t> row_s = Ids();
    int64_t row = 0;
    for (int64_t a = lo; a < hi; a += kRouteChunk) {
      const int64_t m = Min(kRouteChunk, hi - a);
      AscendC::Duplicate(meta, 0, static_cast<int32_t>(2 * kRouteChunk));
      AscendC::PipeBarrier<PIPE_ALL>();
      for (int64_t s = 0; s < world; ++s) {
        if (!Live(active_, s)) continue;   // a masked rank's row (stale after a death) counts nothing
        Fetch(row_s, counts + s * experts + a, m);
        for (int64_t j = 0; j < m; ++j) {
          const int32_t n = row_s.GetValue(static_cast<uint32_t>(j));
          all.SetValue(static_cast<uint32_t>(j), all.GetValue(static_cast<uint32_t>(j)) + n);
          if (s < rank) before.SetValue(static_cast<uint32_t>(j), before.GetValue(static_cast<uint32_t>(j)) + n);
        }
      }
      for (int64_t j = 0; j < m; ++j) {
        if ((a + j) % local == 0) row = 0;   // the first local expert of an owner
        if (per == Bound::kPerExpert) row = (a + j) % local * rows;   // its region
        before.SetValue(static_cast<uint32_t>(j),
                        static_cast<int32_t>(row + before.GetValue(static_cast<uint32_t>(j))));
        row += all.GetValue(static_cast<uint32_t>(j));
      }
      Emit(dst + a, before, m);
    }
  }

  // Fixed-capacity windows: rank r's rows for local expert l start at row (l * world + r) * capacity.
  __aicore__ inline void Slots(__gm__ int32_t* dst, int64_t experts, int64_t capacity, int64_t rank,
                               int64_t world) {
    if (AscendC::GetBlockIdx() != 0) return;
    AscendC::LocalTensor<int32_t> d = Counters(experts);
    const int64_t local = experts / world;
    for (int64_t e = 0; e < experts; ++e) {
      d.SetValue(static_cast<uint32_t>(e), static_cast<int32_t>(((e % local) * world + rank) * capacity));
    }
    Emit(dst, d, experts);
  }

  // Row t of x goes to row offs[e] + j of win on e's owner, for every entry (t, k) with expert e,
  // j counting this rank's earlier entries for e. The cores split the routed rows evenly (not the
  // experts or the peers), so a skewed routing keeps them balanced. Each core keeps, per expert,
  // the next row (offs[e] + j) in UB, and scans the ids in UB chunks up to its last row.
  // `also` (when its win is set) is a second payload placed in the same pass: row t of also.x goes
  // to the same row of also.win (an int8 row's f32 scales beside it), so the ids are scanned once
  // for both (a place the pass join_places joined to the one before it, stratac/ir/passes.py).
  struct Rows {
    __gm__ T* win;     // the window (on every rank, symmetric)
    int64_t rows;      // its rows: the bound every row index is checked against
    __gm__ T* x;       // this rank's rows
    int64_t hidden;    // elements of T per row
  };
  __aicore__ inline void Place(Mover<T>& mv, Via via, Rows rows, Rows also, __gm__ int32_t* ids,
                               __gm__ int32_t* offs, int64_t tokens, int64_t topk, int64_t experts,
                               int64_t rank, int64_t world, int64_t sdmaThreshold, __gm__ int32_t* status) {
    if (Over(status)) return;   // some owner's window is too small: nothing is placed, on any rank
    const int64_t n = tokens * topk, local = experts / world;
    AscendC::LocalTensor<int32_t> ib = Ids();
    int64_t routed = 0;
    for (int64_t i0 = 0; i0 < n; i0 += kRouteChunk) {
      const int64_t m = Min(kRouteChunk, n - i0);
      Fetch(ib, ids + i0, m);
      for (int64_t i = 0; i < m; ++i) {
        const int32_t e = ib.GetValue(static_cast<uint32_t>(i));
        routed += Routed(e, experts) ? 1 : 0;
      }
    }
    const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    const int64_t lo = routed * c / cores, hi = routed * (c + 1) / cores;
    if (lo >= hi) return;
    AscendC::LocalTensor<int32_t> next = Cursors(offs, experts);
    int64_t index = 0;
    for (int64_t i0 = 0; i0 < n && index < hi; i0 += kRouteChunk) {
      const int64_t m = Min(kRouteChunk, n - i0);
      Fetch(ib, ids + i0, m);
      for (int64_t k = 0; k < m && index < hi; ++k) {
        const int32_t e = ib.GetValue(static_cast<uint32_t>(k));
        if (!Routed(e, experts)) continue;
        const int64_t row = next.GetValue(e);
        next.SetValue(e, static_cast<int32_t>(row + 1));
        if (index++ < lo) continue;
        if (row < 0 || row >= rows.rows || (also.win != nullptr && row >= also.rows)) {
          Fault("place: a token's row is outside the window (offsets or window size wrong)");
          continue;
        }
        const int64_t t = (i0 + k) / topk;
        mv.Copy(via, rows.win + row * rows.hidden, e / local, rows.x + t * rows.hidden, rank,
                rows.hidden, rank, sdmaThreshold);
        if (also.win != nullptr) {
          mv.Copy(via, also.win + row * also.hidden, e / local, also.x + t * also.hidden, rank,
                  also.hidden, rank, sdmaThreshold);
        }
      }
    }
  }

  // y[t] = sum over k of weights[t, k] * (the window row of entry (t, k)), accumulated in float.
  // The cores split the tokens evenly; ids and weights come into UB in chunks of whole tokens.
  __aicore__ inline void Gather(__gm__ T* y, __gm__ T* win, int64_t rows, __gm__ int32_t* ids,
                                __gm__ float* weights, __gm__ int32_t* offs, int64_t tokens,
                                int64_t topk, int64_t hidden, int64_t experts, int64_t world,
                                __gm__ int32_t* status) {
    if (Over(status)) return;   // the windows were not filled: nothing is gathered, on any rank
    const int64_t local = experts / world;
    const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
    const int64_t first = tokens * c / cores, last = tokens * (c + 1) / cores;
    if (first >= last) return;
    if (topk > kMaxTopk) Fault("gather: more than 64 experts per token");
    AscendC::LocalTensor<int32_t> next = Cursors(offs, experts);
    AscendC::LocalTensor<int32_t> ib = Ids();
    AscendC::LocalTensor<float> wb = stage_.template GetWithOffset<float>(
        static_cast<uint32_t>(kRouteChunk), static_cast<uint32_t>(kRouteChunk * sizeof(int32_t)));
    for (int64_t i0 = 0; i0 < first * topk; i0 += kRouteChunk) {   // the earlier tokens' rows
      const int64_t m = Min(kRouteChunk, first * topk - i0);
      Fetch(ib, ids + i0, m);
      for (int64_t i = 0; i < m; ++i) {
        const int32_t e = ib.GetValue(static_cast<uint32_t>(i));
        if (Routed(e, experts)) next.SetValue(e, next.GetValue(e) + 1);
      }
    }
    AscendC::LocalTensor<float> acc = acc_.template Get<float>();
    AscendC::LocalTensor<float> tmp = tmp_.template Get<float>();
    const int64_t perChunk = Max(1, kRouteChunk / Max(1, topk));   // tokens per staged chunk
    for (int64_t t0 = first; t0 < last; t0 += perChunk) {
      const int64_t t1 = Min(last, t0 + perChunk);
      Fetch(ib, ids + t0 * topk, (t1 - t0) * topk);
      Fetch(wb, weights + t0 * topk, (t1 - t0) * topk);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t row[kMaxTopk];
        int64_t pe[kMaxTopk];
        float wt[kMaxTopk];
        int64_t m = 0;
        for (int64_t k = 0; k < topk; ++k) {
          const uint32_t at = static_cast<uint32_t>((t - t0) * topk + k);
          const int32_t e = ib.GetValue(at);
          if (!Routed(e, experts)) continue;   // no expert, or a masked rank's: weight 0
          const int64_t r = next.GetValue(e);
          next.SetValue(e, static_cast<int32_t>(r + 1));
          if (r < 0 || r >= rows || m >= kMaxTopk) {
            Fault("gather: an entry's row is outside the window (offsets or window size wrong)");
            continue;
          }
          row[m] = r;
          pe[m] = e / local;
          wt[m] = wb.GetValue(at);
          ++m;
        }
        Combine(y + t * hidden, win, hidden, row, pe, wt, m, acc, tmp);
      }
    }
  }

  static constexpr int64_t kMaxTopk = 64;

 private:
  // y_t[0, hidden) = sum over k < m of wt[k] * win[row[k]] of rank pe[k], in float.
  __aicore__ inline void Combine(__gm__ T* yt, __gm__ T* win, int64_t hidden, const int64_t* row,
                                 const int64_t* pe, const float* wt, int64_t m,
                                 AscendC::LocalTensor<float>& acc, AscendC::LocalTensor<float>& tmp) {
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
      dst.SetGlobalBuffer(yt + h, len);
      StoreTile(dst, out, len);
      outQ_.FreeTensor(out);
    }
  }

  // The bound of a packed window (see Exscan): per-owner totals of the world x experts table in
  // UB (meta_ past the exscan's 2 * kRouteChunk), the owner with the most rows, the status line out.
  __aicore__ inline void OwnerBound(__gm__ int32_t* counts, int64_t experts, int64_t world, int64_t rows,
                                    __gm__ int32_t* status) {
    if (status == nullptr) return;
    if (world > kMaxExperts - 2 * kRouteChunk - kStatusInts) Fault("exscan: more owners than the bound's counters hold");
    const int64_t local = experts / world;
    AscendC::LocalTensor<int32_t> meta = meta_.template Get<int32_t>();
    AscendC::LocalTensor<int32_t> line = meta[2 * kRouteChunk];                 // the status line
    AscendC::LocalTensor<int32_t> tot = meta[2 * kRouteChunk + kStatusInts];    // rows per owner
    AscendC::LocalTensor<int32_t> row_s = Ids();
    AscendC::Duplicate(line, 0, static_cast<int32_t>(kStatusInts + world));
    AscendC::PipeBarrier<PIPE_ALL>();
    for (int64_t s = 0; s < world; ++s) {
      if (!Live(active_, s)) continue;
      for (int64_t a = 0; a < experts; a += kRouteChunk) {
        const int64_t m = Min(kRouteChunk, experts - a);
        Fetch(row_s, counts + s * experts + a, m);
        for (int64_t j = 0; j < m; ++j) {
          const uint32_t o = static_cast<uint32_t>((a + j) / local);
          tot.SetValue(o, tot.GetValue(o) + row_s.GetValue(static_cast<uint32_t>(j)));
        }
      }
    }
    int64_t worst = 0, most = -1, over = 0;
    for (int64_t o = 0; o < world; ++o) {
      const int64_t n = tot.GetValue(static_cast<uint32_t>(o));
      if (n > rows) ++over;
      if (n > most) { most = n; worst = o; }
    }
    Report(line, worst, most, rows, over, status);
  }

  // The bound of a region per expert (Bound::kPerExpert): each expert's total over the table's rows,
  // a chunk of experts at a time in UB (meta_ past the exscan's 2 * kRouteChunk), the expert with the
  // most rows, the status line out.
  __aicore__ inline void ExpertBound(__gm__ int32_t* counts, int64_t experts, int64_t world,
                                     int64_t rows, __gm__ int32_t* status) {
    if (status == nullptr) return;
    static_assert(3 * kRouteChunk + kStatusInts <= kMaxExperts, "the bound's counters fit meta_");
    AscendC::LocalTensor<int32_t> meta = meta_.template Get<int32_t>();
    AscendC::LocalTensor<int32_t> line = meta[2 * kRouteChunk];                 // the status line
    AscendC::LocalTensor<int32_t> tot = meta[2 * kRouteChunk + kStatusInts];    // rows per expert
    AscendC::LocalTensor<int32_t> row_s = Ids();
    AscendC::Duplicate(line, 0, static_cast<int32_t>(kStatusInts));
    AscendC::PipeBarrier<PIPE_ALL>();
    int64_t worst = 0, most = -1, over = 0;
    for (int64_t a = 0; a < experts; a += kRouteChunk) {
      const int64_t m = Min(kRouteChunk, experts - a);
      AscendC::Duplicate(tot, 0, static_cast<int32_t>(m));
      AscendC::PipeBarrier<PIPE_ALL>();
      for (int64_t s = 0; s < world; ++s) {
        if (!Live(active_, s)) continue;
        Fetch(row_s, counts + s * experts + a, m);
        for (int64_t j = 0; j < m; ++j) {
          tot.SetValue(static_cast<uint32_t>(j), tot.GetValue(static_cast<uint32_t>(j)) +
                                                     row_s.GetValue(static_cast<uint32_t>(j)));
        }
      }
      for (int64_t j = 0; j < m; ++j) {
        const int64_t n = tot.GetValue(static_cast<uint32_t>(j));
        if (n > rows) ++over;
        if (n > most) { most = n; worst = a + j; }
      }
    }
    Report(line, worst, most, rows, over, status);
  }

  // The status line (abi.STATUS_*): over, the owner or expert with the most rows, its rows, the
  // bound, how many are over; written whether or not the bound holds (a clean line says it does).
  __aicore__ inline void Report(AscendC::LocalTensor<int32_t> line, int64_t worst, int64_t most,
                                int64_t rows, int64_t over, __gm__ int32_t* status) {
    if (over > 0) {
      line.SetValue(0, 1);
      line.SetValue(1, static_cast<int32_t>(worst));
      line.SetValue(2, static_cast<int32_t>(most));
      line.SetValue(3, static_cast<int32_t>(rows));
      line.SetValue(4, static_cast<int32_t>(over));
    }
    Emit(status, line, kStatusInts);
  }

  // Whether the status line says the bound was exceeded (read by DMA: another core wrote it).
  __aicore__ inline bool Over(__gm__ int32_t* status) {
    if (status == nullptr) return false;
    AscendC::LocalTensor<int32_t> line = Ids();
    Fetch(line, status, kStatusInts);
    return line.GetValue(0) != 0;
  }

  // Whether entry id e routes somewhere: an expert, on a rank the call's mask keeps.
  __aicore__ inline bool Routed(int32_t e, int64_t experts) const {
    if (e < 0 || e >= experts) return false;
    return !masked_ || Live(active_, e / Max(1, experts / world_));
  }

  __aicore__ inline AscendC::LocalTensor<int32_t> Counters(int64_t experts) {
    if (experts > kMaxExperts) Fault("more experts than the kernel's counters hold (8192)");
    AscendC::LocalTensor<int32_t> c = meta_.template Get<int32_t>();
    AscendC::Duplicate(c, 0, static_cast<int32_t>(Min(experts, kMaxExperts)));
    AscendC::PipeBarrier<PIPE_ALL>();   // the vector fill is done before the scalar unit counts
    return c;
  }

  // next[e] = offs[e], the first row of this rank's entries for expert e, loaded into UB.
  __aicore__ inline AscendC::LocalTensor<int32_t> Cursors(__gm__ int32_t* offs, int64_t experts) {
    AscendC::LocalTensor<int32_t> next = Counters(experts);
    Fetch(next, offs, Min(experts, kMaxExperts));
    return next;
  }

  __aicore__ inline AscendC::LocalTensor<int32_t> Ids() {
    return stage_.template GetWithOffset<int32_t>(static_cast<uint32_t>(kRouteChunk), 0);
  }

  // dst[0, n) = src[0, n) from GM into UB by DMA, complete before the scalar unit reads it.
  template <typename D>
  __aicore__ inline void Fetch(AscendC::LocalTensor<D>& dst, __gm__ D* src, int64_t n) {
    if (n <= 0) return;
    AscendC::GlobalTensor<D> g;
    g.SetGlobalBuffer(src, n);
    AscendC::PipeBarrier<PIPE_ALL>();   // earlier scalar reads of dst are done
    LoadTile(dst, g, static_cast<uint32_t>(n));
    AscendC::PipeBarrier<PIPE_ALL>();
  }

  // dst[0, n) = src[0, n) from UB to GM by DMA, after the scalar unit's writes to src.
  template <typename D>
  __aicore__ inline void Emit(__gm__ D* dst, AscendC::LocalTensor<D>& src, int64_t n) {
    if (n <= 0) return;
    AscendC::GlobalTensor<D> g;
    g.SetGlobalBuffer(dst, n);
    AscendC::PipeBarrier<PIPE_ALL>();
    StoreTile(g, src, static_cast<uint32_t>(Min(n, kMaxExperts)));
    AscendC::PipeBarrier<PIPE_ALL>();
  }

  __aicore__ inline void Fault(const char* what) {
#ifdef STRATA_CPU_MODEL
    ::strata_cpu::Fail("%s", what);
#else
    (void)what;   // on the NPU the entry is skipped: nothing is written outside the window
#endif
  }

  AscendC::TBuf<AscendC::TPosition::VECCALC> meta_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> stage_;
  AscendC::TQue<AscendC::TPosition::VECIN, 2> inQ_;
  AscendC::TQue<AscendC::TPosition::VECOUT, 2> outQ_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> acc_;
  AscendC::TBuf<AscendC::TPosition::VECCALC> tmp_;
  Ranks active_;
  bool masked_ = false;
  int64_t world_ = 1;
};

// End of a stage: this core's SDMA copies are complete and its MTE writes are out, then every core
// of the rank has reached the same point.
template <typename T>
__aicore__ inline void EndStage(Mover<T>& mv) {
  mv.Quiet();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
}

// End of an asynchronous stage (`on sdma async h:`): this core's SDMA copies stay queued and the
// core goes on without waiting for the others; `Await` completes them. Nothing to do but keep the
// MTE writes of the stage (none: an SDMA stage only posts) ordered before what follows.
template <typename T>
__aicore__ inline void PostStage(Mover<T>& mv) {
  (void)mv;
}

// `await h`: this core's SDMA queue is drained (SHMEM's quiet completes every copy the core posted
// so far, h's and any posted before or after it), then every core of the rank has reached the
// same point, so that a signal after it follows the data of every core.
template <typename T>
__aicore__ inline void Await(Mover<T>& mv) {
  EndStage(mv);
}

// Slot i of a sync area (its int32 word; the rest of the slot's line is padding).
__aicore__ inline __gm__ int32_t* SyncSlot(__gm__ int32_t* sync, int64_t i) {
  return sync + i * kSyncSlotInts;
}

// Sets flag slot `slot` (a local symmetric address) on rank `pe` to `stamp`.
__aicore__ inline void Signal(__gm__ int32_t* slot, int32_t stamp, int64_t pe) {
  aclshmemx_signal_op(slot, stamp, ACLSHMEM_SIGNAL_SET, static_cast<int>(pe));
}

// Waits until this rank's flag slot holds `stamp` or a later call's stamp.
__aicore__ inline void WaitFlag(__gm__ int32_t* slot, int32_t stamp) {
  aclshmem_signal_wait_until(slot, ACLSHMEM_CMP_GE, stamp);
}

// Cross-rank barrier over the slots [0, world) of the sync area (SyncSlot): slot p of rank q holds
// the stamp of the last barrier rank p announced to q. The cores share the peers between them.
__aicore__ inline void Barrier(__gm__ int32_t* slots, int32_t stamp) {
  const int64_t me = aclshmem_my_pe(), world = aclshmem_n_pes();
  const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
  for (int64_t p = c; p < world; p += cores) Signal(SyncSlot(slots, me), stamp, p);
  for (int64_t p = c; p < world; p += cores) {
    STRATA_WAIT_NOTE("barrier", slots, world, p);
    WaitFlag(SyncSlot(slots, p), stamp);
  }
  AscendC::SyncAll<true>();
}

// kAgreeInts words GM -> UB by DMA, complete before the scalar unit reads them.
__aicore__ inline void FetchWords(AscendC::LocalTensor<int32_t>& dst, __gm__ int32_t* src) {
  AscendC::GlobalTensor<int32_t> g;
  g.SetGlobalBuffer(src, kAgreeInts);
  AscendC::PipeBarrier<PIPE_ALL>();   // earlier scalar reads of dst are done
  AscendC::DataCopy(dst, g, kAgreeInts);
  AscendC::PipeBarrier<PIPE_ALL>();
}

// The ranks agree on the call before any of them writes to another (docs/robustness.md, "Ranks that
// make different calls"). Before the launch the host wrote this rank's record of the call into
// AgreeRecord(sync, world, epoch & 1): the call number and a hash of the schedule and of the call's
// instance (world, sizes, dtype, op, rank parameters, mask; stratac/host/schedule.py). The live
// ranks (Live) meet at a barrier of the call's own stamp, epoch + 0, which no barrier or flag of the
// schedule uses; its signals go only to the barrier slots, never to a buffer or a schedule's flag.
// Then every core reads its rank's record and every live peer's (MTE reads) and compares their
// heads: every core reaches the same verdict, so no core waits for another. On a difference,
// core 0 leaves the call number and the first peer that differs in the verdict line (by DMA) and
// every core returns false: the kernel returns without having written anything outside its own
// sync area. As every rank reads every live peer, each rank of a call whose ranks do not all agree
// finds at least one that differs. A kernel whose first statement is a world barrier has it
// replaced by this one (the same ordering: every live rank has entered the call).
// The barrier of the live ranks at the call's own stamp (epoch + 0) that Agree begins with: after
// it every live rank has entered the call, which the verifier assumes of every kernel (no schedule
// statement runs before it). Alone, as the first statement, only in a kernel built without the
// agreement (stratac bench --agreement-cost).
__aicore__ inline void EntryBarrier(__gm__ int32_t* sync, int32_t epoch, const Ranks& active) {
  const int64_t me = aclshmem_my_pe(), world = aclshmem_n_pes();
  const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
  // the kernel's first statement: nothing before it to drain
  for (int64_t p = c; p < world; p += cores) {
    if (Live(active, p)) Signal(SyncSlot(sync, me), epoch, p);
  }
  for (int64_t p = c; p < world; p += cores) {
    if (!Live(active, p)) continue;
    STRATA_WAIT_NOTE("barrier", sync, world, p);
    WaitFlag(SyncSlot(sync, p), epoch);
  }
  AscendC::SyncAll<true>();
}

template <typename T>
__aicore__ inline bool Agree(Mover<T>& mv, __gm__ int32_t* sync, int32_t epoch, const Ranks& active) {
  const int64_t me = aclshmem_my_pe(), world = aclshmem_n_pes();
  const int64_t c = AscendC::GetBlockIdx();
  EntryBarrier(sync, epoch, active);
  __gm__ int32_t* mine = AgreeRecord(sync, world, epoch & 1);
  AscendC::LocalTensor<int32_t> own = mv.Words();
  AscendC::LocalTensor<int32_t> peer = own[kAgreeInts];
  STRATA_SYNC_TRAFFIC(true);
  FetchWords(own, mine);
  int64_t differs = -1;
  for (int64_t p = 0; p < world && differs < 0; ++p) {
    if (p == me || !Live(active, p)) continue;
    FetchWords(peer, At(mine, 0, p));
    for (uint32_t i = 0; i < kAgreeInts; ++i) {
      if (peer.GetValue(i) != own.GetValue(i)) {
        differs = p;
        break;
      }
    }
  }
  if (differs < 0) {
    STRATA_SYNC_TRAFFIC(false);
    return true;
  }
  if (c == 0) {
    for (uint32_t i = 0; i < kAgreeInts; ++i) peer.SetValue(i, 0);
    peer.SetValue(0, own.GetValue(0));
    peer.SetValue(1, static_cast<int32_t>(differs));
    AscendC::GlobalTensor<int32_t> g;
    g.SetGlobalBuffer(AgreeVerdict(sync, world), kAgreeInts);
    AscendC::PipeBarrier<PIPE_ALL>();   // the scalar writes are in UB before the DMA reads them
    AscendC::DataCopy(g, peer, kAgreeInts);
    AscendC::PipeBarrier<PIPE_ALL>();
  }
  STRATA_SYNC_TRAFFIC(false);
  return false;
}

// A team of the .strata source (`team node = block(T)`, `stride(T)`, `across(node)`) as a kernel
// sees it: member i is base + i * step, and the running rank is member `rank` of `size`. A kernel
// computes its teams once, in Init, from rank and world (the verifier proved at every instance
// that T divides world); the source's `node.size`, `node.rank` and `node[i]` read them.
struct Team {
  int64_t size = 1;
  int64_t rank = 0;
  int64_t base = 0;
  int64_t step = 1;
};

// The T consecutive ranks rank / T * T .. rank / T * T + T - 1 (`block(T)`).
__aicore__ inline Team BlockTeam(int64_t rank, int64_t t) { return Team{t, rank % t, rank / t * t, 1}; }

// The `size` consecutive ranks from `first` (`groups(S0, S1, ...)`: the running rank's group,
// its first rank and size computed by the kernel from the sizes).
__aicore__ inline Team GroupTeam(int64_t rank, int64_t first, int64_t size) {
  return Team{size, rank - first, first, 1};
}

// The world / T ranks with the same rank % T (`stride(T)`, `across(node)` for a node of T).
__aicore__ inline Team StrideTeam(int64_t rank, int64_t world, int64_t t) {
  return Team{world / t, rank / t, rank % t, t};
}

// Barrier of a team (`barrier(node)` in the .strata source): the `size` ranks base, base + step,
// ..., base + (size - 1) * step, the running rank among them. The same slots and stamps as Barrier:
// rank p announces to each member q in q's slot p, and waits for every member's slot in its own
// area to hold the stamp or a later one. A rank's stamps grow with every barrier it passes, world
// or team, and a member announces to q only at barriers q takes part in, so a later stamp in a
// slot means that member has reached this barrier (the verifier checks that the members of a team
// meet at equal stamps). Ranks outside the team are neither signalled nor waited for.
__aicore__ inline void TeamBarrier(__gm__ int32_t* slots, int32_t stamp, int64_t base, int64_t step,
                                   int64_t size) {
  const int64_t me = aclshmem_my_pe();
  const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
  for (int64_t i = c; i < size; i += cores) Signal(SyncSlot(slots, me), stamp, base + i * step);
  for (int64_t i = c; i < size; i += cores) {
    const int64_t p = base + i * step;
    STRATA_WAIT_NOTE("team barrier", slots, aclshmem_n_pes(), p);
    WaitFlag(SyncSlot(slots, p), stamp);
  }
  AscendC::SyncAll<true>();
}

// The barrier of a team the kernel computed in Init (strata::BlockTeam, strata::StrideTeam).
__aicore__ inline void TeamBarrier(__gm__ int32_t* slots, int32_t stamp, const Team& team) {
  TeamBarrier(slots, stamp, team.base, team.step, team.size);
}

// Barrier over the live ranks of a mask only (Live): a masked rank is neither signalled nor waited
// for, so a call that masks a dead rank never waits on its slots (whatever stamp it left there: the
// stamps grow call by call, and its slot is simply not read). Every live rank must pass the same
// mask; a live rank that another live rank masks never gets that rank's announcement, and its
// wait ends at the deadline naming the slot. Kept apart from a team barrier on purpose: the slots
// are the world barrier's [0, world), indexed by global rank, as Barrier's.
__aicore__ inline void MaskedBarrier(__gm__ int32_t* slots, int32_t stamp, const Ranks& active) {
  const int64_t me = aclshmem_my_pe(), world = aclshmem_n_pes();
  const int64_t c = AscendC::GetBlockIdx(), cores = AscendC::GetBlockNum();
  AscendC::PipeBarrier<PIPE_ALL>();
  AscendC::SyncAll<true>();
  for (int64_t p = c; p < world; p += cores) {
    if (Live(active, p)) Signal(SyncSlot(slots, me), stamp, p);
  }
  for (int64_t p = c; p < world; p += cores) {
    if (!Live(active, p)) continue;
    STRATA_WAIT_NOTE("barrier", slots, world, p);   // the timeout lists every rank's slot below the stamp
    WaitFlag(SyncSlot(slots, p), stamp);
  }
  AscendC::SyncAll<true>();
}

}  // namespace strata

#endif  // STRATA_DEVICE_H
