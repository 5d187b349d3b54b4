"""stratac.deep_ep, DeepEP's Buffer on stratac's schedules, checked as DeepEP's own tests check
DeepEP (deep_ep_ranks.py), at worlds 2 and 4, in both modes, bf16 and int8."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_ranks(mode, world, tmp_path, *extra):
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(HERE / "deep_ep_ranks.py"), mode, str(r), str(world), str(store),
                               *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ)) for r in range(world)]
    outs = [p.communicate(timeout=900) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}: {err[-3000:]}"
        assert f"PASS {mode}" in out


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_normal_mode(world, dtype, tmp_path):
    run_ranks("normal", world, tmp_path, dtype)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_low_latency_mode(world, dtype, tmp_path):
    run_ranks("low_latency", world, tmp_path, dtype)
