"""The tables of docs/bench.md "Textbook algorithms against the direct schedules".

In: the JSON files of `stratac simulate --json` and `stratac bench --json` runs of the files that
hold a textbook schedule next to its direct counterparts. Out: Markdown tables, one per contract,
each schedule's time per size with its ratio to the DIRECT schedule of the same contract, world
and run (the same convention as both tools' ratio column: direct time / this time, above 1 means
faster than the direct schedule). Nothing is measured or predicted here; the figures are the
files'.

    python -m stratac.tools.bench.textbook sim sim_ar_w16.json sim_ar_w64.json ...
    python -m stratac.tools.bench.textbook bench bench_ar_w4.json ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from stratac.tools.bench.report import fmt_bytes, fmt_ratio

# contract -> (the direct schedule the ratios are to, the other direct ones, the textbook ones)
PAIRS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "allreduce": ("allreduce_twoshot", ("allreduce_oneshot",),
                  ("allreduce_ring", "allreduce_halving_doubling", "allreduce_double_tree",
                   "allreduce_hierarchical")),      # hierarchical: another helper's, over teams
    "reducescatter": ("reducescatter", (), ("reducescatter_ring",)),
    "allgather": ("allgather_push", ("allgather_pull",), ("allgather_ring_pipelined",)),
    "broadcast": ("broadcast", (), ("broadcast_tree",)),
    "alltoall": ("alltoall", (), ("alltoall_bruck",)),
}


def _load(paths: list[str]) -> list[tuple[dict, dict]]:
    """(meta, data) of each file; ValueError naming the file when it is not a run's JSON."""
    out = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text(encoding="utf-8"))
            ok = isinstance(data.get("results"), list) and isinstance(data.get("meta", {}).get("world"), int)
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{p}: {exc}") from None
        if not ok:
            raise ValueError(f"{p}: not the JSON of a `stratac simulate --json` or `stratac bench --json` "
                             "run (it needs meta.world and results)")
        out.append((data["meta"], data))
    return out


def _nominal(size: int) -> int:
    """The power of two nearest to a size: a contract whose S is world blocks of whole elements
    rounds 4 KiB down to 3 KiB at world 384 (--sizes), and the column is still the 4 KiB one."""
    return 1 << max(0, round(math.log2(max(size, 1))))


def _cell(t: float | None, ref: float | None, bound: str | None = None) -> str:
    if t is None:
        return "-"
    ratio = fmt_ratio(ref / t) if ref else "n/a"
    return f"{t:,.1f} ({ratio}{', ' + bound if bound else ''})"


def sim_tables(paths: list[str]) -> list[str]:
    """One table per contract: a row per world and schedule, a column per size: predicted us,
    (ratio to the direct schedule, the bound)."""
    runs = _load(paths)
    lines: list[str] = []
    for kind, (direct, others, textbook) in PAIRS.items():
        rows, sizes = [], set()
        for meta, data in runs:
            res = [r for r in data["results"] if r["kind"] == kind]
            if not res:
                continue
            world = meta["world"]
            at = {(r["schedule"], _nominal(r["size"])): r for r in res}
            sizes |= {_nominal(r["size"]) for r in res}
            skipped = {s["schedule"]: s["why"] for s in data.get("skipped", [])}
            for name in (direct, *others, *textbook):
                got = [r for r in res if r["schedule"] == name]
                if got or name in skipped or name in textbook:
                    rows.append((world, name, at, skipped.get(name)))
        if not rows:
            continue
        sizes = sorted(sizes)
        lines.append(f"#### {kind}: predicted us per call (x {direct}, bound)")
        rounded = sorted({(r["size"], meta["world"]) for meta, data in runs for r in data["results"]
                          if r["kind"] == kind and r["size"] != _nominal(r["size"])})
        if rounded:
            lines.append("")
            lines.append("S rounded down to whole blocks of the world: " + ", ".join(
                f"{fmt_bytes(_nominal(sz))} is {sz} B at world {w}" for sz, w in rounded))
        lines.append("")
        lines.append("| world | schedule | " + " | ".join(fmt_bytes(s) for s in sizes) + " |")
        lines.append("|---:|---|" + "---:|" * len(sizes))
        for world, name, at, why in rows:
            if why is not None or not any((name, s) in at for s in sizes):
                note = f"skipped: {why.split(',')[0]}" if why else "not in this run"
                lines.append(f"| {world} | {name} | " + " | ".join([note] + ["-"] * (len(sizes) - 1)) + " |")
                continue
            cells = []
            for s in sizes:
                r, ref = at.get((name, s)), at.get((direct, s))
                cells.append(_cell(r and r["time_us"], ref and ref["time_us"], r and r["bound"]))
            lines.append(f"| {world} | {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def bench_tables(paths: list[str]) -> list[str]:
    """One table per run: a row per schedule, a column per size: measured median us (ratio to the
    direct schedule measured in the same run)."""
    lines: list[str] = []
    for meta, data in _load(paths):
        res = [r for r in data["results"] if r["system"] == "stratac"]
        if not res:
            continue
        kind = res[0]["kind"]
        direct = PAIRS[kind][0] if kind in PAIRS else res[0]["schedule"]
        at = {(r["schedule"], _nominal(r["size"])): r for r in res}
        sizes = sorted({_nominal(r["size"]) for r in res})
        names = list(dict.fromkeys(r["schedule"] for r in res))
        load = (meta.get("loadavg_before"), meta.get("loadavg_after"))
        lines.append(f"#### {kind}, world {meta['world']}: measured us per call (x {direct}, same run)"
                     + (f"; load average {load[0]:.1f} before, {load[1]:.1f} after" if None not in load
                        else ""))
        lines.append("")
        lines.append("| schedule | " + " | ".join(fmt_bytes(s) for s in sizes) + " | #wrong |")
        lines.append("|---|" + "---:|" * (len(sizes) + 1))
        for name in names:
            cells = []
            for s in sizes:
                r, ref = at.get((name, s)), at.get((direct, s))
                cells.append(_cell(r and r["time_us"], ref and ref["time_us"]))
            wrong = sum(at[(name, s)]["errors"] or 0 for s in sizes if (name, s) in at)
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {wrong} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stratac.tools.bench.textbook",
                                 description="Markdown tables of textbook vs direct schedules")
    ap.add_argument("what", choices=("sim", "bench"))
    ap.add_argument("json", nargs="+")
    a = ap.parse_args(argv)
    try:
        lines = sim_tables(a.json) if a.what == "sim" else bench_tables(a.json)
    except ValueError as exc:
        print(f"textbook: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
