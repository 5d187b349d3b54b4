// Test kernels for the CPU model, written as Ascend C kernels against kernel_operator.h/shmem.h
// and built as a shared library linked against libstratacpu.so (the layout generated kernels use).
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include <stdexcept>

#include "kernel_operator.h"
#include "shmem.h"
#include "strata_cpu.h"

using namespace AscendC;

namespace {
constexpr uint32_t Align32(uint32_t bytes) { return (bytes + 31) / 32 * 32; }
}  // namespace

// ---------------------------------------------------------------------------------------------
// exchange: every core of every rank sends its chunk of `src` to every rank, once with MTE
// (aclshmem_ptr + DataCopyPad) and once with SDMA puts, signals each rank, waits for all ranks'
// signals, then SDMA-gets the next rank's chunk.
extern "C" __global__ __aicore__ void exchange_kernel(GM_ADDR src, GM_ADDR recv_mte, GM_ADDR recv_sdma,
                                                      GM_ADDR recv_get, GM_ADDR flags, uint32_t n) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  const int64_t c = GetBlockIdx(), C = GetBlockNum();
  const int me = aclshmem_my_pe(), W = aclshmem_n_pes();
  TPipe pipe;
  TBuf<TPosition::VECCALC> data, scratch;
  pipe.InitBuffer(data, Align32(n * sizeof(float)));
  pipe.InitBuffer(scratch, 64);
  LocalTensor<float> t = data.Get<float>();
  LocalTensor<float> s = scratch.Get<float>();
  // signal ADD stages through SHMEM's MTE UB region: move it past TPipe's buffers (end of UB)
  aclshmemx_set_mte_config(196608 - 16384, 16384, EVENT_ID0);

  float* my_src = reinterpret_cast<float*>(src) + c * n;
  GlobalTensor<float> srcG;
  srcG.SetGlobalBuffer(my_src, n);
  DataCopyExtParams cp(1, n * sizeof(float), 0, 0, 0);
  DataCopyPad(t, srcG, cp, DataCopyPadExtParams<float>(false, 0, 0, 0.f));
  SetFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
  WaitFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
  const uint64_t slot = (uint64_t(me) * C + c) * n;
  for (int p = 0; p < W; ++p) {
    GlobalTensor<float> d;
    d.SetGlobalBuffer(static_cast<float*>(aclshmem_ptr(reinterpret_cast<float*>(recv_mte) + slot, p)), n);
    DataCopyPad(d, t, cp);
  }
  for (int p = 0; p < W; ++p)
    aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(recv_sdma) + slot, my_src, s.GetPhyAddr(), 64, n, p, EVENT_ID0);
  aclshmemx_sdma_quiet(s.GetPhyAddr(), 64, EVENT_ID0);
  // one 64-byte line per core: flag[0] is signalled (a signal needs a line of its own), flag[1..2]
  // count mismatches (scalar writes of this core only)
  int32_t* flag = reinterpret_cast<int32_t*>(flags) + c * 16;
  // After the quiet the copy to this rank has landed: count mismatches in flag[1] (expected 0).
  // The scalar reads below see GM written by DMA and SDMA (and by the host and earlier launches),
  // so the core's data cache is invalidated first.
  GlobalTensor<float> self, orig;
  self.SetGlobalBuffer(reinterpret_cast<float*>(recv_sdma) + slot, n);
  orig.SetGlobalBuffer(my_src, n);
  GlobalTensor<int32_t> bad;
  bad.SetGlobalBuffer(flag, 16);
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(bad);
  for (uint32_t i = 0; i < n; ++i)
    if (self.GetValue(i) != orig.GetValue(i)) bad.SetValue(1, bad.GetValue(1) + 1);
  // written back before the signal flushes the same line
  DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(bad);
  for (int p = 0; p < W; ++p) aclshmemx_signal_op(flag, 1, ACLSHMEM_SIGNAL_ADD, p);
  aclshmem_signal_wait_until(flag, ACLSHMEM_CMP_EQ, W);
  aclshmemx_sdma_get_nbi(reinterpret_cast<float*>(recv_get) + c * n, my_src, s.GetPhyAddr(), 64, n, (me + 1) % W,
                         EVENT_ID0);
  aclshmemx_sdma_quiet(s.GetPhyAddr(), 64, EVENT_ID0);
  GlobalTensor<float> got, theirs;  // mismatches with the peer's chunk in flag[2]
  got.SetGlobalBuffer(reinterpret_cast<float*>(recv_get) + c * n, n);
  theirs.SetGlobalBuffer(static_cast<float*>(aclshmem_ptr(my_src, (me + 1) % W)), n);
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(bad);
  for (uint32_t i = 0; i < n; ++i)
    if (got.GetValue(i) != theirs.GetValue(i)) bad.SetValue(2, bad.GetValue(2) + 1);
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(bad);
  SyncAll();
}

extern "C" int launch_exchange(uint32_t blocks, uint8_t* src, uint8_t* recv_mte, uint8_t* recv_sdma,
                               uint8_t* recv_get, uint8_t* flags, uint32_t n) {
  return STRATA_CPU_LAUNCH(exchange_kernel, blocks, src, recv_mte, recv_sdma, recv_get, flags, n);
}

