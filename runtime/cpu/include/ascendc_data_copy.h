// CPU model of Ascend C's data movement (included by kernel_operator.h): DataCopy (GM<->UB and
// UB->UB, count and block forms) and DataCopyPad, and the atomic settings of UB->GM copies
// (SetAtomicAdd/Max/Min, SetAtomicNone, DisableDmaAtomic). Also the 32-byte alignment check of
// vector operands (CheckVecAligned), which the vector and Cast headers use. Rules of
// runtime/README.md's table: "`DataCopy` length" (CheckCopyLen), "UB side of a DMA"
// (CheckUbAligned), "vector and `Cast` operands" (CheckVecAligned), "`DataCopy` GM<->UB: the GM
// address aligned" (CheckGmElemAligned), "`blockCount > 1`" (CheckSingleBlock); the copies and
// atomics themselves are checked by the model (runtime/cpu/src/dma.cpp).
#ifndef STRATA_CPU_ASCENDC_DATA_COPY_H
#define STRATA_CPU_ASCENDC_DATA_COPY_H

#include "ascendc_tpipe.h"

namespace AscendC {

// ---- DataCopy / DataCopyPad ----
struct DataCopyParams {
  uint16_t blockCount = 1;
  uint16_t blockLen = 0;  // in 32-byte blocks
  uint16_t srcStride = 0;
  uint16_t dstStride = 0;
  DataCopyParams() = default;
  DataCopyParams(uint16_t count, uint16_t len, uint16_t srcGap, uint16_t dstGap)
      : blockCount(count), blockLen(len), srcStride(srcGap), dstStride(dstGap) {}
};

struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;  // bytes
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcGap, uint32_t dstGap, uint32_t reserved)
      : blockCount(count), blockLen(len), srcStride(srcGap), dstStride(dstGap), rsv(reserved) {}
};

template <class T> struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;   // elements
  uint8_t rightPadding = 0;  // elements
  T paddingValue = T(0);
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(bool pad, uint8_t left, uint8_t right, T value)
      : isPad(pad), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace detail {
inline void CheckUbAligned(const void* p, const char* op) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::strata_cpu::Fail("%s: UB address (UB offset %lld) is not 32-byte aligned", op,
                       (long long)::strata_cpu::UbOffset(p));
}
// The start of every vector-op and Cast operand in UB is 32-byte aligned (asc-devkit docs
// SIMD-API/通用说明和约束.md, 表2: "Unified Buffer | 32Byte对齐"); the NPU does not check it.
inline void CheckVecAligned(const void* p, const char* op, const char* role) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::strata_cpu::Fail("%s: %s operand at UB offset %lld is not 32-byte aligned: vector and Cast operands must "
                       "start on a 32-byte boundary of UB (asc-devkit docs 通用说明和约束.md)",
                       op, role, (long long)::strata_cpu::UbOffset(p));
}
// The GM side of a DataCopy is aligned to the element size (asc-devkit docs DataCopy（GM与UB连续数据搬运）.md:
// "位于Global Memory的地址必须按照对应数据类型所占字节数对齐").
template <class T> inline void CheckGmElemAligned(const void* p, const char* op) {
  if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0)
    ::strata_cpu::Fail("%s: GM address %p is not aligned to its %u-byte element (asc-devkit docs DataCopy "
                       "GM<->UB: the GM address must be aligned to sizeof(T))",
                       op, p, (unsigned)sizeof(T));
}
inline void CheckCopyLen(uint64_t bytes, const char* op) {
  if (bytes % 32 != 0)
    ::strata_cpu::Fail("%s of %llu bytes is not a multiple of 32 bytes (use DataCopyPad)", op,
                       (unsigned long long)bytes);
}
inline void CheckSingleBlock(uint32_t blockCount, const char* op) {
  if (blockCount != 1)
    ::strata_cpu::Fail("%s with blockCount %u: only blockCount == 1 is modeled (strided copies are not modeled)",
                       op, blockCount);
}
}  // namespace detail

