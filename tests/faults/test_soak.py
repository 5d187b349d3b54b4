"""A bounded soak (slow tier, well under 90 s here): thousands of back-to-back calls on 4 ranks
alternating AllReduce and AllGather, five sizes and four dtypes, every result checked; no growth in
resident memory or open file descriptors from after the warm-up to the end."""

from __future__ import annotations

import json

import pytest
from faultkit import leftover_segments

CALLS = 12000
RSS_SLACK = 4 << 20    # bytes a rank's RSS may grow over the measured calls (allocator noise)


@pytest.mark.slow
def test_soak_4_ranks_thousands_of_calls(ranks):
    job = ranks("soak", 4, timeout=60, arg=str(CALLS))
    job.wait(limit=600)
    stats = []
    for r, rk in enumerate(job.ranks):
        assert rk.proc.returncode == 0, (rk.out, rk.err)
        assert rk.first("PASS soak") is not None
        s = json.loads(rk.first("STATS soak"))
        stats.append(s)
        assert s["calls"] == CALLS
        assert s["rss_end"] - s["rss_start"] <= RSS_SLACK, s
        assert s["fds_end"] == s["fds_start"], s
    print("soak:", json.dumps(stats))
    names = job.segments()
    assert len(names) == 1, names
    assert leftover_segments(names) == set()
