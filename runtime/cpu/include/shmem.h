// CPU model of the SHMEM-for-Ascend subset used by stratac kernels (aclshmem_*, aclshmemx_*).
//
// Written from the documented semantics (names and signatures are API facts); no SHMEM code.
// The symmetric heap of rank r is heap instance r of the pooled shared-memory segment; every
// rank maps the whole pool, so a translated address is directly readable and writable. The host
// API (aclshmem_malloc / calloc / free) is declared in strata_cpu.h.
#ifndef STRATA_CPU_SHMEM_H
#define STRATA_CPU_SHMEM_H

#include <stdint.h>

#include "kernel_operator.h"
#include "strata_cpu.h"

#define ACLSHMEM_SIGNAL_SET 0
#define ACLSHMEM_SIGNAL_ADD 1

#define ACLSHMEM_CMP_EQ 0
#define ACLSHMEM_CMP_NE 1
#define ACLSHMEM_CMP_GT 2
#define ACLSHMEM_CMP_GE 3
#define ACLSHMEM_CMP_LT 4
#define ACLSHMEM_CMP_LE 5

#define ACLSHMEM_MAX_AIV_PER_NPU 48

namespace strata_cpu {
namespace shmem_detail {
// SHMEM's default-config device APIs stage through fixed UB regions (SHMEM
// src/host/init/shmem_init.cpp:34-69: MTE {offset 0, 16 KiB}; UDMA 189 KiB, RDMA 190 KiB, SDMA 191 KiB;
// the internal barrier 188 KiB); signal ADD on the MTE path uses the MTE one
// (src/device/gm2gm/shmem_device_so.hpp:328-343). TPipe carves UB from offset 0, so a kernel that
// calls such an API after TPipe carved those bytes would have SHMEM overwrite its buffers.
inline void CheckDefaultUb(const char* op) {
  AscendC::TPipe* p = AscendC::GetTPipePtr();
  uint32_t used = p ? p->StrataUsedBytes() : 0;
  uint64_t off = 0;
  uint32_t bytes = 0;
  ::strata_cpu::GetMteUb(&off, &bytes);
  if (off < used)
    ::strata_cpu::Fail("%s stages through SHMEM's MTE UB region [%llu, %llu) but TPipe has carved UB [0, %u): "
                       "SHMEM would overwrite the kernel's buffers (move the region past TPipe's with "
                       "aclshmemx_set_mte_config, or use ACLSHMEM_SIGNAL_SET)",
                       op, (unsigned long long)off, (unsigned long long)(off + bytes), used);
}
// SHMEM's SDMA helpers synchronise MTE3 -> MTE2 around their UB descriptor writes with
// SetFlag/WaitFlag<MTE3_MTE2>(sync_id) (shmem_device_sdma.hpp:24-57); the model does one such pair
// per call, so a sync_id whose flag a queue holds set is reported (set-set).
inline void SyncIdPair(uint32_t sync_id, const char* op) {
  const int ev = static_cast<int>(AscendC::HardEvent::MTE3_MTE2);
  ::strata_cpu::EventSet(ev, static_cast<int>(sync_id), op);
  ::strata_cpu::EventWait(ev, static_cast<int>(sync_id), op);
}
}  // namespace shmem_detail
}  // namespace strata_cpu

// ---- Query and address translation ----
inline int aclshmem_my_pe(void) { return ::strata_cpu::MyPe(); }
inline int aclshmem_n_pes(void) { return ::strata_cpu::NPes(); }

// `ptr` must lie in the caller's own heap instance; returns rank `pe`'s instance at the same offset.
inline __gm__ void* aclshmem_ptr(__gm__ void* ptr, int pe) {
  return ::strata_cpu::PeerPtr(ptr, pe, "aclshmem_ptr");
}

// ---- Signals ----
// `sig_addr` is a local symmetric address, translated to `pe`; SET is an atomic store and ADD an
// atomic add, both sequentially consistent.
inline void aclshmemx_signal_op(__gm__ int32_t* sig_addr, int32_t signal, int sig_op, int pe) {
  if (sig_op == ACLSHMEM_SIGNAL_ADD) ::strata_cpu::shmem_detail::CheckDefaultUb("aclshmemx_signal_op(ACLSHMEM_SIGNAL_ADD)");
  ::strata_cpu::SignalOp(sig_addr, signal, sig_op, pe);
}
// `sig_addr` is any pool address (local, or a peer's from aclshmem_ptr). Polls with atomic loads
// until the comparison holds and returns the value seen; fails at the wait deadline
// (strata_cpu_set_timeout) and unwinds when the pool is aborted by a failing rank.
inline int32_t aclshmem_signal_wait_until(__gm__ int32_t* sig_addr, int cmp, int32_t cmp_value) {
  return ::strata_cpu::SignalWaitUntil(sig_addr, cmp, cmp_value);
}