// ---------------------------------------------------------------------------------------------
// atomics: every core of every rank adds (float and int32) and maxes into rank 0's buffers.
extern "C" __global__ __aicore__ void atomic_kernel(GM_ADDR acc_f, GM_ADDR acc_i, GM_ADDR acc_max, uint32_t m,
                                                    uint32_t rounds) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const int64_t c = GetBlockIdx(), C = GetBlockNum();
  const int me = aclshmem_my_pe();
  TPipe pipe;
  TQue<TPosition::VECOUT, 1> q;
  pipe.InitBuffer(q, 2, m * 4);
  const int32_t k = int32_t(me * C + c + 1);
  GlobalTensor<float> f, mx;
  GlobalTensor<int32_t> in;
  f.SetGlobalBuffer(static_cast<float*>(aclshmem_ptr(acc_f, 0)), m);
  in.SetGlobalBuffer(static_cast<int32_t*>(aclshmem_ptr(acc_i, 0)), m);
  mx.SetGlobalBuffer(static_cast<float*>(aclshmem_ptr(acc_max, 0)), m);
  for (uint32_t r = 0; r < rounds; ++r) {
    LocalTensor<float> a = q.AllocTensor<float>();
    for (uint32_t i = 0; i < m; ++i) a.SetValue(i, float(k * int32_t(i % 7 + 1)));
    q.EnQue(a);
    a = q.DeQue<float>();
    SetAtomicAdd<float>();
    DataCopy(f, a, m);
    SetAtomicNone();
    q.FreeTensor(a);

    LocalTensor<int32_t> b = q.AllocTensor<int32_t>();
    for (uint32_t i = 0; i < m; ++i) b.SetValue(i, k * 1000003 * int32_t(i + 1));  // wraps
    SetAtomicAdd<int32_t>();
    DataCopy(in, b, m);
    DisableDmaAtomic();
    q.FreeTensor(b);

    LocalTensor<float> x = q.AllocTensor<float>();
    for (uint32_t i = 0; i < m; ++i) x.SetValue(i, float((k * 37 + int32_t(i) + int32_t(r) * 11) % 101));
    SetAtomicMax<float>();
    DataCopy(mx, x, m);
    SetAtomicNone();
    q.FreeTensor(x);
  }
}

extern "C" int launch_atomic(uint32_t blocks, uint8_t* acc_f, uint8_t* acc_i, uint8_t* acc_max, uint32_t m,
                             uint32_t rounds) {
  return STRATA_CPU_LAUNCH(atomic_kernel, blocks, acc_f, acc_i, acc_max, m, rounds);
}

// ---------------------------------------------------------------------------------------------
// syncall: in each round every core publishes a value, SyncAll, every core sums all published
// values, SyncAll. Without a real barrier the sums come out wrong. Scalar GM data follows the
// D-cache rules: each core's slot is a 64-byte line of its own, flushed after the write and
// invalidated before the reads; core c's sums are row c ([C][stride], stride a multiple of 16 ints).
extern "C" __global__ __aicore__ void syncall_kernel(GM_ADDR slots, GM_ADDR sums, uint32_t rounds) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  const int64_t c = GetBlockIdx(), C = GetBlockNum();
  const uint64_t stride = (rounds + 15) / 16 * 16;
  GlobalTensor<int32_t> sl, su;
  sl.SetGlobalBuffer(reinterpret_cast<int32_t*>(slots), C * 16);
  su.SetGlobalBuffer(reinterpret_cast<int32_t*>(sums), uint64_t(C) * stride);
  for (uint32_t r = 0; r < rounds; ++r) {
    if ((r + c) % 3 == 0) sched_yield();  // shuffle the arrival order
    sl.SetValue(c * 16, int32_t(r * C + c));
    DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(sl[c * 16]);
    SyncAll();
    DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(sl);
    int32_t total = 0;
    for (int64_t j = 0; j < C; ++j) total += sl.GetValue(j * 16);
    su.SetValue(c * stride + r, total);
    SyncAll();
  }
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(su);
}

extern "C" int launch_syncall(uint32_t blocks, uint8_t* slots, uint8_t* sums, uint32_t rounds) {
  return STRATA_CPU_LAUNCH(syncall_kernel, blocks, slots, sums, rounds);
}

// ---------------------------------------------------------------------------------------------
// numeric: casts in every round mode and elementwise arithmetic; see driver.cpp for the layout.
template <class T>
static void Load(LocalTensor<T> dst, GM_ADDR base, uint64_t byte_off, uint32_t n) {
  GlobalTensor<T> g;
  g.SetGlobalBuffer(reinterpret_cast<T*>(base + byte_off), n);
  DataCopy(dst, g, n);
}
template <class T>
static void Store(GM_ADDR base, uint64_t byte_off, LocalTensor<T> src, uint32_t n) {
  GlobalTensor<T> g;
  g.SetGlobalBuffer(reinterpret_cast<T*>(base + byte_off), n);
  DataCopy(g, src, n);
}

