// CPU model of the Ascend C subset used by stratac kernels (namespace AscendC).
//
// Written from the documented semantics of the public API (names and signatures are API facts);
// no CANN / asc-devkit code. Every operation executes synchronously on the calling thread (one
// thread per vector core); rule checks that the hardware would turn into a fault or a hang call
// strata_cpu::Fail, which reports rank, core, `strata:` line and kernel and unwinds the core.
// All mutable state lives in libstratacpu.so (see strata_cpu.h); this header keeps none.
#ifndef STRATA_CPU_KERNEL_OPERATOR_H
#define STRATA_CPU_KERNEL_OPERATOR_H

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

// ---- GlobalTensor: a view of GM (any pool address, local or a peer's) ----
template <class T> class GlobalTensor {
 public:
  using PrimType = T;
  GlobalTensor() = default;

  void SetGlobalBuffer(__gm__ T* buffer, uint64_t size) {
    ptr_ = buffer;
    size_ = size;
    sized_ = true;
  }
  void SetGlobalBuffer(__gm__ T* buffer) {
    ptr_ = buffer;
    size_ = 0;
    sized_ = false;
  }
  GlobalTensor operator[](uint64_t offset) const {
    GlobalTensor r;
    r.ptr_ = ptr_ + offset;
    r.sized_ = sized_;
    r.size_ = sized_ ? (offset <= size_ ? size_ - offset : 0) : 0;
    r.overrun_ = overrun_ || (sized_ && offset > size_);
    return r;
  }
  __gm__ T* GetPhyAddr() const { return ptr_; }
  __gm__ T* GetPhyAddr(uint64_t offset) const { return ptr_ + offset; }
  // 0 when the buffer was set without a size.
  uint64_t GetSize() const { return sized_ ? size_ : 0; }

  // Scalar GM access goes through the core's data cache (non-coherent, write-back; strata_cpu.h:
  // ScalarLoad/ScalarStore): read GM that others write only after DataCacheCleanAndInvalid, and
  // flush after writing.
  T GetValue(uint64_t offset) const {
    StrataCheck(offset, 1, "GlobalTensor::GetValue");
    T v;
    ::strata_cpu::ScalarLoad(ptr_ + offset, &v, sizeof(T), "GlobalTensor::GetValue");
    return v;
  }
  void SetValue(uint64_t offset, T value) const {
    StrataCheck(offset, 1, "GlobalTensor::SetValue");
    ::strata_cpu::ScalarStore(ptr_ + offset, &value, sizeof(T), "GlobalTensor::SetValue");
  }

  // Model internals: `count` elements from `first` lie inside the tensor and the pool.
  void StrataCheck(uint64_t first, uint64_t count, const char* op) const {
    if (ptr_ == nullptr) ::strata_cpu::Fail("%s: GlobalTensor has no buffer (SetGlobalBuffer missing)", op);
    if (sized_ && (overrun_ || count > size_ || first > size_ - count))
      ::strata_cpu::Fail("%s: GM access of elements [%llu, %llu) is past the GlobalTensor size %llu%s",
                         op, (unsigned long long)first, (unsigned long long)(first + count),
                         (unsigned long long)size_, overrun_ ? " (view offset beyond its size)" : "");
    ::strata_cpu::CheckGm(ptr_ + first, count * sizeof(T), op);
  }

 private:
  T* ptr_ = nullptr;
  uint64_t size_ = 0;
  bool sized_ = false;
  bool overrun_ = false;
};

