// CPU model of Ascend C's vector computation, basic arithmetic and data filling (included by
// kernel_operator.h): Add, Sub, Mul, Div, Max, Min, the scalar forms Adds, Muls, Maxs, Mins, and
// Duplicate, on LocalTensors. Rules of runtime/README.md's table: "A2/A3 arithmetic types"
// (STRATA_A2_ARITH_TYPES), "A2/A3 `Div` types" (Div), "A2/A3 `Duplicate` types" (Duplicate), and
// the operand alignment and UB bounds of every operand.
#ifndef STRATA_CPU_ASCENDC_VEC_ARITH_H
#define STRATA_CPU_ASCENDC_VEC_ARITH_H

#include "ascendc_data_copy.h"

namespace AscendC {

// ---- Vector arithmetic ----
namespace detail {
template <class T> struct IsF16 : std::is_same<T, half> {};
template <class T> struct IsBf16 : std::is_same<T, bfloat16_t> {};

// One rounding per operation: 16-bit floats compute in float and convert back; integers wrap.
template <class T, class F> inline T Arith(T a, T b, F f) {
  if constexpr (IsF16<T>::value || IsBf16<T>::value) {
    return T(f(static_cast<float>(a), static_cast<float>(b)));
  } else if constexpr (std::is_integral<T>::value) {
    using W = typename std::conditional<(sizeof(T) <= 4), uint32_t, uint64_t>::type;
    return static_cast<T>(f(static_cast<W>(a), static_cast<W>(b)));
  } else {
    return f(a, b);
  }
}
template <class T> inline T VAdd(T a, T b) { return Arith(a, b, [](auto x, auto y) { return x + y; }); }
template <class T> inline T VSub(T a, T b) { return Arith(a, b, [](auto x, auto y) { return x - y; }); }
template <class T> inline T VMul(T a, T b) { return Arith(a, b, [](auto x, auto y) { return x * y; }); }
template <class T> inline T VDiv(T a, T b) {
  if constexpr (std::is_integral<T>::value) {
    return b == 0 ? T(0) : static_cast<T>(a / b);
  } else {
    return Arith(a, b, [](auto x, auto y) { return x / y; });
  }
}
template <class T> inline T VMax(T a, T b) {
  if constexpr (IsF16<T>::value || IsBf16<T>::value) return static_cast<float>(a) >= static_cast<float>(b) ? a : b;
  else return a >= b ? a : b;
}
template <class T> inline T VMin(T a, T b) {
  if constexpr (IsF16<T>::value || IsBf16<T>::value) return static_cast<float>(a) <= static_cast<float>(b) ? a : b;
  else return a <= b ? a : b;
}
// The element loops of the vector ops run in blocks of VecBlock<T>::n elements (128 bytes), each
// block a loop of known trip count without loop-carried dependences (ivdep) that g++ -O2
// vectorises (it leaves element loops of unknown count and possibly aliasing operands scalar).
// Only a speed matter: every check stays per call (count, UB bounds of each operand) and the
// results are those of the element loop, which the ops still use for the tail and for operands
// that overlap only partially (dst == src, the in-place case, or disjoint ranges take the blocks:
// element k of dst depends on element k of the sources only).
template <class T> struct VecBlock {
  static constexpr int32_t n = static_cast<int32_t>(128 / sizeof(T)) > 0 ? static_cast<int32_t>(128 / sizeof(T)) : 1;
};
template <class T> inline bool BlockSafe(const T* d, const T* a, int32_t count) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(d), y = reinterpret_cast<uintptr_t>(a);
  const uintptr_t bytes = static_cast<uintptr_t>(count) * sizeof(T);
  return x == y || x + bytes <= y || y + bytes <= x;
}
inline void CheckCount(int64_t count, const char* op) {
  if (count < 0) ::strata_cpu::Fail("%s: negative count %lld", op, (long long)count);
}
template <class T, class F>
inline void Binary(const LocalTensor<T>& dst, const LocalTensor<T>& s0, const LocalTensor<T>& s1, int32_t count,
                   const char* op, F f) {
  CheckCount(count, op);
  if (count == 0) return;
  dst.StrataCheck(0, count, op, "dst");
  s0.StrataCheck(0, count, op, "src0");
  s1.StrataCheck(0, count, op, "src1");
  CheckVecAligned(dst.StrataPtr(), op, "dst");
  CheckVecAligned(s0.StrataPtr(), op, "src0");
  CheckVecAligned(s1.StrataPtr(), op, "src1");
  dst.StrataWrote(0, count);
  T* d = dst.StrataPtr();
  const T* a = s0.StrataPtr();
  const T* b = s1.StrataPtr();
  int32_t i = 0;
  if (BlockSafe(d, a, count) && BlockSafe(d, b, count)) {
    for (; i + VecBlock<T>::n <= count; i += VecBlock<T>::n) {
      T* dd = d + i;
      const T* aa = a + i;
      const T* bb = b + i;
#pragma GCC ivdep
      for (int32_t k = 0; k < VecBlock<T>::n; ++k) dd[k] = f(aa[k], bb[k]);
    }
  }
  for (; i < count; ++i) d[i] = f(a[i], b[i]);
}
template <class T, class F>
inline void Scalar(const LocalTensor<T>& dst, const LocalTensor<T>& src, T s, int32_t count, const char* op, F f) {
  CheckCount(count, op);
  if (count == 0) return;
  dst.StrataCheck(0, count, op, "dst");
  src.StrataCheck(0, count, op, "src");
  CheckVecAligned(dst.StrataPtr(), op, "dst");
  CheckVecAligned(src.StrataPtr(), op, "src");
  dst.StrataWrote(0, count);
  T* d = dst.StrataPtr();
  const T* a = src.StrataPtr();
  int32_t i = 0;
  if (BlockSafe(d, a, count)) {
    for (; i + VecBlock<T>::n <= count; i += VecBlock<T>::n) {
      T* dd = d + i;
      const T* aa = a + i;
#pragma GCC ivdep
      for (int32_t k = 0; k < VecBlock<T>::n; ++k) dd[k] = f(aa[k], s);
    }
  }
  for (; i < count; ++i) d[i] = f(a[i], s);
}
}  // namespace detail

