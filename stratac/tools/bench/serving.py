"""`stratac bench --moe`: MoE dispatch and combine at the shapes a serving stack runs them, against
a torch.distributed `all_to_all_single` implementation of the same operation, in one run.

The shapes are DeepSeek-V3's (hidden 7168, top-8 of 256 routed experts): decode batches of 1 to 256
tokens per rank on the low-latency schedules (examples/moe_decode.strata, slots of `tokens` rows
per expert and source rank) and a prefill batch of 4096 tokens per rank on the bounded packed
schedules (examples/moe_prefill_bounded.strata). A CPU-model rank cannot hold the prefill window at
hidden 7168 on a small machine, so hidden is divided by a power of two, the shrink factor, chosen
so that every rank's heap fits in a quarter of MemAvailable (at most 2 GiB in all); the table says
the factor. Tokens, top-k and experts are kept (experts are rounded down to a multiple of the
world, said in the header when that happens).

Both versions run in the same rank processes, case after case, each call after a host barrier
(stratac.tools.bench.moe_vs_torch): stratac's dispatch, the stand-in expert step, combine; torch's
sort by destination, row counts, all_to_all_single of rows and ids, the expert step, the rows back,
index_add_. Each rank's combined tokens are checked against MoeWorkload.combined (exact) for both.
Times are the median over the timed calls of each call's slowest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratac.resources import resource_path
from stratac.tools.bench import machine, moe_vs_torch
from stratac.tools.bench.benchspec import BenchError

HIDDEN, TOPK, EXPERTS = 7168, 8, 256           # DeepSeek-V3's MoE layer
DECODE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PREFILL_TOKENS = 4096
DECODE, PREFILL = "moe_decode.strata", "moe_prefill_bounded.strata"
HEAP_BUDGET = 2 << 30                          # all ranks' heaps together, at most


@dataclass
class Serving:
    world: int
    iters: int = 5
    warmup: int = 1
    seed: int = 0
    decode_tokens: list[int] | None = None     # default DECODE_TOKENS
    prefill_tokens: int | None = PREFILL_TOKENS   # None: no prefill case


def shrink_factor(world: int, experts: int, cases: list[dict], budget: int) -> int:
    """The smallest power of two f such that `world` heaps of the largest case at hidden
    HIDDEN / f fit in `budget` bytes."""
    f = 1
    while f < HIDDEN // 16 and world * moe_vs_torch.heap_bytes(cases, world, HIDDEN // f, TOPK, experts) > budget:
        f *= 2
    return f


def run(sv: Serving, echo=print) -> tuple[list[str], int]:
    """The table's lines and the exit status (0: every case ran and both versions were exact)."""
    if sv.world < 2:
        raise BenchError(f"--moe compares exchanges between ranks: --world must be at least 2, got {sv.world}")
    experts = EXPERTS // sv.world * sv.world
    decode = resource_path("examples", DECODE)
    prefill = resource_path("examples", PREFILL)
    cases = [{"file": str(decode), "tokens": t, "slotted": True} for t in (sv.decode_tokens or DECODE_TOKENS)]
    if sv.prefill_tokens:
        cases.append({"file": str(prefill), "tokens": sv.prefill_tokens, "slotted": False})
    avail = machine.mem_available()
    budget = min(HEAP_BUDGET, avail // 4) if avail else HEAP_BUDGET
    f = shrink_factor(sv.world, experts, cases, budget)
    hidden = HIDDEN // f
    echo(f"# stratac bench --moe: {len(cases)} cases at world {sv.world}, hidden {hidden}")
    res = moe_vs_torch.measure(cases, sv.world, hidden, TOPK, experts, "uniform", "bf16", sv.iters,
                               sv.warmup, sv.seed)
    if res is None:
        raise BenchError("stratac bench --moe: a rank failed (its error is above)")
    lines = [
        f"# MoE at serving shapes, world {sv.world}: DeepSeek-V3's layer (hidden {HIDDEN}, top-{TOPK}, "
        f"{EXPERTS} experts) with hidden shrunk {f}x to {hidden} so that {sv.world} ranks' heaps fit in "
        f"{budget / 2**30:.1f} GiB" + (f"; experts rounded to {experts}, a multiple of the world" if experts != EXPERTS else ""),
        "# bf16 tokens, uniform routing; decode: examples/moe_decode.strata (slots of `tokens` rows per "
        "expert and source); prefill: examples/moe_prefill_bounded.strata (packed window)",
        "# time: median over the timed calls of each call's slowest rank (us); op = dispatch + the "
        "stand-in expert step + combine; torch: the same operation with all_to_all_single on gloo; "
        "x torch: torch's op time over stratac's; #wrong: ranks whose combined tokens were not exact",
        "# rows: the routed (token, expert) rows of the case, all ranks together",
        f"# {'phase':8s} {'tokens':>6s} {'rows':>8s} | {'dispatch':>10s} {'combine':>10s} {'op':>10s} | "
        f"{'torch op':>10s} {'x torch':>8s} | #wrong",
    ]
    bad = 0
    for case, r in zip(cases, res):
        s, t, w = r["stratac"], r["torch"], r["workload"]
        wrong = max(s["ranks_wrong"], t["ranks_wrong"])
        bad |= wrong
        lines.append(f"  {'decode' if case['slotted'] else 'prefill':8s} {w['tokens']:6d} {w['received_rows']:8d} | "
                     f"{s['dispatch_us']:10.1f} {s['combine_us']:10.1f} {s['median_us']:10.1f} | "
                     f"{t['median_us']:10.1f} {t['median_us'] / s['median_us']:8.2f} | {wrong}")
    return lines, 1 if bad else 0
