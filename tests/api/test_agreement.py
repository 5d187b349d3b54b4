"""Ranks that make different calls (issue 23): before any rank writes to another, the ranks compare
their calls (strata::Agree). Each kind of difference (a size, the dtype, the op, a rank parameter,
the order of schedules, the kernel's build, one rank of three) raises a StrataUsageError on every
rank naming every rank's call, and nothing is written: a sentinel heap tensor and the call's own
buffers keep their values on every rank (agree_ranks.py), and the communicator then runs an
agreeing call right. A rank that never makes the call is named by its peer's wait at the deadline."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run_ranks(scenario: str, world: int, tmp_path: Path) -> None:
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(HERE / "agree_ranks.py"), scenario, str(r), str(world),
                               str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ)) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"PASS {scenario}" in out, f"rank {r}:\n{out}\n{err[-3000:]}"


@pytest.mark.parametrize("scenario", ["sizes", "sizes_1000_1024", "dtypes", "ops", "roots", "order",
                                      "builds"])
def test_ranks_that_call_differently_are_refused_on_every_rank_before_any_write(scenario, tmp_path):
    run_ranks(scenario, 2, tmp_path)


def test_one_rank_of_three_calling_differently(tmp_path):
    run_ranks("three_ranks", 3, tmp_path)


def test_a_rank_that_never_calls_is_named_at_the_deadline(tmp_path):
    run_ranks("absent", 2, tmp_path)


def test_a_rank_that_another_masks_learns_the_difference_at_its_deadline(tmp_path):
    run_ranks("masks", 3, tmp_path)
