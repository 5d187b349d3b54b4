// CPU model of the Ascend C subset used by stratac kernels (namespace AscendC).
//
// Written from the documented semantics of the public API (names and signatures are API facts);
// no CANN / asc-devkit code. Every operation executes synchronously on the calling thread (one
// thread per vector core); rule checks that the hardware would turn into a fault or a hang call
// strata_cpu::Fail, which reports rank, core, `strata:` line and kernel and unwinds the core.
// All mutable state lives in libstratacpu.so (see strata_cpu.h); this header keeps none.
//
// One header per Ascend C API family, included here in this order (each includes the one before):
//   ascendc_types.h      kernel qualifiers, kernel types, pipes and event ids, half/bfloat16_t, enums
//   ascendc_tensor.h     GlobalTensor, LocalTensor
//   ascendc_tpipe.h      TPipe, TQue/TQueBind, TBuf (UB carving, queues and their events)
//   ascendc_data_copy.h  DataCopy, DataCopyPad, SetAtomic*
//   ascendc_vec_arith.h  Add, Sub, Mul, Div, Max, Min, Adds, Muls, Maxs, Mins, Duplicate
//   ascendc_cast.h       Cast
//   ascendc_sync.h       SetFlag/WaitFlag, PipeBarrier, SyncAll, DataCacheCleanAndInvalid
#ifndef STRATA_CPU_KERNEL_OPERATOR_H
#define STRATA_CPU_KERNEL_OPERATOR_H

#include "ascendc_types.h"
#include "ascendc_tensor.h"
#include "ascendc_tpipe.h"
#include "ascendc_data_copy.h"
#include "ascendc_vec_arith.h"
#include "ascendc_cast.h"
#include "ascendc_sync.h"

#endif  // STRATA_CPU_KERNEL_OPERATOR_H
