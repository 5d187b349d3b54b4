"""How many vector cores a launch uses: it follows the bytes the call moves.

In: a schedule's IR, the world, the call's sizes and element bytes, and the most cores the plan
allows (the SoC's vector cores, or `Options(cores=...)`). Out: the `blocks` the launcher passes to
the kernel. The kernels split every stage's bytes over GetBlockNum() cores
(runtime/device/strata_device.h, strata::Partition), so any count in [1, plan] is correct; this
decides which one is worth it. The same function serves the CPU launcher (stratac.host.schedule)
and the NPU launcher (stratac.host.npu_comm): a 4 KiB AllReduce does not wake 40 cores on either.

The rule: one core per BYTES_PER_CORE of the call's largest buffer on a rank (for MoE dispatch and
combine: the routed rows, tokens x hidden x topk), at least 1, at most the plan's cores. A core
added to a stage pays a SyncAll (and, on the CPU model, a thread wake-up); it is worth it when the
bytes it takes off the others take longer than that to move. From the machine description
(machines/cloudmatrix384.toml): a vector core reads GM -> UB at gm_to_ub_gbps = 57.6 GB/s
([CANN] ddr_read_rate) and a SyncAll costs sync_all_us = 1 us (an assumption there), so a core
should get at least 57.6 GB/s x 1 us = 57.6 KB: 64 KiB, rounded up to a power of two.

On the CPU model the cores are threads and fibres of the rank's process (runtime/cpu/src/fibers.cpp),
and every rank of the world runs on this host's CPUs: a core beyond the CPUs one rank has takes no
bytes off the others, it only adds fibre switches, wake-ups and a share of every SyncAll. So the CPU
launcher also caps the count at `host_cores(world)`, the CPUs this process may run on shared by the
world's ranks (at least 1). Measured on a 2-CPU host (docs/bench.md "Cores on the CPU model"): at 1
MiB, world 2, two-shot AllReduce takes 220 us on 1 core against 645 us on the 16 of the NPU rule
(1.4-4.2x at 1 MiB over the examples measured); only 64 MiB copies were faster on more cores
(0.82-0.97x the time: more SDMA engine threads copying at once), which the streamed SDMA copies of
runtime/cpu/src/sdma.cpp more than make up for. The NPU launcher keeps the NPU rule: the kernel is
the same and correct on any count in [1, plan], only the count differs.

A caller overrides it per call (`cores=N`, `stratac run/bench --cores N`).
"""

from __future__ import annotations

import os

from stratac import ir

GM_TO_UB_GBPS = 57.6    # machines/cloudmatrix384.toml [core] gm_to_ub_gbps
SYNC_ALL_US = 1.0       # machines/cloudmatrix384.toml [sync] sync_all_us
BYTES_PER_CORE = 1 << (int(GM_TO_UB_GBPS * 1e3 * SYNC_ALL_US) - 1).bit_length()   # 65536


def launch_bytes(s: ir.Schedule, world: int, sizes: dict[str, int], elem: int) -> int:
    """The bytes that set a call's parallelism: its largest buffer on one rank, or for MoE its
    routed rows (a window is sized for the worst routing, not for what a call moves)."""
    env = {"world": world, **sizes}
    c = s.contract
    if c.kind.moe:
        x = s.param(c.inputs[0] if c.kind.dispatch else c.outputs[0])   # the tokens
        ids = s.param(c.inputs[1])
        topk = ids.dims[1].eval(env) if len(ids.dims) > 1 else 1
        return int(x.size.eval(env)) * elem * max(int(topk), 1)
    return max((int(p.size.eval(env)) * (p.dtype.nbytes if p.dtype else elem) for p in s.tensors),
               default=0)


def cores_for_bytes(nbytes: int, limit: int, per_core: int = BYTES_PER_CORE) -> int:
    """One core per `per_core` bytes, at least 1, at most `limit`."""
    return max(1, min(limit, -(-nbytes // per_core)))


def host_cores(world: int) -> int:
    """The CPU model's cap: the CPUs this process may run on, shared by the world's ranks."""
    return max(1, len(os.sched_getaffinity(0)) // max(int(world), 1))


def auto_cores(s: ir.Schedule, world: int, sizes: dict[str, int], elem: int, limit: int) -> int:
    return cores_for_bytes(launch_bytes(s, world, sizes, elem), limit)


def by_size(plan: int, world: int) -> str:
    """How a bench header names the CPU launcher's choice when no --cores is given."""
    cap = host_cores(world)
    return (f"by size (at most {min(plan, cap)}: the plan's {plan}"
            + (f", capped at the {cap} CPU{'s' if cap > 1 else ''} per rank)" if cap < plan else ")"))