// ---- LocalTensor: a view of the core's Unified Buffer ----
template <class T> class LocalTensor {
 public:
  using PrimType = T;
  LocalTensor() = default;

  LocalTensor operator[](uint32_t offset) const {
    LocalTensor r;
    r.ptr_ = ptr_ + offset;
    r.size_ = offset <= size_ ? size_ - offset : 0;
    r.cap_ = offset <= cap_ ? cap_ - offset : 0;
    r.bad_ = bad_ || offset > cap_;
    return r;
  }
  T GetValue(uint32_t offset) const {
    StrataCheck(offset, 1, "LocalTensor::GetValue", "tensor");
    return ptr_[offset];
  }
  void SetValue(uint32_t offset, T value) const {
    StrataCheck(offset, 1, "LocalTensor::SetValue", "tensor");
    StrataWrote(offset, 1);
    ptr_[offset] = value;
  }
  T& operator()(uint32_t offset) const {
    StrataCheck(offset, 1, "LocalTensor::operator()", "tensor");
    StrataWrote(offset, 1);
    return ptr_[offset];
  }
  uint32_t GetSize() const { return size_; }
  uint32_t GetLength() const { return size_ * static_cast<uint32_t>(sizeof(T)); }
  void SetSize(uint32_t size) {
    if (size > cap_) ::strata_cpu::Fail("LocalTensor::SetSize(%u) exceeds its buffer (%u elements)", size, cap_);
    size_ = size;
  }
  template <class U> LocalTensor<U> ReinterpretCast() const {
    LocalTensor<U> r;
    r.ptr_ = reinterpret_cast<U*>(ptr_);
    r.size_ = static_cast<uint32_t>(uint64_t(size_) * sizeof(T) / sizeof(U));
    r.cap_ = static_cast<uint32_t>(uint64_t(cap_) * sizeof(T) / sizeof(U));
    r.bad_ = bad_;
    return r;
  }
  // A raw UB pointer may be written through: the model marks the tensor's whole buffer from here
  // on as written (the next launch refills it with 0xff; see runtime/cpu/src/ub.cpp g_ub_dirty).
  __ubuf__ T* GetPhyAddr() const {
    StrataWrote(0, cap_);
    return ptr_;
  }
  __ubuf__ T* GetPhyAddr(uint32_t offset) const {
    if (offset <= cap_) StrataWrote(offset, cap_ - offset);
    return ptr_ + offset;
  }

  // Model internals: the address without marking it written (the ops mark what they write).
  T* StrataPtr() const { return ptr_; }
  // Model internals: `count` elements from `first` may have been written (UB refill bookkeeping).
  void StrataWrote(uint64_t first, uint64_t count) const {
    if (ptr_ != nullptr && count > 0) ::strata_cpu::UbWrote(ptr_ + first, count * sizeof(T));
  }

  // Model internals: `count` elements from `first` lie inside the tensor's buffer.
  void StrataCheck(uint64_t first, uint64_t count, const char* op, const char* role) const {
    if (ptr_ == nullptr || bad_ || count > cap_ || first > cap_ - count)
      ::strata_cpu::FailUb(op, role, ptr_ == nullptr ? nullptr : ptr_ + first, count * sizeof(T),
                           first <= cap_ ? (cap_ - first) * sizeof(T) : 0);
  }
  static LocalTensor StrataMake(T* ptr, uint32_t size, uint32_t cap) {
    LocalTensor r;
    r.ptr_ = ptr;
    r.size_ = size;
    r.cap_ = cap;
    return r;
  }

 private:
  template <class U> friend class LocalTensor;
  T* ptr_ = nullptr;
  uint32_t size_ = 0;  // logical size (GetSize)
  uint32_t cap_ = 0;   // elements up to the end of the underlying buffer (bounds checks)
  bool bad_ = false;   // a view taken beyond the end of its buffer
};

// ---- TPipe, TQue, TBuf ----
class TPipe;

