"""The number of vector cores a launch uses (stratac.host.cores), without ranks: one per 64 KiB of
the call's largest buffer (MoE: its routed rows), at least 1, at most the plan's cores; the figure
comes from the machine description."""

import os
from pathlib import Path

import pytest
import tomllib

from stratac.host import cores
from stratac.ir import passes
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]


def _schedule(name: str, index: int = 0):
    s = frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))[index]
    return passes.pipeline(s, passes.Options())


def test_bytes_per_core_is_the_machine_files_read_rate_times_a_syncall():
    m = tomllib.loads((ROOT / "machines" / "cloudmatrix384.toml").read_text())
    per_core = m["core"]["gm_to_ub_gbps"] * 1e3 * m["sync"]["sync_all_us"]   # bytes per SyncAll
    assert (cores.GM_TO_UB_GBPS, cores.SYNC_ALL_US) == (m["core"]["gm_to_ub_gbps"], m["sync"]["sync_all_us"])
    assert cores.BYTES_PER_CORE == 65536 and cores.BYTES_PER_CORE // 2 < per_core <= cores.BYTES_PER_CORE


@pytest.mark.parametrize("nbytes,limit,want", [(0, 40, 1), (1, 40, 1), (65536, 40, 1), (65537, 40, 2),
                                               (4 << 20, 40, 40), (64 << 20, 40, 40), (64 << 20, 7, 7),
                                               (256 << 10, 40, 4)])
def test_one_core_per_64_kib_at_least_one_at_most_the_limit(nbytes, limit, want):
    assert cores.cores_for_bytes(nbytes, limit) == want


def test_allreduce_allgather_and_moe_count_their_bytes():
    ar = _schedule("allreduce_twoshot")
    assert cores.launch_bytes(ar, 2, {"n": 1024}, 4) == 4096
    assert cores.auto_cores(ar, 2, {"n": 1024}, 4, ar.kernel.cores) == 1
    assert cores.auto_cores(ar, 2, {"n": 16 << 20}, 4, ar.kernel.cores) == ar.kernel.cores == 40
    ag = _schedule("allgather_push")    # out is n * world: the gathered buffer sets it
    assert cores.launch_bytes(ag, 4, {"n": 1024}, 2) == 1024 * 4 * 2
    disp = _schedule("moe_decode")      # 128 tokens x 7168 bf16, top-8: the routed rows
    sizes = {"tokens": 128, "hidden": 7168, "topk": 8, "experts": 16, "capacity": 128}
    sizes = {k: v for k, v in sizes.items() if k in disp.sizes}
    got = cores.launch_bytes(disp, 4, sizes, 2)
    assert got == 128 * 7168 * 2 * 8, (disp.sizes, got)


def test_the_cpu_model_caps_cores_at_the_cpus_each_rank_has():
    """Every rank runs on this host's CPUs: one rank has them all, a world as large as the CPUs (or
    larger) one each, never none; the bench header says which cap applied."""
    cpus = len(os.sched_getaffinity(0))
    assert cores.host_cores(1) == cpus
    assert cores.host_cores(cpus) == cores.host_cores(4 * cpus) == 1
    assert cores.host_cores(2) == max(1, cpus // 2)
    assert cores.by_size(40, 4 * cpus) == "by size (at most 1: the plan's 40, capped at the 1 CPU per rank)"
    assert cores.by_size(1, 1) == "by size (at most 1: the plan's 1)"
