"""The routing metadata a MoE dispatch or combine moves by DMA on each core, computed from the
routing and the splits independently of the kernel (tests/e2e/test_moe.py, tests/e2e/test_balance.py,
tests/bench/test_bench_moe.py)."""

from __future__ import annotations

ROUTE_CHUNK = 1024   # strata::kRouteChunk: ids staged in UB per DMA (runtime/device/strata_device.h)
STATUS_BYTES = 64    # the status line of a packed window's bound (strata::StatusLine)


def routing_dma(ids, experts: int, world: int, cores: int) -> list[tuple[int, int]]:
    """Per core (bytes GM->UB, bytes UB->GM) of a dispatch's routing metadata, which the Router
    moves by DMA (never by scalar GM access): histogram on core 0 (loads every id, stores the
    counts), exscan with the owners split over the cores (loads its owners' columns of every rank's
    counts, stores its owners' offsets), place (every core loads every id to count the routed
    entries; a core with rows to move also loads the offsets and the ids again, chunk by chunk, up
    to the chunk of its last row). The bound of the packed window: core 0 also loads the whole
    counts table and stores the status line; every core loads the status line before placing."""
    flat = [int(e) for e in ids.reshape(-1)]
    n, local = len(flat), experts // world
    routed_at = [i for i, e in enumerate(flat) if 0 <= e < experts]
    out = []
    for c in range(cores):
        span = (world * (c + 1) // cores - world * c // cores) * local
        load, store = world * span * 4 + n * 4, span * 4
        load += STATUS_BYTES
        if c == 0:
            load, store = load + n * 4 + world * experts * 4, store + experts * 4 + STATUS_BYTES
        lo, hi = len(routed_at) * c // cores, len(routed_at) * (c + 1) // cores
        if lo < hi:
            last_chunk = routed_at[hi - 1] // ROUTE_CHUNK
            load += experts * 4 + sum(min(ROUTE_CHUNK, n - k * ROUTE_CHUNK) * 4 for k in range(last_chunk + 1))
        out.append((load, store))
    return out


def combine_dma(tokens: int, topk: int, experts: int, world: int, cores: int) -> list[tuple[int, int]]:
    """Per core (bytes GM->UB, bytes UB->GM) of a combine's routing metadata: exscan (owners split
    over the cores) loads its owners' columns of every rank's counts and stores their offsets;
    gather (tokens split over the cores) loads the offsets, the earlier tokens' ids and its own
    tokens' ids and weights (int32/f32). The bound: core 0 loads the whole counts table and stores
    the status line; every core loads the status line before gathering."""
    def even(n):
        return [n * (c + 1) // cores - n * c // cores for c in range(cores)]
    local, owners, mine = experts // world, even(world), even(tokens)
    starts = [sum(mine[:c]) for c in range(cores)]
    return [(world * o * local * 4 + (experts * 4 + (s + 2 * t) * topk * 4 if t else 0) + STATUS_BYTES
             + (world * experts * 4 if c == 0 else 0), o * local * 4 + (STATUS_BYTES if c == 0 else 0))
            for c, (o, s, t) in enumerate(zip(owners, starts, mine))]