// Queue events: a TQue synchronises its producer and consumer pipes with event flags taken from
// the same per-core ids (0-7 per HardEvent) as TPipe::AllocEventID. The model holds one id of the
// queue's forward event per EnQue'd buffer (set at EnQue, waited and given back at DeQue) and one
// of its reverse event per freed buffer (set at FreeTensor, waited and given back when the buffer is
// allocated again). VECIN: MTE2_V / V_MTE2; VECOUT: V_MTE3 / MTE3_V; VECIN->VECOUT: MTE2_MTE3 /
// MTE3_MTE2. Which ids the real framework uses is not documented; the model's point is that a
// SetFlag on a fixed id can meet a flag a queue has set (set-set) while AllocEventID's ids cannot.
class StrataQueBase {
 public:
  StrataQueBase() {
    for (uint32_t i = 0; i < kMaxBuffers; ++i) rev_id_[i] = fifo_ev_[i] = -1;
  }
  template <class T> LocalTensor<T> AllocTensor() {
    Ready("TQue::AllocTensor");
    for (uint32_t k = 0; k < num_; ++k) {
      uint32_t i = (next_ + k) % num_;
      if (!allocated_[i]) {
        if (rev_id_[i] >= 0) {
          ::strata_cpu::EventWait(rev_ev_, rev_id_[i], "TQue::AllocTensor");
          ::strata_cpu::EventRelease(rev_ev_, rev_id_[i], true, "TQue::AllocTensor");
          rev_id_[i] = -1;
        }
        allocated_[i] = true;
        next_ = (i + 1) % num_;
        return LocalTensor<T>::StrataMake(reinterpret_cast<T*>(base_ + uint64_t(i) * stride_),
                                          len_ / sizeof(T), stride_ / sizeof(T));
      }
    }
    ::strata_cpu::Fail("TQue::AllocTensor: all %u buffers of the queue are allocated (FreeTensor missing; "
                       "on hardware this blocks forever)", num_);
  }
  template <class T> bool EnQue(const LocalTensor<T>& tensor) {
    Ready("TQue::EnQue");
    int i = IndexOf(tensor.StrataPtr(), "TQue::EnQue");
    if (count_ == kMaxBuffers) ::strata_cpu::Fail("TQue::EnQue: queue overflow");
    uint32_t slot = (head_ + count_) % kMaxBuffers;
    fifo_ptr_[slot] = reinterpret_cast<uint8_t*>(tensor.StrataPtr());
    fifo_bytes_[slot] = tensor.GetLength();
    fifo_idx_[slot] = i;
    if (fwd_ev_ >= 0) {
      fifo_ev_[slot] = ::strata_cpu::EventAlloc(fwd_ev_, true, "TQue::EnQue");
      ::strata_cpu::EventSet(fwd_ev_, fifo_ev_[slot], "TQue::EnQue");
    }
    ++count_;
    return true;
  }
  template <class T> LocalTensor<T> DeQue() {
    Ready("TQue::DeQue");
    if (count_ == 0) ::strata_cpu::Fail("TQue::DeQue on an empty queue (EnQue missing; on hardware this blocks forever)");
    uint32_t slot = head_;
    head_ = (head_ + 1) % kMaxBuffers;
    --count_;
    if (fifo_ev_[slot] >= 0) {
      ::strata_cpu::EventWait(fwd_ev_, fifo_ev_[slot], "TQue::DeQue");
      ::strata_cpu::EventRelease(fwd_ev_, fifo_ev_[slot], true, "TQue::DeQue");
      fifo_ev_[slot] = -1;
    }
    uint8_t* end = base_ + uint64_t(fifo_idx_[slot]) * stride_ + stride_;
    return LocalTensor<T>::StrataMake(reinterpret_cast<T*>(fifo_ptr_[slot]), fifo_bytes_[slot] / sizeof(T),
                                      static_cast<uint32_t>((end - fifo_ptr_[slot]) / sizeof(T)));
  }
  template <class T> void FreeTensor(const LocalTensor<T>& tensor) {
    Ready("TQue::FreeTensor");
    int i = IndexOf(tensor.StrataPtr(), "TQue::FreeTensor");
    if (!allocated_[i]) ::strata_cpu::Fail("TQue::FreeTensor: buffer %d of the queue is not allocated (double free)", i);
    allocated_[i] = false;
    if (rev_ev_ >= 0) {
      rev_id_[i] = ::strata_cpu::EventAlloc(rev_ev_, true, "TQue::FreeTensor");
      ::strata_cpu::EventSet(rev_ev_, rev_id_[i], "TQue::FreeTensor");
    }
  }
  bool VacantInQue() const { return count_ < num_; }
  bool HasTensorInQue() const { return count_ > 0; }
  int32_t GetTensorCountInQue() const { return static_cast<int32_t>(count_); }

 protected:
  friend class TPipe;
  static constexpr uint32_t kMaxBuffers = 32;
  void Ready(const char* op) const {
    if (base_ == nullptr) ::strata_cpu::Fail("%s: queue used before TPipe::InitBuffer", op);
  }
  int IndexOf(const void* p, const char* op) const {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    if (b < base_ || b >= base_ + uint64_t(num_) * stride_)
      ::strata_cpu::Fail("%s: tensor does not belong to this queue", op);
    return static_cast<int>((b - base_) / stride_);
  }
  uint8_t* base_ = nullptr;
  uint32_t num_ = 0, len_ = 0, stride_ = 0, next_ = 0;
  bool allocated_[kMaxBuffers] = {};
  uint8_t* fifo_ptr_[kMaxBuffers] = {};
  uint32_t fifo_bytes_[kMaxBuffers] = {};
  int fifo_idx_[kMaxBuffers] = {};
  uint32_t head_ = 0, count_ = 0;
  int fwd_ev_ = -1, rev_ev_ = -1;          // HardEvent of the queue's two directions, -1: none
  int rev_id_[kMaxBuffers];                // per buffer: reverse-event id held since FreeTensor
  int fifo_ev_[kMaxBuffers];               // per FIFO slot: forward-event id held since EnQue
};

