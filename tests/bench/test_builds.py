"""The build-cost bench (stratac.tools.bench.builds) prints a row per schedule and the totals."""

from __future__ import annotations

import os
from pathlib import Path

from stratac.tools.bench import builds

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_bench_times_each_entry_set_in_an_empty_cache_of_its_own(capsys):
    before = os.environ.get("STRATAC_CACHE_DIR")
    assert builds.main([str(ROOT / "examples" / "allgather_push.strata")]) == 0
    assert os.environ.get("STRATAC_CACHE_DIR") == before        # the caller's cache is left as it was
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["schedule", "entries", "all", "one", "three"]
    name, entries, *secs = lines[1].split()
    assert (name, entries) == ("allgather_push", "4") and all(float(s) > 0 for s in secs)
    assert lines[2].startswith("total") and "all/one" in lines[2] and "all/three" in lines[2]