// The A2/A3 (910B/910C) dtype tables of the vector APIs, from the public docs
// (asc-devkit docs/zh/api/SIMD-API/基础API/Memory矢量计算/基础算术/<Op>.md and 数据填充/Duplicate.md,
// "数据类型", the Atlas A2/A3 rows). bisheng rejects other types (the dav_c220 impl static_asserts);
// so does the model, at compile time. bfloat16_t gets its own message: it is the likely mistake.
namespace detail {
template <class T, class... U> struct OneOf : std::disjunction<std::is_same<T, U>...> {};
template <class T> struct A2Arith : OneOf<T, int16_t, half, int32_t, float> {};      // Add Sub Mul Max Min, *s
template <class T> struct A2Div : OneOf<T, half, float> {};                           // Div
template <class T> struct A2Dup : OneOf<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float> {};
}  // namespace detail

#define STRATA_A2_ARITH_TYPES(OP, T)                                                                        \
  static_assert(!std::is_same<T, bfloat16_t>::value,                                                        \
                "AscendC::" OP " on A2/A3 has no bfloat16_t form: it takes int16_t, half, int32_t, float only " \
                "(asc-devkit docs " OP ".md); Cast to float (CAST_NONE), compute, Cast back (CAST_RINT)");   \
  static_assert(detail::A2Arith<T>::value || std::is_same<T, bfloat16_t>::value,                            \
                "AscendC::" OP " on A2/A3 takes int16_t, half, int32_t, float only (asc-devkit docs " OP ".md)")

template <class T>
inline void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Add", T);
  detail::Binary(dst, src0, src1, count, "Add", [](T x, T y) { return detail::VAdd<T>(x, y); });
}
template <class T>
inline void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Sub", T);
  detail::Binary(dst, src0, src1, count, "Sub", [](T x, T y) { return detail::VSub<T>(x, y); });
}
template <class T>
inline void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Mul", T);
  detail::Binary(dst, src0, src1, count, "Mul", [](T x, T y) { return detail::VMul<T>(x, y); });
}
template <class T>
inline void Div(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  static_assert(detail::A2Div<T>::value,
                "AscendC::Div on A2/A3 takes half, float only (asc-devkit docs Div.md)");
  detail::Binary(dst, src0, src1, count, "Div", [](T x, T y) { return detail::VDiv<T>(x, y); });
}
template <class T>
inline void Max(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Max", T);
  detail::Binary(dst, src0, src1, count, "Max", [](T x, T y) { return detail::VMax<T>(x, y); });
}
template <class T>
inline void Min(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Min", T);
  detail::Binary(dst, src0, src1, count, "Min", [](T x, T y) { return detail::VMin<T>(x, y); });
}
template <class T>
inline void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Adds", T);
  detail::Scalar(dst, src, scalarValue, count, "Adds", [](T x, T y) { return detail::VAdd<T>(x, y); });
}
template <class T>
inline void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Muls", T);
  detail::Scalar(dst, src, scalarValue, count, "Muls", [](T x, T y) { return detail::VMul<T>(x, y); });
}
template <class T>
inline void Maxs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Maxs", T);
  detail::Scalar(dst, src, scalarValue, count, "Maxs", [](T x, T y) { return detail::VMax<T>(x, y); });
}
template <class T>
inline void Mins(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count) {
  STRATA_A2_ARITH_TYPES("Mins", T);
  detail::Scalar(dst, src, scalarValue, count, "Mins", [](T x, T y) { return detail::VMin<T>(x, y); });
}
#undef STRATA_A2_ARITH_TYPES
template <class T> inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
  static_assert(detail::A2Dup<T>::value,
                "AscendC::Duplicate on A2/A3 takes int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float only "
                "(asc-devkit docs Duplicate.md)");
  detail::CheckCount(count, "Duplicate");
  if (count == 0) return;
  dst.StrataCheck(0, count, "Duplicate", "dst");
  detail::CheckVecAligned(dst.StrataPtr(), "Duplicate", "dst");
  dst.StrataWrote(0, count);
  T* d = dst.StrataPtr();
  for (int32_t i = 0; i < count; ++i) d[i] = scalarValue;
}

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_VEC_ARITH_H