template <TPosition src, TPosition dst, int32_t depth, auto mask = 0>
class TQueBind : public StrataQueBase {
 public:
  static constexpr TPosition kStrataSrc = src, kStrataDst = dst;
};

// The HardEvents of a queue from `src` to `dst` (see StrataQueBase): forward, reverse; -1: none.
constexpr int StrataQueEvent(TPosition src, TPosition dst, bool reverse) {
  return (src == TPosition::VECIN && dst == TPosition::VECIN)
             ? static_cast<int>(reverse ? HardEvent::V_MTE2 : HardEvent::MTE2_V)
         : (src == TPosition::VECOUT && dst == TPosition::VECOUT)
             ? static_cast<int>(reverse ? HardEvent::MTE3_V : HardEvent::V_MTE3)
         : (src == TPosition::VECIN && dst == TPosition::VECOUT)
             ? static_cast<int>(reverse ? HardEvent::MTE3_MTE2 : HardEvent::MTE2_MTE3)
             : -1;
}

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public TQueBind<pos, pos, depth, mask> {};

template <TPosition pos = TPosition::VECCALC> class TBuf {
 public:
  template <class T> LocalTensor<T> Get() const {
    Ready("TBuf::Get");
    return LocalTensor<T>::StrataMake(reinterpret_cast<T*>(base_), len_ / sizeof(T), stride_ / sizeof(T));
  }
  template <class T> LocalTensor<T> Get(uint32_t count) const {
    Ready("TBuf::Get");
    if (uint64_t(count) * sizeof(T) > stride_)
      ::strata_cpu::Fail("TBuf::Get(%u): %llu bytes exceed the buffer's %u bytes", count,
                         (unsigned long long)(uint64_t(count) * sizeof(T)), stride_);
    return LocalTensor<T>::StrataMake(reinterpret_cast<T*>(base_), count, stride_ / sizeof(T));
  }
  template <class T> LocalTensor<T> GetWithOffset(uint32_t count, uint32_t byteOffset) const {
    Ready("TBuf::GetWithOffset");
    if (byteOffset % 32 != 0)
      ::strata_cpu::Fail("TBuf::GetWithOffset: byte offset %u is not 32-byte aligned", byteOffset);
    if (uint64_t(byteOffset) + uint64_t(count) * sizeof(T) > stride_)
      ::strata_cpu::Fail("TBuf::GetWithOffset(%u, %u): %llu bytes from offset %u exceed the buffer's %u bytes",
                         count, byteOffset, (unsigned long long)(uint64_t(count) * sizeof(T)), byteOffset, stride_);
    return LocalTensor<T>::StrataMake(reinterpret_cast<T*>(base_ + byteOffset), count,
                                      (stride_ - byteOffset) / sizeof(T));
  }

 private:
  friend class TPipe;
  void Ready(const char* op) const {
    if (base_ == nullptr) ::strata_cpu::Fail("%s: TBuf used before TPipe::InitBuffer", op);
  }
  uint8_t* base_ = nullptr;
  uint32_t len_ = 0, stride_ = 0;
};

// Carves the core's 192 KiB UB sequentially from offset 0; asking for more fails.
class TPipe {
 public:
  TPipe() { ::strata_cpu::SetCurrentPipe(this); }
  ~TPipe() {
    if (::strata_cpu::CurrentPipe() == this) ::strata_cpu::SetCurrentPipe(nullptr);
  }
  TPipe(const TPipe&) = delete;
  TPipe& operator=(const TPipe&) = delete;

