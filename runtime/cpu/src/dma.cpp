// DMA between GM and UB (the MTE2/MTE3 copies behind DataCopy and DataCopyPad) and the DMA atomics
// (SetAtomicAdd/Max/Min: UB->GM copies that combine with what GM holds, atomically against every
// other writer of the pool). In: the copies kernel_operator.h issues; out: the bytes moved, the
// counters. Rules of runtime/README.md's table: "UB->GM under `SetAtomic*<T>` moves `T`" and "DMA
// atomics only for f32/f16/bf16/i32/i16/i8" (AtomicCopy); reads of another rank's SDMA copy go
// through the SDMA ledger (LedgerRead, ledger.cpp).
#include "model_internal.h"

namespace strata_cpu {

STRATA_EXPORT void CopyGmToUb(void* ub, const void* gm, uint64_t bytes, const char* op) {
  CoreState* c = Cur(op);
  CostScope scope(c, STRATA_COST_MTE_IN);
  AbortCheck(c, op);
  CheckGmImpl(gm, bytes, op);
  LedgerRead(gm, bytes, op);
  UbWrote(ub, bytes);
  std::memcpy(ub, gm, bytes);
  if (c->sync_traffic) return;
  Count(c->idx, STRATA_CTR_MTE_IN, bytes);
  if (OwnerOf(gm) != CurPool().rank) Count(c->idx, STRATA_CTR_REMOTE_READ, bytes);
}

STRATA_EXPORT void SyncTraffic(bool on) {
  if (CoreState* c = t_core) c->sync_traffic = on;
}

namespace {
template <class T> T FromU(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
float F16ToF(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
uint16_t FToF16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float Bf16ToF(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Applies dst = dst op src elementwise with CAS loops (atomic against other writers doing the
// same, in any process of the pool). W is the storage word, `combine` works on decoded values.
template <class W, class Combine>
void AtomicApply(uint8_t* dst, const uint8_t* src, uint64_t n, Combine combine) {
  W* d = reinterpret_cast<W*>(dst);
  for (uint64_t i = 0; i < n; ++i) {
    W s;
    std::memcpy(&s, src + i * sizeof(W), sizeof(W));
    W old = __atomic_load_n(d + i, __ATOMIC_RELAXED);
    for (;;) {
      W nv = combine(old, s);
      if (__atomic_compare_exchange_n(d + i, &old, nv, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) break;
    }
  }
}

template <class T> T Op(int op, T a, T b) {
  switch (op) {
    case kAtomicAdd: return a + b;
    case kAtomicMax: return a >= b ? a : b;
    default: return a <= b ? a : b;
  }
}
template <class T> T IntOp(int op, T a, T b) {  // integers wrap
  using U = typename std::make_unsigned<T>::type;
  if (op == kAtomicAdd) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  return Op(op, a, b);
}

void AtomicCopy(CoreState* c, uint8_t* dst, const uint8_t* src, uint64_t bytes, int dtype, const char* op) {
  int mode = c->atomic_op;
  int adt = c->atomic_dtype;
  static const int sizes[] = {0, 4, 2, 2, 4, 2, 1, 4, 2, 1, 8, 8, 8};
  if (dtype != adt)
    FailStr(Sprintf("%s: UB->GM copy of %s elements while the atomic mode is set for %s", op, DTypeName(dtype),
                    DTypeName(adt)));
  int sz = sizes[adt];
  if (bytes % sz != 0)
    FailStr(Sprintf("%s: atomic copy of %llu bytes is not a whole number of %s", op, (unsigned long long)bytes,
                    DTypeName(adt)));
  if (reinterpret_cast<uintptr_t>(dst) % sz != 0)
    FailStr(Sprintf("%s: atomic copy to GM address %p not aligned to %d bytes", op, (void*)dst, sz));
  uint64_t n = bytes / sz;
  switch (adt) {
    case kDtF32:
      AtomicApply<uint32_t>(dst, src, n, [mode](uint32_t a, uint32_t b) {
        float r = Op(mode, FromU<float>(a), FromU<float>(b));
        uint32_t u;
        std::memcpy(&u, &r, 4);
        return u;
      });
      break;
    case kDtF16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return FToF16(Op(mode, F16ToF(a), F16ToF(b)));
      });
      break;
    case kDtBF16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return FToBf16(Op(mode, Bf16ToF(a), Bf16ToF(b)));
      });
      break;
    case kDtI32:
      AtomicApply<uint32_t>(dst, src, n, [mode](uint32_t a, uint32_t b) {
        return static_cast<uint32_t>(IntOp(mode, static_cast<int32_t>(a), static_cast<int32_t>(b)));
      });
      break;
    case kDtI16:
      AtomicApply<uint16_t>(dst, src, n, [mode](uint16_t a, uint16_t b) {
        return static_cast<uint16_t>(IntOp(mode, static_cast<int16_t>(a), static_cast<int16_t>(b)));
      });
      break;
    case kDtI8:
      AtomicApply<uint8_t>(dst, src, n, [mode](uint8_t a, uint8_t b) {
        return static_cast<uint8_t>(IntOp(mode, static_cast<int8_t>(a), static_cast<int8_t>(b)));
      });
      break;
    default:
      FailStr(Sprintf("%s: DMA atomics are not modeled for %s", op, DTypeName(adt)));
  }
}
}  // namespace

STRATA_EXPORT void CopyUbToGm(void* gm, const void* ub, uint64_t bytes, int dtype, const char* op) {
  CoreState* c = Cur(op);
  CostScope scope(c, STRATA_COST_MTE_OUT);
  AbortCheck(c, op);
  CheckGmImpl(gm, bytes, op);
  if (c->atomic_op != kAtomicNone)
    AtomicCopy(c, static_cast<uint8_t*>(gm), static_cast<const uint8_t*>(ub), bytes, dtype, op);
  else
    std::memcpy(gm, ub, bytes);
  if (!c->sync_traffic) {
    Count(c->idx, STRATA_CTR_MTE_OUT, bytes);
    if (OwnerOf(gm) != CurPool().rank) Count(c->idx, STRATA_CTR_REMOTE_WRITE, bytes);
  }
  // a flag may have been written this way (a signal goes through SignalOp, which notifies); bulk
  // data copies do not notify: a wait on a flag that one covers sees it within Idler's sleep cap
  if (bytes <= kNotifyCopyBytes) Notify();
}

STRATA_EXPORT void SetAtomicMode(int op, int dtype, const char* api) {
  CoreState* c = Cur(api);
  if (op != kAtomicNone) {
    switch (dtype) {
      case kDtF32: case kDtF16: case kDtBF16: case kDtI32: case kDtI16: case kDtI8: break;
      default:
        FailStr(Sprintf("%s<%s>: DMA atomics support float, half, bfloat16_t, int32_t, int16_t and int8_t", api,
                        DTypeName(dtype)));
    }
  }
  c->atomic_op = op;
  c->atomic_dtype = op == kAtomicNone ? 0 : dtype;
}

}  // namespace strata_cpu
