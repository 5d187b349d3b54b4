"""`stratac bench --moe` (stratac.tools.bench.serving): the serving-shaped MoE sweep runs both
versions (stratac's schedules, torch's all_to_all_single) on the decode and prefill schedules,
checks every rank's combined tokens exactly against MoeWorkload.combined, and prints a row per
case with the shrink factor in the header. Never timing: the figures are only checked to exist."""

import subprocess
import sys
from pathlib import Path

import pytest

from stratac.tools.bench import moe_vs_torch, serving
from stratac.tools.bench.benchspec import BenchError

ROOT = Path(__file__).resolve().parents[2]


def test_serving_sweep_runs_decode_and_prefill_against_torch():
    lines, status = serving.run(serving.Serving(world=2, iters=1, warmup=0, decode_tokens=[1, 8],
                                                prefill_tokens=64), echo=lambda line: None)
    assert status == 0, lines
    assert "hidden 7168" in lines[0] and "shrunk" in lines[0] and "256 experts" in lines[0]
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert [(r[0], int(r[1])) for r in rows] == [("decode", 1), ("decode", 8), ("prefill", 64)]
    for r in rows:
        # routed rows: tokens x top-8 x 2 ranks (uniform routing picks 8 distinct experts a token)
        assert int(r[2]) == int(r[1]) * 8 * 2
        assert all(float(v) > 0 for v in (r[4], r[5], r[6], r[8], r[9])) and r[-1] == "0", r


def test_shrink_factor_fits_the_heaps_in_the_budget():
    cases = [{"tokens": 4096, "slotted": False}, {"tokens": 256, "slotted": True}]
    f = serving.shrink_factor(4, 256, cases, 1 << 30)
    assert f & (f - 1) == 0
    assert 4 * moe_vs_torch.heap_bytes(cases, 4, 7168 // f, 8, 256) <= 1 << 30
    assert f == 1 or 4 * moe_vs_torch.heap_bytes(cases, 4, 7168 // (f // 2), 8, 256) > 1 << 30


def test_moe_usage_errors():
    with pytest.raises(BenchError, match="--world must be at least 2"):
        serving.run(serving.Serving(world=1), echo=lambda line: None)
    for args, said in ((["examples/moe_decode.strata", "--moe", "--world", "2"], "it takes no FILE"),
                       (["--moe", "--world", "2", "--hidden", "64"], "--hidden do not apply"),
                       (["--moe"], "needs --world")):
        p = subprocess.run([sys.executable, "-m", "stratac", "bench", *args], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
