// CPU model of Ascend C's synchronisation control and cache maintenance (included by
// kernel_operator.h): SetFlag/WaitFlag and PipeBarrier (intra-core sync between pipes), SyncAll
// (inter-core hard sync) and DataCacheCleanAndInvalid (the scalar D-cache). Rules of
// runtime/README.md's table: "`WaitFlag` needs a prior `SetFlag`", "event flags are binary",
// "`SyncAll` only in kernels declared KERNEL_TYPE_MIX_AIV_1_0" and "`SyncAll` that a core which
// already returned can never join" are checked by the model (runtime/cpu/src/events.cpp
// EventSet/EventWait, runtime/cpu/src/waits.cpp SyncAllCores), which these calls reach.
#ifndef STRATA_CPU_ASCENDC_SYNC_H
#define STRATA_CPU_ASCENDC_SYNC_H

#include "ascendc_cast.h"

namespace AscendC {

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

#endif  // STRATA_CPU_ASCENDC_SYNC_H