extern "C" __global__ __aicore__ void numeric_kernel(GM_ADDR in, GM_ADDR out, uint32_t n) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  TPipe pipe;
  TBuf<> b_in, b_tmp, b_tmp2;
  pipe.InitBuffer(b_in, 8 * n * 4);
  pipe.InitBuffer(b_tmp, n * 4);
  pipe.InitBuffer(b_tmp2, n * 4);
  TBuf<> b_fa, b_fb;
  pipe.InitBuffer(b_fa, n * 4);
  pipe.InitBuffer(b_fb, n * 4);
  // input: xs f32[n] | ha f16[n] | hb f16[n] | ba bf16[n] | bb bf16[n] | ia i32[n] | ib i32[n]
  LocalTensor<uint8_t> raw = b_in.Get<uint8_t>();
  LocalTensor<float> xs = raw.ReinterpretCast<float>();
  LocalTensor<half> ha = raw[n * 4].ReinterpretCast<half>();
  LocalTensor<half> hb = raw[n * 6].ReinterpretCast<half>();
  LocalTensor<bfloat16_t> ba = raw[n * 8].ReinterpretCast<bfloat16_t>();
  LocalTensor<bfloat16_t> bb = raw[n * 10].ReinterpretCast<bfloat16_t>();
  LocalTensor<int32_t> ia = raw[n * 12].ReinterpretCast<int32_t>();
  LocalTensor<int32_t> ib = raw[n * 16].ReinterpretCast<int32_t>();
  Load(xs, in, 0, n);
  Load(ha, in, n * 4, n);
  Load(hb, in, n * 6, n);
  Load(ba, in, n * 8, n);
  Load(bb, in, n * 10, n);
  Load(ia, in, n * 12, n);
  Load(ib, in, n * 16, n);
  SetFlag<HardEvent::MTE2_V>(EVENT_ID0);
  WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);

  const RoundMode modes[7] = {RoundMode::CAST_NONE,  RoundMode::CAST_RINT,  RoundMode::CAST_FLOOR,
                              RoundMode::CAST_CEIL,  RoundMode::CAST_ROUND, RoundMode::CAST_TRUNC,
                              RoundMode::CAST_ODD};
  LocalTensor<half> th = b_tmp.Get<half>();
  LocalTensor<bfloat16_t> tb = b_tmp.Get<bfloat16_t>();
  LocalTensor<int32_t> ti = b_tmp.Get<int32_t>();
  LocalTensor<float> tf = b_tmp.Get<float>();
  uint64_t o = 0;
  // output: f32->f16 [7][n] | f32->bf16 [7][n] | f32->i32 [7][n] | i32->f32 [7][n] | (unused) [7][n]
  // Only the modes the A2/A3 Cast table gives each pair (ascendc_cast.h); the rows of the other
  // modes stay zero, and int32 -> half (needs SetDeqScale) is not built at all.
  const auto directed = [](RoundMode m) { return m != RoundMode::CAST_NONE && m != RoundMode::CAST_ODD; };
  for (auto m : modes) { Cast(th, xs, m, n); Store(out, o, th, n); o += n * 2; }
  for (auto m : modes) { if (directed(m)) { Cast(tb, xs, m, n); Store(out, o, tb, n); } o += n * 2; }
  for (auto m : modes) { if (directed(m)) { Cast(ti, xs, m, n); Store(out, o, ti, n); } o += n * 4; }
  for (auto m : modes) { if (m != RoundMode::CAST_ODD) { Cast(tf, ia, m, n); Store(out, o, tf, n); } o += n * 4; }
  o += 7 * n * 2;
  // | f16 round trip: f16(rint)->f32 [n] | bf16(rint)->f32 [n]
  Cast(th, xs, RoundMode::CAST_RINT, n);
  LocalTensor<float> tf2 = b_tmp2.Get<float>();
  Cast(tf2, th, RoundMode::CAST_NONE, n);
  Store(out, o, tf2, n); o += n * 4;
  Cast(tb, xs, RoundMode::CAST_RINT, n);
  Cast(tf2, tb, RoundMode::CAST_NONE, n);
  Store(out, o, tf2, n); o += n * 4;
  // | half: add sub mul max min muls(0.1) adds(3) [7][n]
  Add(th, ha, hb, n); Store(out, o, th, n); o += n * 2;
  Sub(th, ha, hb, n); Store(out, o, th, n); o += n * 2;
  Mul(th, ha, hb, n); Store(out, o, th, n); o += n * 2;
  Max(th, ha, hb, n); Store(out, o, th, n); o += n * 2;
  Min(th, ha, hb, n); Store(out, o, th, n); o += n * 2;
  Muls(th, ha, half(0.1f), n); Store(out, o, th, n); o += n * 2;
  Adds(th, ha, half(3.0f), n); Store(out, o, th, n); o += n * 2;
  // | bf16: same [7][n], as A2/A3 compute it (no bfloat16_t arithmetic there): Cast to float
  // (CAST_NONE), the op in float, Cast back (CAST_RINT)
  LocalTensor<float> fa = b_fa.Get<float>();
  LocalTensor<float> fb = b_fb.Get<float>();
  const auto bf16_op = [&](auto op) {
    Cast(fa, ba, RoundMode::CAST_NONE, n);
    Cast(fb, bb, RoundMode::CAST_NONE, n);
    op();
    Cast(tb, fa, RoundMode::CAST_RINT, n);
    Store(out, o, tb, n);
    o += n * 2;
  };
  const int32_t cnt = static_cast<int32_t>(n);
  bf16_op([&] { Add(fa, fa, fb, cnt); });
  bf16_op([&] { Sub(fa, fa, fb, cnt); });
  bf16_op([&] { Mul(fa, fa, fb, cnt); });
  bf16_op([&] { Max(fa, fa, fb, cnt); });
  bf16_op([&] { Min(fa, fa, fb, cnt); });
  bf16_op([&] { Muls(fa, fa, static_cast<float>(bfloat16_t(0.1f)), cnt); });
  bf16_op([&] { Adds(fa, fa, 3.0f, cnt); });
  // | int32: add sub mul max min [5][n]
  Add(ti, ia, ib, n); Store(out, o, ti, n); o += n * 4;
  Sub(ti, ia, ib, n); Store(out, o, ti, n); o += n * 4;
  Mul(ti, ia, ib, n); Store(out, o, ti, n); o += n * 4;
  Max(ti, ia, ib, n); Store(out, o, ti, n); o += n * 4;
  Min(ti, ia, ib, n); Store(out, o, ti, n); o += n * 4;
  // | float: Duplicate(1.5) then Muls(-2) [n]
  Duplicate(tf, 1.5f, n);
  Muls(tf, tf, -2.0f, n);
  Store(out, o, tf, n); o += n * 4;
}

extern "C" int launch_numeric(uint8_t* in, uint8_t* out, uint32_t n) {
  return STRATA_CPU_LAUNCH(numeric_kernel, 1, in, out, n);
}

// ---------------------------------------------------------------------------------------------
// Rule violations. `which` selects the case; `buf` is a 4 KiB symmetric buffer.
enum FailCase {
  kUbOverflow = 0, kDataCopy36, kGmPastSize, kGmOutsidePool, kSyncAllAivOnly, kSyncAllUndeclared,
  kSdmaNoQuiet, kSdmaSmallScratch, kSdmaCore48, kWaitTimeout, kQueExhausted, kWaitFlagUnset, kUbBounds,
  kShmemPtrForeign, kPadBlockCount, kSyncAllExited, kThrow, kPeerAbort, kTBufOffset, kDeQueEmpty,
  kBarrierMissingRank, kNamedFlagTimeout,
  // the scalar data cache and signal lines (strata_cpu.h: ScalarLoad, ScalarStore, ...)
  kUnpaddedFlags, kStaleReadPeer, kStaleReadPeerFlushed, kTwoCoresOneLine, kOwnLinesFlushed,
  kDirtyAtReturn, kLostWrite, kReadLine, kReadLineFlushed,
  kCastModeAtRunTime, kCastWideningOverlap,
  // SDMA queue, event ids, SHMEM's UB (runtime/cpu/src/)
  kSdmaRowPosts, kSdmaBigPost, kEventSetSet, kEventQueueCollision,
  kSignalAddDefaultUb, kEventAllocAvoidsQueue,
  // UB 32-byte alignment of vector / Cast operands, GM element alignment of DataCopy (ascendc_data_copy.h)
  kAddUnaligned, kMulsUnaligned, kDupUnaligned, kCastUnaligned, kGmElemUnaligned,
  // int8 <-> half Cast (the legal A2/A3 pairs), then an out-of-range half refused
  kCastInt8,
  // world 2: rank 0 SDMA-puts 64 floats to rank 1 and signals it; rank 1 waits and reads them
  // (runtime/cpu/src/ledger.cpp, "The SDMA ledger"): signal before the quiet (refused), quiet then signal, and an
  // unrelated signal while the copy is posted followed by quiet and a second signal (both pass)
  kSdmaFlagBeforeQuiet, kSdmaQuietThenFlag, kSdmaAnnouncedThenQuieted,
  // an SDMA put of 64 floats onto the same buffer 8 floats further on (overlapping)
  kSdmaOverlap,
};

