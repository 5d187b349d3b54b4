"""The MoE comparison tool (stratac.tools.bench.moe_vs_torch) on a small workload: both the stratac
schedules and the torch all_to_all_single version give every rank the exact combined tokens
(MoeWorkload.combined), and both are timed."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_moe_vs_torch_checks_both_results_and_times_both():
    p = subprocess.run([sys.executable, "-m", "stratac.tools.bench.moe_vs_torch", "--world", "2", "--tokens", "12",
                        "--hidden", "64", "--topk", "3", "--iters", "2", "--warmup", "0"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "world 2, 12 tokens x 64 bf16, top-3, 8 experts, uniform" in p.stdout
    times = re.findall(r"(\d+\.\d) us  \(ranks wrong: (\d+)\)", p.stdout)
    assert len(times) == 2 and all(float(t) > 0 and w == "0" for t, w in times), p.stdout
