// CPU model of Ascend C's data definitions (included by kernel_operator.h): GlobalTensor (a view
// of GM: any pool address, local or a peer's; GetValue/SetValue through the core's scalar D-cache)
// and LocalTensor (a view of the core's Unified Buffer). Rules of runtime/README.md's table: "UB
// bounds" (StrataCheck: every LocalTensor access inside its buffer), "GM bounds" (a GlobalTensor
// given a size not accessed past it); UB writes are reported to the model (UbWrote, GetPhyAddr)
// for "UB holds garbage when a kernel starts".
#ifndef STRATA_CPU_ASCENDC_TENSOR_H
#define STRATA_CPU_ASCENDC_TENSOR_H

#include "ascendc_types.h"

namespace AscendC {

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

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_TENSOR_H