// GM -> UB (MTE2)
template <class T> inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  uint64_t bytes = uint64_t(count) * sizeof(T);
  detail::CheckCopyLen(bytes, "DataCopy");
  if (count == 0) return;
  dst.StrataCheck(0, count, "DataCopy", "dst");
  detail::CheckUbAligned(dst.StrataPtr(), "DataCopy");
  src.StrataCheck(0, count, "DataCopy");
  detail::CheckGmElemAligned<T>(src.GetPhyAddr(), "DataCopy");
  ::strata_cpu::CopyGmToUb(dst.StrataPtr(), src.GetPhyAddr(), bytes, "DataCopy");
}
// UB -> GM (MTE3); honours SetAtomicAdd/Max/Min.
template <class T> inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  uint64_t bytes = uint64_t(count) * sizeof(T);
  detail::CheckCopyLen(bytes, "DataCopy");
  if (count == 0) return;
  src.StrataCheck(0, count, "DataCopy", "src");
  detail::CheckUbAligned(src.StrataPtr(), "DataCopy");
  dst.StrataCheck(0, count, "DataCopy");
  detail::CheckGmElemAligned<T>(dst.GetPhyAddr(), "DataCopy");
  ::strata_cpu::CopyUbToGm(dst.GetPhyAddr(), src.StrataPtr(), bytes, detail::DTypeOf<T>(), "DataCopy");
}
// UB -> UB
template <class T> inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  uint64_t bytes = uint64_t(count) * sizeof(T);
  detail::CheckCopyLen(bytes, "DataCopy");
  if (count == 0) return;
  dst.StrataCheck(0, count, "DataCopy", "dst");
  src.StrataCheck(0, count, "DataCopy", "src");
  detail::CheckUbAligned(dst.StrataPtr(), "DataCopy");
  detail::CheckUbAligned(src.StrataPtr(), "DataCopy");
  dst.StrataWrote(0, count);
  std::memmove(dst.StrataPtr(), src.StrataPtr(), bytes);
}
// Block forms (blockLen in 32-byte blocks); blockCount == 1 only.
template <class T> inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p) {
  detail::CheckSingleBlock(p.blockCount, "DataCopy");
  DataCopy(dst, src, static_cast<uint32_t>(uint32_t(p.blockLen) * 32 / sizeof(T)));
}
template <class T> inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  detail::CheckSingleBlock(p.blockCount, "DataCopy");
  DataCopy(dst, src, static_cast<uint32_t>(uint32_t(p.blockLen) * 32 / sizeof(T)));
}

// GM -> UB, any byte length; the UB side occupies leftPadding + data + rightPadding rounded up to
// 32 bytes. With isPad the padding (left, and right up to the 32-byte boundary) is paddingValue.
template <class T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                        const DataCopyPadExtParams<T>& pad) {
  detail::CheckSingleBlock(p.blockCount, "DataCopyPad");
  if (p.blockLen == 0) return;
  if (p.blockLen % sizeof(T) != 0)
    ::strata_cpu::Fail("DataCopyPad: blockLen %u bytes is not a whole number of %u-byte elements", p.blockLen,
                       (unsigned)sizeof(T));
  if (uint32_t(pad.leftPadding) * sizeof(T) > 32 || uint32_t(pad.rightPadding) * sizeof(T) > 32)
    ::strata_cpu::Fail("DataCopyPad: left/right padding of %u/%u elements exceeds 32 bytes", pad.leftPadding,
                       pad.rightPadding);
  uint64_t n = p.blockLen / sizeof(T);
  uint64_t left = pad.leftPadding;
  uint64_t ub_bytes = (left * sizeof(T) + p.blockLen + uint64_t(pad.rightPadding) * sizeof(T) + 31) & ~uint64_t(31);
  dst.StrataCheck(0, ub_bytes / sizeof(T), "DataCopyPad", "dst");
  detail::CheckUbAligned(dst.StrataPtr(), "DataCopyPad");
  src.StrataCheck(0, n, "DataCopyPad");
  T* d = dst.StrataPtr();
  dst.StrataWrote(0, ub_bytes / sizeof(T));
  ::strata_cpu::CopyGmToUb(d + left, src.GetPhyAddr(), p.blockLen, "DataCopyPad");
  if (pad.isPad) {
    for (uint64_t i = 0; i < left; ++i) d[i] = pad.paddingValue;
    for (uint64_t i = left + n; i < ub_bytes / sizeof(T); ++i) d[i] = pad.paddingValue;
  }
}
// UB -> GM, any byte length; honours the atomic mode.
template <class T>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  detail::CheckSingleBlock(p.blockCount, "DataCopyPad");
  if (p.blockLen == 0) return;
  if (p.blockLen % sizeof(T) != 0)
    ::strata_cpu::Fail("DataCopyPad: blockLen %u bytes is not a whole number of %u-byte elements", p.blockLen,
                       (unsigned)sizeof(T));
  uint64_t n = p.blockLen / sizeof(T);
  src.StrataCheck(0, n, "DataCopyPad", "src");
  detail::CheckUbAligned(src.StrataPtr(), "DataCopyPad");
  dst.StrataCheck(0, n, "DataCopyPad");
  ::strata_cpu::CopyUbToGm(dst.GetPhyAddr(), src.StrataPtr(), p.blockLen, detail::DTypeOf<T>(), "DataCopyPad");
}

// ---- GM atomics for UB -> GM copies ----
template <class T> inline void SetAtomicAdd() {
  ::strata_cpu::SetAtomicMode(::strata_cpu::kAtomicAdd, detail::DTypeOf<T>(), "SetAtomicAdd");
}
template <class T> inline void SetAtomicMax() {
  ::strata_cpu::SetAtomicMode(::strata_cpu::kAtomicMax, detail::DTypeOf<T>(), "SetAtomicMax");
}
template <class T> inline void SetAtomicMin() {
  ::strata_cpu::SetAtomicMode(::strata_cpu::kAtomicMin, detail::DTypeOf<T>(), "SetAtomicMin");
}
inline void SetAtomicNone() { ::strata_cpu::SetAtomicMode(::strata_cpu::kAtomicNone, 0, "SetAtomicNone"); }
inline void DisableDmaAtomic() { ::strata_cpu::SetAtomicMode(::strata_cpu::kAtomicNone, 0, "DisableDmaAtomic"); }

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_DATA_COPY_H
