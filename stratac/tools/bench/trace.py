"""--trace: the ranks' spans of one recorded call per schedule and size, merged into one Chrome
trace.

In: the trace directory the ranks wrote (rank<r>.jsonl, from benchpeer.traced_call) and the
BenchSpec. Out: spec.trace, a Chrome/Perfetto JSON file, and {"path", "events"} for the meta.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from stratac.lang.frontend import load_source
from stratac.tools.bench import benchpeer
from stratac.tools.bench.benchspec import BenchSpec


def write_trace(trace_dir: Path, spec: BenchSpec) -> dict:
    """Merges the ranks' spans into one Chrome trace (chrome://tracing, ui.perfetto.dev): a
    process per rank; a track per vector core (kernel, stages named by their .strata line, flag
    waits, SyncAll, SDMA quiets), one per SDMA queue (copies), one for the whole call."""
    lines = load_source(spec.file).text.splitlines()
    events = []
    for path in sorted(trace_dir.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    t0 = min((e["ts"] for e in events), default=0.0)
    tracks: set[tuple[int, int]] = set()
    for e in events:
        e["ts"] = round(e["ts"] - t0, 3)
        tracks.add((e["pid"], e["tid"]))
        m = re.fullmatch(r"strata:(\d+)", e["name"])
        if m:
            n = int(m.group(1))
            text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
            e["name"] = f"L{n}: {text}" if text else e["name"]
    meta_events = []
    for pid in sorted({p for p, _ in tracks}):
        meta_events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {pid}"}})
        meta_events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    for pid, tid in sorted(tracks):
        if tid == benchpeer.HOST_TID:
            name, order = "call (host)", -1
        elif tid >= 1000:
            name, order = f"sdma queue {tid - 1000}", 2 * (tid - 1000) + 1
        else:
            name, order = f"core {tid}", 2 * tid
        meta_events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        meta_events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                            "args": {"sort_index": order}})
    Path(spec.trace).write_text(json.dumps(
        {"traceEvents": meta_events + events, "displayTimeUnit": "ms",
         "otherData": {"stratac": "bench --trace: one call per schedule and size, CPU model",
                       "file": str(spec.file), "world": spec.world}}) + "\n")
    return {"path": str(spec.trace), "events": len(events)}