extern "C" __global__ __aicore__ void fail_kernel(GM_ADDR buf, int32_t which) {
  const int64_t c = GetBlockIdx(), C = GetBlockNum();
  const bool aiv_only = which == kSyncAllAivOnly || which == kSdmaCore48 || which == kQueExhausted;
  if (which != kSyncAllUndeclared) KERNEL_TASK_TYPE_DEFAULT(aiv_only ? KERNEL_TYPE_AIV_ONLY : KERNEL_TYPE_MIX_AIV_1_0);
  TPipe pipe;
  TBuf<> tb;
  pipe.InitBuffer(tb, 4096);
  LocalTensor<float> t = tb.Get<float>();
  GlobalTensor<float> g;
  g.SetGlobalBuffer(reinterpret_cast<float*>(buf), 1024);
  const bool actor = c == C - 1;  // the last core breaks the rule; the others wait in SyncAll
  switch (which) {
    case kUbOverflow: {
      if (actor) {
        TQue<TPosition::VECIN, 2> q;
        strata_cpu::SetLine(21);
        pipe.InitBuffer(q, 2, 100000);
      }
      break;
    }
    case kDataCopy36:
      if (actor) {
        strata_cpu::SetLine(12);
        DataCopy(t, g, 9);  // 36 bytes
      }
      break;
    case kGmPastSize:
      if (actor) {
        GlobalTensor<float> small;
        small.SetGlobalBuffer(reinterpret_cast<float*>(buf), 16);
        DataCopy(small, t, 32);
      }
      break;
    case kGmOutsidePool:
      if (actor) {
        GlobalTensor<float> far;
        far.SetGlobalBuffer(reinterpret_cast<float*>(buf) + (uint64_t(1) << 30));
        DataCopy(t, far, 8);
      }
      break;
    case kSyncAllAivOnly:
    case kSyncAllUndeclared:
      SyncAll();
      break;
    case kSdmaNoQuiet:
      if (actor) aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf) + 512,
                                        t.GetPhyAddr(), 64, 128, 0, EVENT_ID0);
      break;
    case kSdmaSmallScratch:
      if (actor) aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf) + 512,
                                        t.GetPhyAddr(), 32, 128, 0, EVENT_ID0);
      break;
    case kSdmaCore48: {
      float* dst = reinterpret_cast<float*>(buf) + (c % 16) * 8;
      aclshmemx_sdma_put_nbi(dst, dst, t.GetPhyAddr(), 64, 8, 0, EVENT_ID0);
      aclshmemx_sdma_quiet(t.GetPhyAddr(), 64, EVENT_ID0);
      return;
    }
    case kWaitTimeout:
      if (actor) {
        int32_t* flag = reinterpret_cast<int32_t*>(buf) + 64;
        aclshmemx_signal_op(flag, 3, ACLSHMEM_SIGNAL_SET, 0);
        aclshmem_signal_wait_until(flag, ACLSHMEM_CMP_EQ, 7);
      }
      break;
    case kQueExhausted: {
      TQue<TPosition::VECIN, 1> q;
      pipe.InitBuffer(q, 2, 256);
      LocalTensor<float> a = q.AllocTensor<float>();
      LocalTensor<float> b = q.AllocTensor<float>();
      (void)a; (void)b;
      q.FreeTensor(a);
      LocalTensor<float> a2 = q.AllocTensor<float>();  // fine: a was freed
      (void)a2;
      LocalTensor<float> d = q.AllocTensor<float>();  // third live buffer of two
      (void)d;
      return;
    }
    case kWaitFlagUnset:
      if (actor) {
        SetFlag<HardEvent::V_MTE3>(EVENT_ID1);
        WaitFlag<HardEvent::V_MTE3>(EVENT_ID1);
        WaitFlag<HardEvent::V_MTE3>(EVENT_ID1);
      }
      break;
    case kUbBounds:
      if (actor) Add(t[1000], t, t, 64);  // 1000 + 64 > 1024 floats
      break;
    case kShmemPtrForeign:
      if (actor) {
        static float not_in_heap[16];
        aclshmem_ptr(not_in_heap, 0);
      }
      break;
    case kPadBlockCount:
      if (actor) DataCopyPad(g, t, DataCopyExtParams(2, 64, 0, 0, 0));
      break;
    case kSyncAllExited:
      if (c == 0) return;
      SyncAll();
      return;
    case kThrow:
      if (actor) throw std::runtime_error("boom");
      break;
    case kPeerAbort: {
      // rank 1's last core breaks a rule once every other core of the job is about to wait for a
      // flag no one sets: each adds 1 to a counter on rank 1 first (a readiness signal, no sleep).
      int32_t* flag = reinterpret_cast<int32_t*>(buf) + 128;
      int32_t* arrived = reinterpret_cast<int32_t*>(buf) + 144;   // a 64-byte line of its own
      if (aclshmem_my_pe() == 1 && actor) {
        aclshmem_signal_wait_until(arrived, ACLSHMEM_CMP_GE, int32_t(aclshmem_n_pes() * C - 1));
        strata_cpu::SetLine(77);
        DataCopy(t, g, 9);
      } else {
        aclshmemx_set_mte_config(196608 - 16384, 16384, EVENT_ID0);   // ADD stages through SHMEM's UB
        aclshmemx_signal_op(arrived, 1, ACLSHMEM_SIGNAL_ADD, 1);
      }
      aclshmem_signal_wait_until(flag, ACLSHMEM_CMP_EQ, 1);
      return;
    }
    case kTBufOffset:
      if (actor) tb.GetWithOffset<float>(8, 100);
      break;
    case kDeQueEmpty:
      if (actor) {
        TQue<TPosition::VECOUT, 1> q;
        pipe.InitBuffer(q, 1, 256);
        q.DeQue<float>();
      }
      break;
    case kBarrierMissingRank: {
      // a barrier as strata_device.h's Barrier does it (with its STRATA_WAIT_NOTE), over slots at
      // buf + 1 KiB (not described to the model); the last rank never arrives
      // (one 64-byte line per slot)
      int32_t* slots = reinterpret_cast<int32_t*>(buf + 1024);
      const int me = aclshmem_my_pe(), W = aclshmem_n_pes();
      if (me == W - 1) break;
      strata_cpu::SetLine(31);
      for (int p = int(c); p < W; p += int(C)) aclshmemx_signal_op(slots + me * 16, 5, ACLSHMEM_SIGNAL_SET, p);
      for (int p = int(c); p < W; p += int(C)) {
        strata_cpu::NoteWait("barrier", slots, W, p);
        aclshmem_signal_wait_until(slots + p * 16, ACLSHMEM_CMP_GE, 5);
      }
      break;
    }
    case kNamedFlagTimeout:
      // the driver described the sync area at buf + 2 KiB: barrier slots [0, W), then go[4]
      if (actor) {
        int32_t* go = reinterpret_cast<int32_t*>(buf + 2048) + aclshmem_n_pes() * 16;  // 64 B per slot
        strata_cpu::SetLine(44);
        aclshmemx_signal_op(go + 16, 5, ACLSHMEM_SIGNAL_SET, 0);
        aclshmemx_signal_op(go + 32, 3, ACLSHMEM_SIGNAL_SET, 0);   // a stamp of an earlier call
        aclshmem_signal_wait_until(go + 32, ACLSHMEM_CMP_GE, 5);
      }
      break;
    case kUnpaddedFlags:
      // every rank signals its own flag on rank 0, the flags packed 4 bytes apart (as stratac's sync
      // area was): rank 1's flag is not at the start of a 64-byte line
      if (actor) {
        int32_t* flags = reinterpret_cast<int32_t*>(buf + 3072);
        strata_cpu::SetLine(51);
        aclshmemx_signal_op(flags + aclshmem_my_pe(), 1, ACLSHMEM_SIGNAL_SET, 0);
      }
      return;
    case kStaleReadPeer:
    case kStaleReadPeerFlushed: {
      // rank 0 reads x (its line is cached), lets rank 1 overwrite x by DMA, and reads x again
      int32_t* x = reinterpret_cast<int32_t*>(buf + 3072);
      int32_t* ping = reinterpret_cast<int32_t*>(buf + 3584);
      int32_t* pong = reinterpret_cast<int32_t*>(buf + 3648);
      GlobalTensor<int32_t> gx;
      gx.SetGlobalBuffer(x, 16);
      strata_cpu::SetLine(61);
      if (aclshmem_my_pe() == 0) {
        int32_t before = gx.GetValue(0);
        aclshmemx_signal_op(ping, 1, ACLSHMEM_SIGNAL_SET, 1);
        aclshmem_signal_wait_until(pong, ACLSHMEM_CMP_EQ, 1);
        if (which == kStaleReadPeerFlushed)
          DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(gx);
        strata_cpu::SetLine(62);
        int32_t after = gx.GetValue(0);
        if (before != 0 || after != 4242) strata_cpu::Fail("read %d then %d (expected 0 then 4242)", before, after);
      } else {
        aclshmem_signal_wait_until(ping, ACLSHMEM_CMP_EQ, 1);
        LocalTensor<int32_t> v = t.ReinterpretCast<int32_t>();
        Duplicate(v, int32_t(4242), 8);
        GlobalTensor<int32_t> peer;
        peer.SetGlobalBuffer(static_cast<int32_t*>(aclshmem_ptr(x, 0)), 8);
        DataCopy(peer, v, 8);
        aclshmemx_signal_op(pong, 1, ACLSHMEM_SIGNAL_SET, 0);
      }
      return;
    }
    case kTwoCoresOneLine:
    case kOwnLinesFlushed: {
      // core 0 writes int 0 of a line and flushes it; then core 1 writes int 1 (the same line) or,
      // fixed, int 16 (a line of its own)
      GlobalTensor<int32_t> gi;
      gi.SetGlobalBuffer(reinterpret_cast<int32_t*>(buf + 3072), 64);
      strata_cpu::SetLine(71);
      if (c == 0) {
        gi.SetValue(0, 7);
        DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(gi);
      }
      SyncAll();
      if (c == 1) {
        strata_cpu::SetLine(72);
        const uint64_t at = which == kTwoCoresOneLine ? 1 : 16;
        gi.SetValue(at, 8);
        DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(gi[at]);
      }
      SyncAll();
      if (c == 0) {
        DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE, DcciDst::CACHELINE_OUT>(gi);
        if (gi.GetValue(0) != 7 || gi.GetValue(16) != 8) strata_cpu::Fail("lost a flushed scalar write");
      }
      return;
    }
    case kDirtyAtReturn:
      if (actor) {
        GlobalTensor<int32_t> gi;
        gi.SetGlobalBuffer(reinterpret_cast<int32_t*>(buf + 3072), 16);
        strata_cpu::SetLine(81);
        gi.SetValue(3, 1);
      }
      return;
    case kLostWrite: {
      // core 0 caches the line (a read), core 1 writes other bytes of it by DMA, core 0 writes int 0
      // and flushes: the write-back of the whole line would undo core 1's bytes
      GlobalTensor<int32_t> gi;
      gi.SetGlobalBuffer(reinterpret_cast<int32_t*>(buf + 3072), 16);
      strata_cpu::SetLine(91);
      if (c == 0) (void)gi.GetValue(0);
      SyncAll();
      if (c == 1) {
        LocalTensor<int32_t> v = t.ReinterpretCast<int32_t>();
        Duplicate(v, int32_t(5), 8);
        DataCopy(gi[8], v, 8);
      }
      SyncAll();
      if (c == 0) {
        gi.SetValue(0, 1);
        strata_cpu::SetLine(92);
        DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(gi);
      }
      return;
    }
    case kReadLine:
    case kReadLineFlushed: {
      // core 0 prints the int the host put at buf + 3072 (the driver changes it between launches)
      GlobalTensor<int32_t> gi;
      gi.SetGlobalBuffer(reinterpret_cast<int32_t*>(buf + 3072), 16);
      if (c == 0) {
        strata_cpu::SetLine(101);
        if (which == kReadLineFlushed)
          DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(gi);
        printf("rank %d: read %d\n", aclshmem_my_pe(), gi.GetValue(0));
      }
      return;
    }
    case kCastModeAtRunTime:
      // a RoundMode only known at run time (read from GM: 0 = CAST_NONE), which float -> bfloat16_t
      // does not take on A2/A3
      if (actor) {
        LocalTensor<bfloat16_t> b16 = t[512].ReinterpretCast<bfloat16_t>();
        const RoundMode mode = static_cast<RoundMode>(static_cast<int>(g.GetValue(0)));
        strata_cpu::SetLine(52);
        Cast(b16, t, mode, 64);
      }
      break;
    case kCastWideningOverlap:
      // half -> float with the half source inside the float destination
      if (actor) {
        LocalTensor<half> h = t.ReinterpretCast<half>()[64];
        Cast(t, h, RoundMode::CAST_NONE, 64);
      }
      break;
    case kSdmaRowPosts:
      // one small post per "row", as a per-row place would: 257 one-SQE posts without a quiet
      if (actor) {
        strata_cpu::SetLine(51);
        for (int row = 0; row < 257; ++row)
          aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf) + 8 * (row % 64), reinterpret_cast<float*>(buf) + 512,
                                 t.GetPhyAddr(), 64, 8, 0, EVENT_ID0);
      }
      break;
    case kSdmaBigPost:
      // 254 posts of 32 B (254 SQEs), then one of 3 MiB (3 SQEs, inside the 4 MiB heap): 257 > 256
      if (actor) {
        for (int k = 0; k < 254; ++k)
          aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf) + 512, t.GetPhyAddr(),
                                 64, 8, 0, EVENT_ID0);
        aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf), t.GetPhyAddr(), 64,
                               3u << 18, 0, EVENT_ID0);
      }
      break;
    case kSdmaOverlap:
      if (actor)
        aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf) + 8, reinterpret_cast<float*>(buf), t.GetPhyAddr(), 64,
                               64, 0, EVENT_ID0);
      break;
    case kEventSetSet:
      if (actor) {
        SetFlag<HardEvent::S_MTE3>(EVENT_ID2);
        SetFlag<HardEvent::S_MTE3>(EVENT_ID2);
      }
      break;
    case kEventQueueCollision:
      // a copy queue's freed buffer holds an MTE3_MTE2 id set (until it is allocated again); an SDMA
      // call with the fixed EVENT_ID0 as sync_id then sets that same flag a second time
      if (actor) {
        TQueBind<TPosition::VECIN, TPosition::VECOUT, 2> q;
        pipe.InitBuffer(q, 2, 256);
        LocalTensor<float> a = q.AllocTensor<float>();
        q.EnQue(a);
        a = q.DeQue<float>();
        q.FreeTensor(a);
        aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(buf), reinterpret_cast<float*>(buf) + 512, t.GetPhyAddr(), 64,
                               8, 0, EVENT_ID0);
      }
      break;
    case kSignalAddDefaultUb:
      if (actor) aclshmemx_signal_op(reinterpret_cast<int32_t*>(buf) + 64, 1, ACLSHMEM_SIGNAL_ADD, 0);
      break;
    case kEventAllocAvoidsQueue: {
      // the same as kEventQueueCollision with the id from AllocEventID: no failure; the quiet and
      // the release pair up; then every remaining id is taken and one more AllocEventID fails
      TQueBind<TPosition::VECIN, TPosition::VECOUT, 2> q;
      pipe.InitBuffer(q, 2, 256);
      LocalTensor<float> a = q.AllocTensor<float>();
      q.EnQue(a);
      a = q.DeQue<float>();
      q.FreeTensor(a);
      TEventID id = pipe.AllocEventID<HardEvent::MTE3_MTE2>();
      float* dst = reinterpret_cast<float*>(buf) + (c % 16) * 8;
      aclshmemx_sdma_put_nbi(dst, dst, t.GetPhyAddr(), 64, 8, 0, id);
      aclshmemx_sdma_quiet(t.GetPhyAddr(), 64, id);
      pipe.ReleaseEventID<HardEvent::MTE3_MTE2>(id);
      if (actor) {
        for (int k = 0; k < 7; ++k) pipe.AllocEventID<HardEvent::MTE3_MTE2>();  // ids 1..7 (the queue holds 0)
        pipe.AllocEventID<HardEvent::MTE3_MTE2>();
      }
      break;
    }
    case kAddUnaligned:  // src0 one float (4 bytes) past a 32-byte boundary
      if (actor) Add(t, t[1], t[64], 8);
      break;
    case kMulsUnaligned:  // dst 16 bytes past a 32-byte boundary
      if (actor) Muls(t[4], t[64], 2.0f, 8);
      break;
    case kDupUnaligned:  // the mutant of the audit: Duplicate on a 4-byte-misaligned status-line view
      if (actor) {
        LocalTensor<int32_t> line = t.ReinterpretCast<int32_t>();
        Duplicate(line[1], 0, 15);
      }
      break;
    case kCastUnaligned:  // float -> half into a half view 6 bytes past a 32-byte boundary
      if (actor) {
        LocalTensor<half> h = t.ReinterpretCast<half>()[512 + 3];
        Cast(h, t, RoundMode::CAST_RINT, 16);
      }
      break;
    case kGmElemUnaligned:  // DataCopy<float> from a GM address 2 bytes into a float
      if (actor) {
        GlobalTensor<float> odd;
        odd.SetGlobalBuffer(reinterpret_cast<float*>(buf + 2), 64);
        DataCopy(t, odd, 8);
      }
      break;
    case kCastInt8:
      if (actor) {
        // int8_t -> half (CAST_NONE) is exact for all 256 values; half -> int8_t rounds by mode
        LocalTensor<int8_t> q = t.ReinterpretCast<int8_t>();            // UB [0, 256)
        LocalTensor<half> h = t.ReinterpretCast<half>()[256];           // UB [512, 1024)
        LocalTensor<int8_t> back = t.ReinterpretCast<int8_t>()[1024];  // UB [1024, 1280)
        for (int k = 0; k < 256; ++k) q.SetValue(k, static_cast<int8_t>(k - 128));
        Cast(h, q, RoundMode::CAST_NONE, 256);
        Cast(back, h, RoundMode::CAST_TRUNC, 256);
        for (int k = 0; k < 256; ++k)
          if (static_cast<float>(h.GetValue(k)) != float(k - 128) || back.GetValue(k) != k - 128)
            strata_cpu::Fail("int8 round trip: %d -> %g -> %d", k - 128, static_cast<float>(h.GetValue(k)),
                             back.GetValue(k));
        // 2.5 and -2.5 under each mode (asc-devkit Cast.md RoundMode: rint ties to even, round away from 0)
        const RoundMode modes[] = {RoundMode::CAST_NONE, RoundMode::CAST_RINT, RoundMode::CAST_FLOOR,
                                   RoundMode::CAST_CEIL, RoundMode::CAST_ROUND, RoundMode::CAST_TRUNC};
        const int want_pos[] = {2, 2, 2, 3, 3, 2}, want_neg[] = {-2, -2, -3, -2, -3, -2};
        for (int m = 0; m < 6; ++m) {
          h.SetValue(0, half(2.5f));
          h.SetValue(1, half(-2.5f));
          Cast(back, h, modes[m], 2);
          if (back.GetValue(0) != want_pos[m] || back.GetValue(1) != want_neg[m])
            strata_cpu::Fail("half->int8 mode %d: got %d %d", m, back.GetValue(0), back.GetValue(1));
        }
        strata_cpu::SetLine(77);
        h.SetValue(0, half(200.0f));
        Cast(back, h, RoundMode::CAST_RINT, 1);
      }
      break;
    case kSdmaFlagBeforeQuiet:
    case kSdmaQuietThenFlag:
    case kSdmaAnnouncedThenQuieted:
      if (actor) {
        float* data = reinterpret_cast<float*>(buf);         // [0, 256): the copy's destination on rank 1
        int32_t* flag = reinterpret_cast<int32_t*>(buf) + 256;  // heap offset 1024: its own line
        if (aclshmem_my_pe() == 0) {
          aclshmemx_sdma_put_nbi(data, data + 512, t.GetPhyAddr(), 64, 64, 1, EVENT_ID0);
          if (which == kSdmaQuietThenFlag) aclshmemx_sdma_quiet(t.GetPhyAddr(), 64, EVENT_ID0);
          aclshmemx_signal_op(flag, 1, ACLSHMEM_SIGNAL_SET, 1);
          if (which != kSdmaQuietThenFlag) aclshmemx_sdma_quiet(t.GetPhyAddr(), 64, EVENT_ID0);
          if (which == kSdmaAnnouncedThenQuieted) aclshmemx_signal_op(flag, 2, ACLSHMEM_SIGNAL_SET, 1);
        } else if (aclshmem_my_pe() == 1) {
          aclshmem_signal_wait_until(flag, ACLSHMEM_CMP_GE, which == kSdmaAnnouncedThenQuieted ? 2 : 1);
          strata_cpu::SetLine(88);
          GlobalTensor<float> d;
          d.SetGlobalBuffer(data, 64);
          DataCopy(t, d, 64);
        }
      }
      break;
    default:
      break;
  }
  // (the two wait-timeout cases end without SyncAll: cores with nothing to wait for would otherwise
  // time out in it as well, and which deadline fires first would depend on the machine's load)
  if (which == kSyncAllAivOnly || which == kSyncAllUndeclared || which == kNamedFlagTimeout ||
      which == kBarrierMissingRank)
    return;
  if (!aiv_only) SyncAll();
}

