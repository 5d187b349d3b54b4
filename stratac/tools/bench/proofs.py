"""What proving the instances of a sweep costs: every (schedule, sizes, rank parameters) a sweep's
calls make is proven here, before the ranks start, as a call's first use of an instance would
prove it (stratac.host.instance). The ranks then find the verdicts cached and the timed calls do
not include them; the report's header says what the proofs cost (report.proofs_note)."""

from __future__ import annotations

import time

from stratac import ir
from stratac.host import instance
from stratac.host.errors import StrataUsageError
from stratac.tools.bench.benchspec import BenchError


def prove(world: int, instances: list[tuple[ir.Schedule, dict[str, int]]]) -> dict:
    """Proves each distinct instance; the count, the wall time, the costliest proof and how many
    were already cached."""
    seen, cached, worst = set(), 0, 0.0
    t0 = time.perf_counter()
    for s, params in instances:
        key = (s.name, tuple(sorted(params.items())))
        if key in seen:
            continue
        seen.add(key)
        try:
            v = instance.check(s, world, params)
        except StrataUsageError as exc:   # every rank's call would refuse it
            raise BenchError(str(exc)) from None
        cached += v.cached
        worst = max(worst, v.seconds)
    return {"instances": len(seen), "cached": cached, "seconds": time.perf_counter() - t0,
            "max_seconds": worst}

