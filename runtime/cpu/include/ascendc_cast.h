// CPU model of Ascend C's vector type conversion (included by kernel_operator.h): Cast between
// float, half, bfloat16_t, int32_t and int8_t with a RoundMode. Rules of runtime/README.md's
// table: "`Cast` pairs" (Cast, CastModes), "`Cast` modes per pair" (CastModeConstantCheck,
// CastRun), the int8 saturation row (CastOne), "widening overlap" (CastRun).
#ifndef STRATA_CPU_ASCENDC_CAST_H
#define STRATA_CPU_ASCENDC_CAST_H

#include "ascendc_vec_arith.h"

namespace AscendC {

// ---- Cast ----
namespace detail {
// Rounds an exactly known value (every source type converts to double exactly) to the 16/32-bit
// float format F with the given mode. F supplies: Approx (a neighbour of x: one of the two
// representable values bracketing it), ToD, Up/Down (next value towards +/-inf), Odd (last
// significand bit), OverflowAt (|x| from which round-to-nearest gives infinity).
struct FmtF32 {
  using T = float;
  static T Approx(double x) { return static_cast<float>(x); }
  static double ToD(T v) { return v; }
  static T Up(T v) { return std::nextafter(v, std::numeric_limits<float>::infinity()); }
  static T Down(T v) { return std::nextafter(v, -std::numeric_limits<float>::infinity()); }
  static bool Odd(T v) { return (::strata_cpu::num::F32Bits(v) & 1u) != 0; }
  static double OverflowAt() { return std::ldexp(1.0, 128) - std::ldexp(1.0, 103); }  // FLT_MAX + ulp/2
  static T Inf(bool neg) { return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity(); }
  static T NaN() { return std::numeric_limits<float>::quiet_NaN(); }
};
inline uint16_t NextUpBits16(uint16_t b, uint16_t inf_bits) {
  if ((b & 0x7fffu) > inf_bits) return b;  // NaN
  if (b == inf_bits) return b;
  if (b == 0x8000u) return 1;               // -0 -> smallest positive
  return (b & 0x8000u) ? static_cast<uint16_t>(b - 1) : static_cast<uint16_t>(b + 1);
}
inline uint16_t NextDownBits16(uint16_t b, uint16_t inf_bits) {
  return static_cast<uint16_t>(NextUpBits16(static_cast<uint16_t>(b ^ 0x8000u), inf_bits) ^ 0x8000u);
}
struct FmtF16 {
  using T = half;
  static uint16_t Bits(T v) { uint16_t b; std::memcpy(&b, &v, 2); return b; }
  static T FromBits(uint16_t b) { T v; std::memcpy(&v, &b, 2); return v; }
  static T Approx(double x) { return static_cast<half>(x); }
  static double ToD(T v) { return static_cast<double>(static_cast<float>(v)); }
  static T Up(T v) { return FromBits(NextUpBits16(Bits(v), 0x7c00u)); }
  static T Down(T v) { return FromBits(NextDownBits16(Bits(v), 0x7c00u)); }
  static bool Odd(T v) { return (Bits(v) & 1u) != 0; }
  static double OverflowAt() { return 65520.0; }  // 65504 + ulp/2
  static T Inf(bool neg) { return FromBits(neg ? 0xfc00u : 0x7c00u); }
  static T NaN() { return FromBits(0x7e00u); }
};
struct FmtBf16 {
  using T = bfloat16_t;
  static T Approx(double x) { return bfloat16_t(static_cast<float>(x)); }
  static double ToD(T v) { return static_cast<double>(static_cast<float>(v)); }
  static T Up(T v) { return bfloat16_t::FromBits(NextUpBits16(v.bits, 0x7f80u)); }
  static T Down(T v) { return bfloat16_t::FromBits(NextDownBits16(v.bits, 0x7f80u)); }
  static bool Odd(T v) { return (v.bits & 1u) != 0; }
  static double OverflowAt() { return std::ldexp(1.0, 128) - std::ldexp(1.0, 119); }  // max (0x7f7f) + ulp/2
  static T Inf(bool neg) { return bfloat16_t::FromBits(neg ? 0xff80u : 0x7f80u); }
  static T NaN() { return bfloat16_t::FromBits(0x7fc0u); }
};

template <class F> inline typename F::T RoundToFloat(double x, RoundMode mode) {
  using T = typename F::T;
  if (std::isnan(x)) return F::NaN();
  T a = F::Approx(x);
  double ad = F::ToD(a);
  if (ad == x) return a;
  T lo, hi;
  if (ad < x) { lo = a; hi = F::Up(a); } else { hi = a; lo = F::Down(a); }
  double dl = x - F::ToD(lo), dh = F::ToD(hi) - x;
  bool overflow = std::fabs(x) >= F::OverflowAt();
  switch (mode) {
    case RoundMode::CAST_FLOOR: return lo;
    case RoundMode::CAST_CEIL: return hi;
    case RoundMode::CAST_TRUNC: return x > 0 ? lo : hi;
    case RoundMode::CAST_ODD: return F::Odd(lo) ? lo : hi;
    case RoundMode::CAST_ROUND:
      if (overflow) return F::Inf(x < 0);
      if (dl != dh) return dl < dh ? lo : hi;
      return x > 0 ? hi : lo;  // ties away from zero
    default:  // CAST_NONE (lossy conversions round like CAST_RINT) and CAST_RINT
      if (overflow) return F::Inf(x < 0);
      if (dl != dh) return dl < dh ? lo : hi;
      return F::Odd(lo) ? hi : lo;  // ties to even
  }
}
inline double RoundToIntegral(double x, RoundMode mode) {
  switch (mode) {
    case RoundMode::CAST_FLOOR: return std::floor(x);
    case RoundMode::CAST_CEIL: return std::ceil(x);
    case RoundMode::CAST_TRUNC: return std::trunc(x);
    case RoundMode::CAST_ROUND: return std::round(x);
    default: return std::nearbyint(x);  // default FP environment: ties to even
  }
}
template <class S> inline double ToDouble(S v) {
  if constexpr (IsF16<S>::value || IsBf16<S>::value) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}
template <class D, class S> inline D CastOne(S v, RoundMode mode) {
  double x = ToDouble(v);
  if constexpr (std::is_same<D, S>::value) {
    if constexpr (std::is_integral<D>::value) return v;
    // Same float type: CAST_NONE copies, the other modes round to an integral value.
    if (mode == RoundMode::CAST_NONE || mode == RoundMode::CAST_ODD || std::isnan(x) || std::isinf(x)) return v;
    return static_cast<D>(static_cast<float>(RoundToIntegral(x, mode)));
  } else if constexpr (std::is_same<D, float>::value) {
    return RoundToFloat<FmtF32>(x, mode);
  } else if constexpr (IsF16<D>::value) {
    return RoundToFloat<FmtF16>(x, mode);
  } else if constexpr (IsBf16<D>::value) {
    return RoundToFloat<FmtBf16>(x, mode);
  } else if constexpr (std::is_same<D, int8_t>::value) {
    // half -> int8_t: rounded by the mode. What an out-of-range or NaN half gives is not documented
    // for A2/A3 (Cast.md), so the model refuses it rather than guess (stratac's kernels never cast
    // to int8: the host quantises)
    double r = RoundToIntegral(x, mode);
    if (std::isnan(x) || r > 127.0 || r < -128.0)
      ::strata_cpu::Fail("Cast half->int8_t of %g: the value rounds outside [-128, 127]; what A2/A3 give for it is "
                         "not documented (asc-devkit docs Cast.md), so the model refuses it", x);
    return static_cast<int8_t>(r);
  } else {
    static_assert(std::is_same<D, int32_t>::value, "Cast: destination must be float, half, bfloat16_t, int32_t or int8_t");
    if (std::isnan(x)) return 0;
    double r = RoundToIntegral(x, mode);
    if (r >= 2147483647.0) return std::numeric_limits<int32_t>::max();   // saturate
    if (r <= -2147483648.0) return std::numeric_limits<int32_t>::min();
    return static_cast<int32_t>(r);
  }
}
}  // namespace detail

// The A2/A3 (910B/910C) table of Cast (asc-devkit docs/zh/api/SIMD-API/基础API/Memory矢量计算/类型转换/
// Cast.md, "数据类型", the Atlas A2 and A3 tables), restricted to the types the model implements:
// which RoundModes each (src, dst) pair takes; 0 = the pair is not in the table.
namespace detail {
enum : unsigned {
  kModeNone = 1u << 0, kModeRint = 1u << 1, kModeFloor = 1u << 2, kModeCeil = 1u << 3, kModeRound = 1u << 4,
  kModeTrunc = 1u << 5, kModeOdd = 1u << 6,
  kModesDirected = kModeRint | kModeFloor | kModeCeil | kModeRound | kModeTrunc,
};
template <class D, class S> constexpr unsigned CastModes() {
  using std::is_same;
  if (is_same<S, half>::value && is_same<D, float>::value) return kModeNone;
  if (is_same<S, half>::value && is_same<D, int32_t>::value) return kModesDirected;
  if (is_same<S, bfloat16_t>::value && is_same<D, float>::value) return kModeNone;
  if (is_same<S, bfloat16_t>::value && is_same<D, int32_t>::value) return kModesDirected;
  if (is_same<S, int32_t>::value && is_same<D, float>::value) return kModeNone | kModesDirected;
  if (is_same<S, float>::value && is_same<D, half>::value) return kModeNone | kModesDirected | kModeOdd;
  if (is_same<S, float>::value && is_same<D, bfloat16_t>::value) return kModesDirected;
  if (is_same<S, float>::value && is_same<D, int32_t>::value) return kModesDirected;
  if (is_same<S, float>::value && is_same<D, float>::value) return kModesDirected;
  if (is_same<S, int8_t>::value && is_same<D, half>::value) return kModeNone;
  if (is_same<S, half>::value && is_same<D, int8_t>::value) return kModeNone | kModesDirected;
  return 0;
}
constexpr unsigned ModeBit(RoundMode m) {
  return static_cast<int>(m) >= 0 && static_cast<int>(m) <= 6 ? 1u << static_cast<int>(m) : 0u;
}
inline const char* ModeName(RoundMode m) {
  static const char* const names[] = {"CAST_NONE", "CAST_RINT",  "CAST_FLOOR", "CAST_CEIL",
                                      "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
  const int i = static_cast<int>(m);
  return i >= 0 && i <= 6 ? names[i] : "an unknown RoundMode";
}
template <class T> constexpr const char* TypeName() {
  return IsF16<T>::value ? "half" : IsBf16<T>::value ? "bfloat16_t" : std::is_same<T, float>::value ? "float"
       : std::is_same<T, int32_t>::value ? "int32_t" : std::is_same<T, int8_t>::value ? "int8_t" : "?";
}
inline const char* ModesText(unsigned modes) {
  if (modes == kModeNone) return "CAST_NONE";
  if (modes == kModesDirected) return "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC";
  if (modes == (kModeNone | kModesDirected)) return "CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC";
  return "CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC/CAST_ODD";
}

// A RoundMode the pair does not take is a compile error where the call passes a constant (the
// compiler proves the call reachable with that mode; g++ -O1 and above, as stratac builds) and a
// model failure at run time otherwise. Declared, never defined: a call that survives optimisation
// is reported by the compiler with the message.
#define STRATA_CAST_MODE_ERROR(NAME, PAIR, MODES)                                                     \
  void NAME() __attribute__((error("AscendC::Cast " PAIR " on A2/A3 takes " MODES                     \
                                   " only (asc-devkit docs Cast.md); this call passes another RoundMode")))
STRATA_CAST_MODE_ERROR(CastModeErrorHalfToFloat, "half->float", "CAST_NONE");
STRATA_CAST_MODE_ERROR(CastModeErrorBf16ToFloat, "bfloat16_t->float", "CAST_NONE");
STRATA_CAST_MODE_ERROR(CastModeErrorHalfToInt32, "half->int32_t", "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorBf16ToInt32, "bfloat16_t->int32_t",
                       "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorInt32ToFloat, "int32_t->float",
                       "CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorFloatToBf16, "float->bfloat16_t",
                       "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorFloatToInt32, "float->int32_t", "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorFloatToFloat, "float->float", "CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorInt8ToHalf, "int8_t->half", "CAST_NONE");
STRATA_CAST_MODE_ERROR(CastModeErrorHalfToInt8, "half->int8_t",
                       "CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC");
STRATA_CAST_MODE_ERROR(CastModeErrorFloatToHalf, "float->half", "CAST_NONE/CAST_RINT/CAST_FLOOR/CAST_CEIL/CAST_ROUND/CAST_TRUNC/CAST_ODD");
#undef STRATA_CAST_MODE_ERROR

template <class D, class S> __attribute__((always_inline)) inline void CastModeConstantCheck(const RoundMode& m) {
  using std::is_same;
  if (__builtin_constant_p(m) && (CastModes<D, S>() & ModeBit(m)) == 0) {
    if constexpr (is_same<S, half>::value && is_same<D, float>::value) CastModeErrorHalfToFloat();
    else if constexpr (is_same<S, bfloat16_t>::value && is_same<D, float>::value) CastModeErrorBf16ToFloat();
    else if constexpr (is_same<S, half>::value && is_same<D, int32_t>::value) CastModeErrorHalfToInt32();
    else if constexpr (is_same<S, bfloat16_t>::value && is_same<D, int32_t>::value) CastModeErrorBf16ToInt32();
    else if constexpr (is_same<S, int32_t>::value && is_same<D, float>::value) CastModeErrorInt32ToFloat();
    else if constexpr (is_same<S, float>::value && is_same<D, bfloat16_t>::value) CastModeErrorFloatToBf16();
    else if constexpr (is_same<S, float>::value && is_same<D, int32_t>::value) CastModeErrorFloatToInt32();
    else if constexpr (is_same<S, float>::value && is_same<D, float>::value) CastModeErrorFloatToFloat();
    else if constexpr (is_same<S, float>::value && is_same<D, half>::value) CastModeErrorFloatToHalf();
    else if constexpr (is_same<S, int8_t>::value && is_same<D, half>::value) CastModeErrorInt8ToHalf();
    else if constexpr (is_same<S, half>::value && is_same<D, int8_t>::value) CastModeErrorHalfToInt8();
  }
}

template <class D, class S>
inline void CastRun(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode roundMode, uint32_t count) {
  constexpr unsigned modes = CastModes<D, S>();
  if ((modes & ModeBit(roundMode)) == 0)
    ::strata_cpu::Fail("Cast %s->%s with %s: A2/A3 take %s only for this pair (asc-devkit docs Cast.md)",
                       TypeName<S>(), TypeName<D>(), ModeName(roundMode), ModesText(modes));
  if (count == 0) return;
  dst.StrataCheck(0, count, "Cast", "dst");
  src.StrataCheck(0, count, "Cast", "src");
  CheckVecAligned(dst.StrataPtr(), "Cast", "dst");
  CheckVecAligned(src.StrataPtr(), "Cast", "src");
  D* d = dst.StrataPtr();
  const S* s = src.StrataPtr();
  if constexpr (sizeof(D) > sizeof(S)) {
    const uint8_t* d0 = reinterpret_cast<const uint8_t*>(d);
    const uint8_t* s0 = reinterpret_cast<const uint8_t*>(s);
    if (d0 < s0 + uint64_t(count) * sizeof(S) && s0 < d0 + uint64_t(count) * sizeof(D))
      ::strata_cpu::Fail("Cast %s->%s: dst (UB offset %lld, %llu bytes) and src (UB offset %lld, %llu bytes) overlap; "
                         "a widening Cast over overlapping operands may give wrong results on A2/A3 "
                         "(asc-devkit docs Cast.md, 约束说明)",
                         TypeName<S>(), TypeName<D>(), (long long)::strata_cpu::UbOffset(d),
                         (unsigned long long)(uint64_t(count) * sizeof(D)), (long long)::strata_cpu::UbOffset(s),
                         (unsigned long long)(uint64_t(count) * sizeof(S)));
  }
  dst.StrataWrote(0, count);
  for (uint32_t i = 0; i < count; ++i) d[i] = CastOne<D, S>(s[i], roundMode);
}
}  // namespace detail

template <class D, class S>
__attribute__((always_inline)) inline void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src,
                                                const RoundMode& roundMode, const uint32_t count) {
  static_assert(!((std::is_same<D, half>::value && std::is_same<S, bfloat16_t>::value) ||
                  (std::is_same<D, bfloat16_t>::value && std::is_same<S, half>::value)),
                "AscendC::Cast between bfloat16_t and half: A2/A3 have no direct conversion (asc-devkit docs "
                "Cast.md); go through float");
  static_assert(!(std::is_same<D, half>::value && std::is_same<S, int32_t>::value),
                "AscendC::Cast int32_t->half on A2/A3 needs SetDeqScale (asc-devkit docs Cast.md), which the CPU "
                "model does not model; go through float");
  static_assert(detail::CastModes<D, S>() != 0 ||
                    (std::is_same<D, half>::value && std::is_same<S, int32_t>::value) ||
                    (std::is_same<D, half>::value && std::is_same<S, bfloat16_t>::value) ||
                    (std::is_same<D, bfloat16_t>::value && std::is_same<S, half>::value),
                "AscendC::Cast: this (src, dst) pair is not in the A2/A3 table (asc-devkit docs Cast.md) among the "
                "types the model implements (float, half, bfloat16_t, int32_t; int8_t<->half only: float<->int8_t "
                "goes through half)");
  detail::CastModeConstantCheck<D, S>(roundMode);
  detail::CastRun(dst, src, roundMode, count);
}

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_CAST_H
