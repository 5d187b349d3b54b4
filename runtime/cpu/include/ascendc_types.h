// CPU model of Ascend C's basic definitions (included by kernel_operator.h): the kernel function
// qualifiers and GM_ADDR (Bisheng keywords, nothing to do on a CPU), KERNEL_TASK_TYPE_DEFAULT and
// KernelMetaType, the pipe and event id names, the 16-bit types half and bfloat16_t, the system
// variables GetBlockIdx/GetBlockNum, and the enums the API families share (TPosition, HardEvent,
// RoundMode, CacheLine, DcciDst). Rules of runtime/README.md's table: "kernel type" is checked by
// the model's DeclareKernelType (runtime/cpu/src/launch.cpp), which KERNEL_TASK_TYPE_DEFAULT calls.
#ifndef STRATA_CPU_ASCENDC_TYPES_H
#define STRATA_CPU_ASCENDC_TYPES_H

#include <stdint.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "strata_cpu.h"

// Lets shared sources (runtime/device/strata_device.h) tell the CPU build from the NPU build.
#ifndef STRATA_CPU_MODEL
#define STRATA_CPU_MODEL 1
#endif

// ---- Bisheng keywords: nothing to do on a CPU ----
#define __global__
#define __aicore__
#define __gm__
#define __ubuf__
// `__inline__` is left alone: g++ already accepts it as the GNU spelling of `inline`.
#define GM_ADDR __gm__ uint8_t*

// ---- Kernel types (KERNEL_TASK_TYPE_DEFAULT) ----
enum KernelMetaType : int {
  KERNEL_TYPE_AIV_ONLY = 0,
  KERNEL_TYPE_AIC_ONLY = 1,
  KERNEL_TYPE_MIX_AIV_1_0 = 2,
  KERNEL_TYPE_MIX_AIC_1_0 = 3,
  KERNEL_TYPE_MIX_AIC_1_1 = 4,
  KERNEL_TYPE_MIX_AIC_1_2 = 5,
};
#define KERNEL_TASK_TYPE_DEFAULT(t) ::strata_cpu::DeclareKernelType(static_cast<int>(t))

// Every core of the model is a vector core (`if ASCEND_IS_AIV { ... }`).
#define ASCEND_IS_AIV constexpr (true)
#define ASCEND_IS_AIC constexpr (false)

// ---- Pipes and event ids (global names, as the compiler builtins are) ----
enum pipe_t : int { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };
enum event_t : int {
  EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7
};

// ---- 16-bit floating point types ----
using half = _Float16;

namespace strata_cpu {
namespace num {
constexpr uint32_t F32Bits(float f) { return __builtin_bit_cast(uint32_t, f); }
constexpr float F32FromBits(uint32_t u) { return __builtin_bit_cast(float, u); }
// float -> bfloat16 bits, round to nearest even; NaN stays (quiet) NaN.
constexpr uint16_t F32ToBf16Bits(float f) {
  uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
constexpr float Bf16BitsToF32(uint16_t b) { return F32FromBits(static_cast<uint32_t>(b) << 16); }
}  // namespace num
}  // namespace strata_cpu

// bfloat16: 16-bit storage, converts to float exactly and from float with round-to-nearest-even;
// arithmetic goes through the implicit conversion to float.
struct bfloat16_t {
  uint16_t bits;

  bfloat16_t() = default;
  template <class U, typename std::enable_if<std::is_arithmetic<U>::value ||
                                                 std::is_same<U, _Float16>::value,
                                             int>::type = 0>
  constexpr bfloat16_t(U v) : bits(::strata_cpu::num::F32ToBf16Bits(static_cast<float>(v))) {}
  constexpr operator float() const { return ::strata_cpu::num::Bf16BitsToF32(bits); }
  static constexpr bfloat16_t FromBits(uint16_t b) {
    bfloat16_t r{};
    r.bits = b;
    return r;
  }
  bfloat16_t& operator+=(float v) { return *this = bfloat16_t(float(*this) + v); }
  bfloat16_t& operator-=(float v) { return *this = bfloat16_t(float(*this) - v); }
  bfloat16_t& operator*=(float v) { return *this = bfloat16_t(float(*this) * v); }
  bfloat16_t& operator/=(float v) { return *this = bfloat16_t(float(*this) / v); }
};
static_assert(sizeof(bfloat16_t) == 2 && std::is_trivially_copyable<bfloat16_t>::value, "bf16");
static_assert(sizeof(half) == 2 && std::is_trivially_copyable<half>::value, "half");


namespace AscendC {

// ---- Core index ----
inline int64_t GetBlockIdx() { return ::strata_cpu::BlockIdx(); }
inline int64_t GetBlockNum() { return ::strata_cpu::BlockNum(); }
inline int64_t GetSubBlockIdx() { return 0; }
inline int64_t GetSubBlockNum() { return 1; }
inline int64_t GetTaskRatio() { return 1; }

enum class TPosition : uint8_t {
  GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM = SPM,
  TSCM, C2PIPE2GM, MAX,
};

enum class HardEvent : int {
  MTE2_V, V_MTE2, MTE3_V, V_MTE3, V_V, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3,
  MTE3_S, MAX,
};
using TEventID = int8_t;

enum class RoundMode : int { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };

enum class CacheLine : int { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : int { CACHELINE_OUT = 0, CACHELINE_UB, CACHELINE_ALL };

namespace detail {
template <class T> constexpr int DTypeOf() {
  if (std::is_same<T, float>::value) return ::strata_cpu::kDtF32;
  if (std::is_same<T, half>::value) return ::strata_cpu::kDtF16;
  if (std::is_same<T, bfloat16_t>::value) return ::strata_cpu::kDtBF16;
  if (std::is_same<T, int32_t>::value) return ::strata_cpu::kDtI32;
  if (std::is_same<T, int16_t>::value) return ::strata_cpu::kDtI16;
  if (std::is_same<T, int8_t>::value) return ::strata_cpu::kDtI8;
  if (std::is_same<T, uint32_t>::value) return ::strata_cpu::kDtU32;
  if (std::is_same<T, uint16_t>::value) return ::strata_cpu::kDtU16;
  if (std::is_same<T, uint8_t>::value) return ::strata_cpu::kDtU8;
  if (std::is_same<T, int64_t>::value) return ::strata_cpu::kDtI64;
  if (std::is_same<T, uint64_t>::value) return ::strata_cpu::kDtU64;
  if (std::is_same<T, double>::value) return ::strata_cpu::kDtF64;
  return ::strata_cpu::kDtOther;
}

}  // namespace detail

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_TYPES_H
