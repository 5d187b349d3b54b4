"""PyTorch's DistributedTest collective tests for backend "stratac" (torch_suite.py), at worlds 2
and 3: every selected test passes, or is skipped by the suite itself with the reason it prints.

The collective set is every test of DistributedTest._DistTestBase named test_all_reduce*,
test_all_gather*, test_reduce_scatter*, test_all_to_all*, test_broadcast*, test_reduce* or
test_barrier*: 103 in torch 2.13, of which the suite runs 32 for a CPU plugin backend and skips the
rest (CUDA, MPI- or gloo-only, world size below 8). The fast tier runs a bounded selection at world
2; the whole set at both worlds is `slow`. The counts per world are in docs/api.md; to see them:

    BACKEND=stratac WORLD_SIZE=3 python -m pytest -rs tests/distributed/torch_suite.py -k "$COLLECTIVES"
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
COLLECTIVES = ("test_all_reduce or test_all_gather or test_reduce_scatter or test_all_to_all or "
               "test_broadcast or test_reduce or test_barrier")
BOUNDED = ("test_all_reduce_sum or test_all_reduce_max or test_all_gather or test_broadcast or "
           "test_reduce_sum or test_barrier")


def run_suite(world: int, selection: str, tmp_path) -> dict:
    """Runs the suite's tests matching `selection` at `world`; {outcome: [(name, reason)]}."""
    report = tmp_path / f"suite-{world}.xml"
    env = {**os.environ, "BACKEND": "stratac", "WORLD_SIZE": str(world)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           f"--junitxml={report}", str(HERE / "torch_suite.py"), "-k", selection],
                          capture_output=True, text=True, env=env, timeout=1500, cwd=HERE)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    out: dict = {"passed": [], "skipped": [], "failed": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            out["failed"].append((name, (bad.get("message") or "")[:300]))
        elif skip is not None:
            out["skipped"].append((name, skip.get("message") or ""))
        else:
            out["passed"].append((name, ""))
    assert not out["failed"], out["failed"]
    assert proc.returncode == 0, proc.stdout[-3000:]
    for name, reason in out["skipped"]:      # skipped by the suite, never silently
        assert reason.strip(), f"{name} was skipped without a reason"
    return out


def test_bounded_selection_world_2(tmp_path):
    out = run_suite(2, BOUNDED, tmp_path)
    names = {n for n, _ in out["passed"]}
    for must in ("test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max", "test_all_gather",
                 "test_broadcast", "test_reduce_sum", "test_barrier", "test_all_gather_full_group"):
        assert must in names, (must, out)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_test(world, tmp_path):
    out = run_suite(world, COLLECTIVES, tmp_path)
    counts = {k: len(v) for k, v in out.items()}
    # torch 2.13: 32 of the 103 run for a CPU plugin backend; a newer torch may run more, never fewer
    assert counts["passed"] >= 32, counts
    assert counts["passed"] + counts["skipped"] >= 103, counts