extern "C" int launch_fail(uint32_t blocks, uint8_t* buf, int32_t which) {
  return STRATA_CPU_LAUNCH(fail_kernel, blocks, buf, which);
}

// ---------------------------------------------------------------------------------------------
// sdma_progress: rank 0's core c SDMA-puts its `n` floats of `src` and then a flag word (a second
// post, behind the data in the same queue) to rank 1, and waits for rank 1's acknowledgement before
// its quiet; rank 1's core c waits for that flag, copies what arrived to `got` (MTE, through UB)
// and acknowledges. The copies must land while rank 0's core waits: nothing quiets them before the
// acknowledgement, as an SDMA engine would (on oversubscribed CPUs the model runs them in the
// waiting core's pauses; runtime/cpu/src/sdma.cpp SdmaHelp).
extern "C" __global__ __aicore__ void sdma_progress_kernel(GM_ADDR src, GM_ADDR dst, GM_ADDR got, GM_ADDR flags,
                                                           GM_ADDR one, uint32_t n) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const int64_t c = GetBlockIdx(), C = GetBlockNum();
  const int me = aclshmem_my_pe();
  TPipe pipe;
  TBuf<> data, scratch;
  pipe.InitBuffer(data, Align32(n * sizeof(float)));
  pipe.InitBuffer(scratch, 64);
  LocalTensor<float> s = scratch.Get<float>();
  int32_t* flag = reinterpret_cast<int32_t*>(flags) + c * 16;      // a line each
  int32_t* ack = reinterpret_cast<int32_t*>(flags) + (C + c) * 16;
  float* mine = reinterpret_cast<float*>(src) + c * n;
  float* there = reinterpret_cast<float*>(dst) + c * n;
  if (me == 0) {
    aclshmemx_sdma_put_nbi(there, mine, s.GetPhyAddr(), 64, n, 1, EVENT_ID0);
    aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(flag), reinterpret_cast<float*>(one), s.GetPhyAddr(), 64, 1, 1,
                           EVENT_ID0);
    aclshmem_signal_wait_until(ack, ACLSHMEM_CMP_GE, 1);
    aclshmemx_sdma_quiet(s.GetPhyAddr(), 64, EVENT_ID0);
  } else if (me == 1) {
    aclshmem_signal_wait_until(flag, ACLSHMEM_CMP_GE, 1);  // 1.0f's bits: > 0
    LocalTensor<float> t = data.Get<float>();
    GlobalTensor<float> a, b;
    a.SetGlobalBuffer(there, n);
    b.SetGlobalBuffer(reinterpret_cast<float*>(got) + c * n, n);
    DataCopy(t, a, n);
    SetFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
    WaitFlag<HardEvent::MTE2_MTE3>(EVENT_ID0);
    DataCopy(b, t, n);
    aclshmemx_signal_op(ack, 1, ACLSHMEM_SIGNAL_SET, 0);
  }
}

