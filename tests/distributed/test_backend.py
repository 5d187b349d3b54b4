"""The torch.distributed backend "stratac" on real rank processes (a FileStore, shared memory)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_ranks(scenario, world, tmp_path, env=None) -> list[dict]:
    """Runs scenario on world rank processes; each rank's backend stats."""
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(HERE / "ranks.py"), scenario, str(r), str(world), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **(env or {})}) for r in range(world)]
    outs = [p.communicate(timeout=600) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}: {err[-3000:]}"
        assert f"PASS {scenario}" in out, out
    return [json.loads(next(ln for ln in out.splitlines() if ln.startswith("STATS "))[6:]) for out, _ in outs]


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_against_torch(world, tmp_path):
    stats = run_ranks("collectives", world, tmp_path)
    for st in stats:
        # float32/16, bfloat16: 3 sizes x SUM, AVG, MAX, MIN; int32: no AVG; complex64 arrives as
        # its float32 view (torch's view_as_real) for SUM and AVG: 36 + 9 + 6
        assert st["kernels"]["all_reduce"] == 51
        # 8 dtypes x 3 sizes x (all_to_all_single, all_to_all) + 3 x (single, list) with splits
        assert st["kernels"]["all_to_all"] == 8 * 3 * 2 + 3 * 2
        # what falls back is what no kernel computes: PRODUCT, or a reduction in another dtype
        assert any("PRODUCT" in k for k in st["fallback"])
        for k in st["fallback"]:
            assert "PRODUCT" in k or k.split(":")[0].split()[1] in ("int64", "uint8", "float64"), k


@pytest.mark.parametrize("scenario", ["subgroups", "zero_copy", "bad_input", "user_schedule", "unwaited",
                                      "explicit_store"])
def test_scenario(scenario, tmp_path):
    run_ranks(scenario, 3, tmp_path)


def test_fallback_error_names_the_op(tmp_path):
    run_ranks("fallback_error", 2, tmp_path, env={"STRATAC_FALLBACK": "error"})


def test_a_rank_that_does_not_call_is_named(tmp_path):
    run_ranks("unequal_calls", 2, tmp_path)


NPU_INIT = """
import tempfile, torch.distributed as dist, stratac.distributed as sd
from stratac.diagnostics import StrataError
from stratac.host.errors import StrataUsageError
for opts in (sd.Options(target="npu"), "fast"):
    try:
        dist.init_process_group("stratac", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1,
                                pg_options=opts)
    except (StrataError, StrataUsageError) as exc:
        print("REFUSED", type(exc).__name__, str(exc).splitlines()[0])
    else:
        print("ACCEPTED")
"""


def test_npu_target_is_refused_at_init_naming_what_is_missing():
    p = subprocess.run([sys.executable, "-c", NPU_INIT], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "SHMEM_HOME")})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("REFUSED", "ACCEPTED"))]
    assert lines[0].startswith("REFUSED StrataError") and "the npu target cannot run here" in lines[0], p.stdout
    assert "ASCEND_HOME_PATH is not set" in lines[0] and "torch_npu" in lines[0]
    assert lines[1] == "REFUSED StrataUsageError stratac backend: pg_options must be stratac.distributed.Options, got str"


def test_the_overhead_example_runs_and_reports_every_variant():
    """examples/python/backend_overhead.py (a benchmark: its figures are not asserted)."""
    root = HERE.parents[1]
    p = subprocess.run([sys.executable, str(root / "examples" / "python" / "backend_overhead.py"), "--rounds", "30"],
                       capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr[-3000:]
    for name in ("direct", "ProcessGroup", "dist.all_reduce", "null backend"):
        assert f"  {name} " in p.stdout, p.stdout