  template <class Q> bool InitBuffer(Q& que, uint8_t num, uint32_t len) {
    static_assert(std::is_base_of<StrataQueBase, Q>::value, "InitBuffer(que, num, len) needs a TQue/TQueBind");
    if (num == 0 || num > StrataQueBase::kMaxBuffers)
      ::strata_cpu::Fail("TPipe::InitBuffer: %u buffers per queue is outside [1, %u]", num, StrataQueBase::kMaxBuffers);
    uint32_t stride = Align32(len);
    uint8_t* base = Carve(uint64_t(num) * stride, num, len);
    StrataQueBase& q = que;
    q = StrataQueBase();
    q.base_ = base;
    q.num_ = num;
    q.len_ = len;
    q.stride_ = stride;
    q.fwd_ev_ = StrataQueEvent(Q::kStrataSrc, Q::kStrataDst, false);
    q.rev_ev_ = StrataQueEvent(Q::kStrataSrc, Q::kStrataDst, true);
    return true;
  }
  template <TPosition pos> bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    uint32_t stride = Align32(len);
    buf.base_ = Carve(stride, 1, len);
    buf.len_ = len;
    buf.stride_ = stride;
    return true;
  }
  void Reset() { used_ = 0; }
  void Destroy() { used_ = 0; }
  // An event id that nobody holds and whose flag is clear, NOT taken: for an immediate
  // SetFlag/WaitFlag pair (FetchEventID doc). Fails when every id of `event` is held.
  TEventID FetchEventID(HardEvent event) {
    return static_cast<TEventID>(::strata_cpu::EventFetch(static_cast<int>(event)));
  }
  template <HardEvent event> TEventID FetchEventID() { return FetchEventID(event); }
  // Takes an id of `evt` that no queue and no other AllocEventID holds, until ReleaseEventID
  // (AllocEventID / ReleaseEventID docs). Fails when all 8 are held.
  template <HardEvent evt> TEventID AllocEventID() {
    return static_cast<TEventID>(::strata_cpu::EventAlloc(static_cast<int>(evt), false, "TPipe::AllocEventID"));
  }
  // Gives back an id from AllocEventID<evt>; fails for any other id or while its flag is set.
  template <HardEvent evt> void ReleaseEventID(TEventID id) {
    ::strata_cpu::EventRelease(static_cast<int>(evt), id, false, "TPipe::ReleaseEventID");
  }
  uint32_t StrataUsedBytes() const { return used_; }

 private:
  static uint32_t Align32(uint32_t len) { return static_cast<uint32_t>((uint64_t(len) + 31) & ~uint64_t(31)); }
  uint8_t* Carve(uint64_t bytes, uint32_t num, uint32_t len) {
    if (uint64_t(used_) + bytes > ::strata_cpu::kUbBytes)
      ::strata_cpu::Fail("TPipe::InitBuffer: UB overflow: %u x %u bytes (%llu bytes 32-byte aligned) at UB offset %u "
                         "exceed the %u-byte Unified Buffer",
                         num, len, (unsigned long long)bytes, used_, ::strata_cpu::kUbBytes);
    uint8_t* p = ::strata_cpu::UbCarve(uint64_t(used_) + bytes) + used_;
    used_ += static_cast<uint32_t>(bytes);
    return p;
  }
  uint32_t used_ = 0;
};

inline TPipe* GetTPipePtr() { return static_cast<TPipe*>(::strata_cpu::CurrentPipe()); }

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

// ---- Pipe synchronisation: every operation is synchronous, so only the pairing is checked ----
template <HardEvent event> inline void SetFlag(int32_t eventID) {
  ::strata_cpu::EventSet(static_cast<int>(event), eventID, "SetFlag");
}
template <HardEvent event> inline void WaitFlag(int32_t eventID) {
  ::strata_cpu::EventWait(static_cast<int>(event), eventID, "WaitFlag");
}
template <pipe_t pipe> inline void PipeBarrier() { ::strata_cpu::Fence(); }

// ---- Inter-core hard sync ----
template <bool isAIVOnly = true> inline void SyncAll() { ::strata_cpu::SyncAllCores(isAIVOnly); }

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

// ---- Scalar cache maintenance: a memory fence in the model (plus an abort check, since it sits
// in flag-polling loops) ----
template <class T, CacheLine entireType, DcciDst dcciDst>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& dst) {
  // every DcciDst is treated alike: the core's scalar data cache is written back and invalidated
  // (SINGLE_CACHE_LINE: the 64-byte line holding dst's first element; ENTIRE_DATA_CACHE: all)
  ::strata_cpu::DataCacheCleanInvalidate(dst.GetPhyAddr(), entireType == CacheLine::ENTIRE_DATA_CACHE,
                                         "DataCacheCleanAndInvalid");
}

}  // namespace AscendC

#endif  // STRATA_CPU_KERNEL_OPERATOR_H
