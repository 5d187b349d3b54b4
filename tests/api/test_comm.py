"""The Python API on real rank processes (torch.distributed bootstrap, shared memory)."""

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_ranks(scenario, world, tmp_path, mode="pg"):
    procs = [subprocess.Popen([sys.executable, str(HERE / "ranks.py"), scenario, str(r), str(world),
                               str(tmp_path / "store"), mode], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert f"PASS {scenario}" in out


@pytest.mark.parametrize("scenario", ["interleaved", "bad_input", "segment_gone", "closed",
                                      "moe_bad_input", "moe_interleaved"])
def test_scenario_process_group(scenario, tmp_path):
    run_ranks(scenario, 3, tmp_path)


def test_bootstrap_from_a_store(tmp_path):
    run_ranks("interleaved", 2, tmp_path, mode="store")
