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

A caller overrides it per call (`cores=N`, `stratac run/bench --cores N`).
"""

from __future__ import annotations

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


def auto_cores(s: ir.Schedule, world: int, sizes: dict[str, int], elem: int, limit: int) -> int:
    return cores_for_bytes(launch_bytes(s, world, sizes, elem), limit)
