"""The output of `stratac simulate`. In: a SimResult. Out: the text table (header lines that say
these are model predictions, one block per schedule) and the JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path

from stratac.tools.simulate.results import Prediction, SimResult


def _ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def header(res: SimResult) -> list[str]:
    m, f = res.meta, res.meta["figures"]
    r = f["rank"]
    unit = "die" if f["machine"]["dies_per_npu"] > 1 else "NPU"   # what one rank of the file is
    lines = [
        f"# stratac simulate {m['file']}  world {m['world']}  dtype {m['dtype']}  cores {m['cores']}  "
        f"machine {m['machine_file']}",
        f"# MODEL PREDICTIONS, NOT MEASUREMENTS: an analytic model (docs/bench.md) of {m['machine']} "
        f"as {m['machine_file']} describes it; one rank = one {unit}: {r['vector_cores']} vector cores, "
        f"UB {r['fabric_gbps']:g} GB/s per direction, HBM {r['hbm_gbps']:g} GB/s; the figures the "
        "file marks `assumption` are guesses",
    ]
    if any(p.moe is None for p in res.predictions) or not res.predictions:
        lines.append(
            "# time: predicted per call, launch to the last rank's exit; algbw = size/time, busbw = algbw x "
            "factor (GB/s, nccl-tests); bound: the largest share of the critical path (fabric, hbm, aiv, "
            "sdma, latency); ratio: busbw / busbw of the first schedule of the same contract at that size")
    if "moe" in m:
        from stratac.verify.routing import DESCRIPTIONS
        x = m["moe"]
        kinds = {p.kind for p in res.predictions if p.moe is not None}
        what = []
        if kinds - {"alltoallv"}:
            what.append(f"MoE: hidden {x['hidden']}, topk {x['topk']}, experts {x['experts']} "
                        f"({x['experts'] // m['world']} per rank)"
                        + (f", max_recv {x['max_recv']} rows" if x.get("max_recv") else ""))
        if "alltoallv" in kinds:
            what.append(f"AllToAllV: rows of {x['hidden']} elements, one destination rank each")
        lines += [
            f"# {'; '.join(what)}; routing {x['routing']} ({DESCRIPTIONS[x['routing']]}, seed "
            f"{x['seed']}); tokens (rows) per rank swept. Defaults DeepSeek-V3-like (tools/simulate/moe.py)",
            "# MoE time: predicted per call on that sample routing, launch to the last rank's exit; received: "
            "bytes a rank receives in dispatch (combine: reads back), mean over ranks (DeepEP's count); "
            "GB/s = received / time; bound: the largest share of the critical path (fabric, hbm, aiv, "
            "sdma, latency, scalar); ratio: GB/s / GB/s of the first schedule of the same contract at "
            "that token count (below 1: predicted slower); heap: every buffer of one rank",
            f"# MoE routing metadata (histogram, exscan, slots, id scans) runs on the scalar unit at an "
            f"ASSUMED {x['assumptions']['scalar_call_us']:g} us per call + "
            f"{x['assumptions']['scalar_element_us'] * 1e3:g} ns per id, count or offset",
        ]
    return lines


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def table(res: SimResult) -> list[str]:
    lines = header(res)
    by_sched: dict[str, list[Prediction]] = {}
    for p in res.predictions:
        by_sched.setdefault(p.schedule, []).append(p)
    for name, preds in by_sched.items():
        p0 = preds[0]
        ratio = any(p.ratio_to for p in preds)
        lines.append("#")
        lines.append(f"# {name}: {p0.kind}, world {p0.world}"
                     + (f"  (ratio against {p0.ratio_to})" if ratio else ""))
        if p0.moe is not None:
            head = (f"# {'tokens':>8} {'received':>12} {'rows/rank':>10} {'type':>5} {'time(us)':>11} "
                    f"{'GB/s':>8} {'bound':>8} {'heap/rank':>10}")
        else:
            head = (f"# {'size':>10} {'count':>11} {'type':>5} {'time(us)':>11} {'algbw':>8} {'busbw':>8} "
                    f"{'bound':>8}")
        lines.append(head + (f" {'ratio':>8}" if ratio else ""))
        for p in preds:
            if p.moe is not None:
                row = (f"  {p.count:>8} {p.size:>12} {p.moe['received_rows']:>10.1f} {p.dtype:>5} "
                       f"{p.time_us:>11.2f} {p.algbw:>8.3f} {p.bound:>8} "
                       f"{_fmt_bytes(p.moe['heap_bytes']):>10}")
            else:
                row = (f"  {p.size:>10} {p.count:>11} {p.dtype:>5} {p.time_us:>11.2f} {p.algbw:>8.3f} "
                       f"{p.busbw:>8.3f} {p.bound:>8}")
            lines.append(row + (f" {_ratio(p.ratio):>8}" if ratio else ""))
    for s in res.skipped:
        lines.append(f"# {s['schedule']}: skipped: {s['why']}")
    return lines


def to_json(res: SimResult) -> dict:
    return {"meta": res.meta,
            "results": [{k: v for k, v in p.__dict__.items() if k != "moe" or v is not None}
                        for p in res.predictions],
            "skipped": res.skipped}


def write_json(res: SimResult, path: str) -> None:
    Path(path).write_text(json.dumps(to_json(res), indent=1) + "\n", encoding="utf-8")
