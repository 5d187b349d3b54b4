// CPU model of Ascend C's resource management (included by kernel_operator.h): TPipe (carves the
// core's 192 KiB UB, hands out event ids: AllocEventID/ReleaseEventID/FetchEventID), TQue and
// TQueBind (AllocTensor/EnQue/DeQue/FreeTensor with the queue's events) and TBuf. Rules of
// runtime/README.md's table: "UB capacity" (Carve), "queues" and "`DeQue` of an empty queue"
// (StrataQueBase), "`TBuf::GetWithOffset` offsets" (GetWithOffset), "event ids" (StrataQueBase).
#ifndef STRATA_CPU_ASCENDC_TPIPE_H
#define STRATA_CPU_ASCENDC_TPIPE_H

#include "ascendc_tensor.h"

namespace AscendC {

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

}  // namespace AscendC

#endif  // STRATA_CPU_ASCENDC_TPIPE_H
