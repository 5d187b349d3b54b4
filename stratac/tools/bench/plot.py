"""--plot: the sweep's figures as a PNG (matplotlib, the `bench` extra).

In: a BenchResult. Out: a PNG at the given path: busbw over size per system and schedule, with
the copy ceiling as a line, or for a MoE file algbw over tokens per pair, phase and routing.
"""

from __future__ import annotations

from pathlib import Path

from stratac.tools.bench.benchspec import BenchError, BenchResult


def plot(res: BenchResult, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install 'stratac[bench]'") from None
    matplotlib.use("Agg")
    if res.meta.get("moe"):
        return moe_plot(res, path)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines: dict[str, list] = {}
    for r in res.records:
        if r["busbw"] is None:
            continue
        label = f"stratac {r['schedule']}" if r["system"] == "stratac" else f"{r['system']} {r['schedule']}"
        if r.get("variant"):   # --vs backend: direct, zero-copy, staged
            label += f" ({r['variant']})"
        lines.setdefault(label, []).append((r["size"], r["busbw"]))
    for label, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                linestyle="-" if label.startswith("stratac") else "--", label=label)
    c = res.meta["copy_ceiling"]
    ax.axhline(c["gbps_1_thread"], color="grey", linewidth=0.8, linestyle=":",
               label=f"copy ceiling, 1 thread ({c['gbps_1_thread']:.1f} GB/s)")
    m = res.meta
    _finish_plot(fig, ax, path, "size S (bytes)", "busbw (GB/s)",
                 f"{Path(m['file']).name}: world {m['world']}, {m['dtype']}, CPU model ({m['cpus']} CPUs)")


def moe_plot(res: BenchResult, path: str) -> None:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines: dict[str, list] = {}
    for r in res.records:
        for phase, name, bw in (("dispatch", r["dispatch"], r["algbw"]),
                                ("combine", r["combine"], r["combine_algbw"])):
            if name and bw is not None:
                lines.setdefault(f"{name} {r['routing']}", []).append((r["tokens"], bw, phase))
    for label, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                linestyle="-" if pts[0][2] == "dispatch" else "--", label=label)
    m = res.meta
    _finish_plot(fig, ax, path, "tokens per rank", "algbw = received bytes per rank / time (GB/s)",
                 f"{Path(m['file']).name}: MoE, world {m['world']}, hidden {m['moe']['hidden']}, "
                 f"topk {m['moe']['topk']}, {m['moe']['experts']} experts, CPU model ({m['cpus']} CPUs)")


def _finish_plot(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> None:
    """Log-scaled x, labels, grid and legend; written as PNG and closed."""
    import matplotlib.pyplot as plt
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