extern "C" int launch_sdma_progress(uint32_t blocks, uint8_t* src, uint8_t* dst, uint8_t* got, uint8_t* flags,
                                    uint8_t* one, uint32_t n) {
  return STRATA_CPU_LAUNCH(sdma_progress_kernel, blocks, src, dst, got, flags, one, n);
}

// ---------------------------------------------------------------------------------------------
// ub_paths: each core carves `carve` bytes of UB, copies them to its slice of `out` before writing
// any (what the launch found in UB), then writes the first `dirty` bytes by one path of `how`, so
// that the next launch on the same cores would see them if UB were not refilled with 0xff. Each
// path the model must see as a UB write (runtime/cpu/src/ub.cpp g_ub_dirty) for the next launch to refill it:
// 0 Duplicate, 1 DataCopy GM -> UB (of `zeros`), 2 Add (int32 -1 + -1), 3 SetValue (one element per
// 64), 4 a raw store through GetPhyAddr of a view at an offset, 5 Cast int32 -> float in place,
// 6 LocalTensor::operator(), 7 DataCopyPad GM -> UB (with padding), 8 DataCopy UB -> UB.
extern "C" __global__ __aicore__ void ub_paths_kernel(GM_ADDR out, GM_ADDR zeros, uint32_t carve, uint32_t dirty,
                                                      uint32_t how) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  TPipe pipe;
  TBuf<> b;
  pipe.InitBuffer(b, carve);
  LocalTensor<int32_t> t = b.Get<int32_t>();
  GlobalTensor<int32_t> g;
  g.SetGlobalBuffer(reinterpret_cast<int32_t*>(out) + uint64_t(GetBlockIdx()) * (carve / 4), carve / 4);
  DataCopy(g, t, carve / 4);
  SetFlag<HardEvent::MTE3_V>(EVENT_ID0);
  WaitFlag<HardEvent::MTE3_V>(EVENT_ID0);
  const uint32_t n = dirty / 4;
  if (n == 0) return;
  GlobalTensor<int32_t> z;
  z.SetGlobalBuffer(reinterpret_cast<int32_t*>(zeros), n);
  switch (how) {
    case 0: Duplicate(t, int32_t(0), int32_t(n)); break;
    case 1: DataCopy(t, z, n); break;
    case 2: Add(t, t, t, int32_t(n)); break;
    case 3: for (uint32_t i = 0; i < n; i += 64) t.SetValue(i, 0); break;
    case 4: {
      int32_t* p = t[n / 2].GetPhyAddr();
      for (uint32_t i = 0; i < n - n / 2; ++i) p[i] = 0;
      break;
    }
    case 5: {
      LocalTensor<float> f = t.ReinterpretCast<float>();
      Cast(f, t, RoundMode::CAST_NONE, n);
      break;
    }
    case 6: for (uint32_t i = 0; i < n; i += 64) t(i) = 0; break;
    case 7: {
      DataCopyExtParams cp{1, n * 4 - 4, 0, 0, 0};
      DataCopyPadExtParams<int32_t> pad{true, 0, 1, 0};
      DataCopyPad(t, z, cp, pad);
      break;
    }
    case 8: {
      Duplicate(t, int32_t(0), 8);  // one 32-byte block of zeros, then copied over the rest
      for (uint32_t i = 8; i + 8 <= n; i += 8) DataCopy(t[i], t, 8);
      break;
    }
    default: break;
  }
}