// ---- Ordering ----
// On hardware aclshmem_quiet also drains the MTE pipes (PipeBarrier<PIPE_ALL>) and the scalar
// data cache; the model's MTE copies are synchronous, so both are plain memory fences here. Neither
// waits for SDMA: that is aclshmemx_sdma_quiet.
inline void aclshmem_quiet(void) { ::strata_cpu::Fence(); }
inline void aclshmem_fence(void) { ::strata_cpu::Fence(); }

// Moves the UB staging region of SHMEM's default-config MTE APIs (signal ADD among them) for the
// calling core (SHMEM shmem_device_rma.h); `sync_id` is unused by the model.
inline void aclshmemx_set_mte_config(uint64_t ub_offset, uint32_t ub_size, uint32_t sync_id) {
  (void)sync_id;
  ::strata_cpu::SetMteUb(ub_offset, ub_size);
}

// ---- SDMA: each core's asynchronous copy engine ----
// `dst` is a local symmetric address translated to `pe`; `src` any pool address. `elem_size` is
// the element count. `buf`/`ub_size` is the UB scratch the hardware path needs (>= 64 bytes, a
// multiple of 64). The copy is split into 1 MiB SQEs that complete out of line; the core's queue
// holds at most STRATA_SDMA_SQ_DEPTH SQEs between quiets (a post past it fails), and the calling
// core spends STRATA_CPU_SDMA_SQE_US (default 3 us) per SQE (runtime/cpu/src/model_internal.h: kSdmaSqeCostUs).
// aclshmemx_sdma_quiet waits for every SQE; where the NPU gives up silently after 10^6 polls
// (shmem_device_sdma.hpp:313-337), the model fails at the wait deadline. The model always has the
// SDMA engine; on the NPU SHMEM must be initialised with ACLSHMEM_DATA_OP_SDMA (docs/npu.md).
template <class T>
inline void aclshmemx_sdma_put_nbi(__gm__ T* dst, __gm__ T* src, __ubuf__ T* buf, uint32_t ub_size,
                                   uint32_t elem_size, int pe, uint32_t sync_id) {
  ::strata_cpu::shmem_detail::SyncIdPair(sync_id, "aclshmemx_sdma_put_nbi(sync_id)");
  ::strata_cpu::SdmaPost(true, dst, src, uint64_t(elem_size) * sizeof(T), buf, ub_size, pe,
                         "aclshmemx_sdma_put_nbi");
}
// `src` is a local symmetric address translated to `pe`; `dst` any pool address.
template <class T>
inline void aclshmemx_sdma_get_nbi(__gm__ T* dst, __gm__ T* src, __ubuf__ T* buf, uint32_t ub_size,
                                   uint32_t elem_size, int pe, uint32_t sync_id) {
  ::strata_cpu::shmem_detail::SyncIdPair(sync_id, "aclshmemx_sdma_get_nbi(sync_id)");
  ::strata_cpu::SdmaPost(false, dst, src, uint64_t(elem_size) * sizeof(T), buf, ub_size, pe,
                         "aclshmemx_sdma_get_nbi");
}
// Waits until every copy the calling core posted has completed and is visible.
template <class T> inline void aclshmemx_sdma_quiet(__ubuf__ T* buf, uint32_t ub_size, uint32_t sync_id) {
  ::strata_cpu::shmem_detail::SyncIdPair(sync_id, "aclshmemx_sdma_quiet(sync_id)");
  ::strata_cpu::SdmaQuiet(buf, ub_size, "aclshmemx_sdma_quiet");
}

// Tensor forms: the scratch size is the LocalTensor's size in bytes.
template <class T>
inline void aclshmemx_sdma_put_nbi(AscendC::GlobalTensor<T>& dst, AscendC::GlobalTensor<T>& src,
                                   AscendC::LocalTensor<T>& buf, uint32_t elem_size, int pe, uint32_t sync_id) {
  aclshmemx_sdma_put_nbi(dst.GetPhyAddr(), src.GetPhyAddr(), buf.GetPhyAddr(), buf.GetLength(), elem_size, pe,
                         sync_id);
}
template <class T>
inline void aclshmemx_sdma_get_nbi(AscendC::GlobalTensor<T>& dst, AscendC::GlobalTensor<T>& src,
                                   AscendC::LocalTensor<T>& buf, uint32_t elem_size, int pe, uint32_t sync_id) {
  aclshmemx_sdma_get_nbi(dst.GetPhyAddr(), src.GetPhyAddr(), buf.GetPhyAddr(), buf.GetLength(), elem_size, pe,
                         sync_id);
}
template <class T> inline void aclshmemx_sdma_quiet(AscendC::LocalTensor<T>& buf, uint32_t sync_id) {
  aclshmemx_sdma_quiet(buf.GetPhyAddr(), buf.GetLength(), sync_id);
}

#endif  // STRATA_CPU_SHMEM_H