extern "C" int launch_ub_paths(uint32_t blocks, uint8_t* out, uint8_t* zeros, uint32_t carve, uint32_t dirty,
                               uint32_t how) {
  return STRATA_CPU_LAUNCH(ub_paths_kernel, blocks, out, zeros, carve, dirty, how);
}

// ---------------------------------------------------------------------------------------------
// big_put: core 0 of each rank SDMA-puts the n floats of `src` to the next rank's `dst` from float
// `skew` on (a destination off a 64-byte line: the unaligned head and tail of a streamed copy) and
// quiets. n * 4 bytes above or below the 8 MiB from which the model copies a post with non-temporal
// stores (runtime/cpu/src/sdma.cpp StreamBytes).
extern "C" __global__ __aicore__ void big_put_kernel(GM_ADDR src, GM_ADDR dst, uint32_t n, uint32_t skew) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const int me = aclshmem_my_pe(), W = aclshmem_n_pes();
  TPipe pipe;
  TBuf<> scratch;
  pipe.InitBuffer(scratch, 64);
  LocalTensor<float> s = scratch.Get<float>();
  float* from = reinterpret_cast<float*>(src);
  aclshmemx_sdma_put_nbi(reinterpret_cast<float*>(dst) + skew, from, s.GetPhyAddr(), 64, n, (me + 1) % W, EVENT_ID0);
  aclshmemx_sdma_quiet(s.GetPhyAddr(), 64, EVENT_ID0);
}

extern "C" int launch_big_put(uint8_t* src, uint8_t* dst, uint32_t n, uint32_t skew) {
  return STRATA_CPU_LAUNCH(big_put_kernel, 1, src, dst, n, skew);
}
