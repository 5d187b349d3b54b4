"""The contract: what the collective must leave in every buffer, against the simulated values.

In: an instance and its simulated values after the call (`provenance`). Out: at most one
diagnostic: a routing construct that wrote outside its window, buffers of a shape the contract
cannot hold, or the first element that differs from what the contract says, naming what it holds
instead. Also, for MoE, the reference window layout (`moe_layout`), from the expert ids alone.
Reductions are held to exactly-once for max and min too (conservative: a schedule relying on
max(a, a) = a is rejected).
"""

from __future__ import annotations

import numpy as np

from stratac import ir
from stratac.diagnostics import Codes, Diagnostic, error
from stratac.ir.instantiate import Instance
from stratac.verify.provenance import Values
from stratac.verify.samples import context, live_entries
from stratac.verify.segments import Segs, mismatch


def check_contract(inst: Instance, vals: Values) -> list[Diagnostic]:
    s, W = inst.schedule, inst.world
    c = s.contract
    if vals.faults:
        return vals.faults[:1]
    if c.kind.moe:
        return _moe_contract(inst, vals)
    x, out = c.inputs[0], c.outputs[0]
    nx, nout = inst.buffer_sizes[x], inst.buffer_sizes[out]
    K = ir.ContractKind
    expected: dict[tuple[int, str], Segs | None] = {}   # None: the contract says nothing
    care: dict[tuple[int, str], list[tuple[int, int]]] = {}   # where only part of a buffer is defined
    describe: dict[str, str] = {}

    def shape(want: int, why: str) -> list[Diagnostic]:
        return [error(Codes.SHAPE, f"{c.kind.value} needs {why}: {want} elements, but {out} has {nout} "
                      f"and {x} has {nx} ({context(inst)})", s.param(out).span)]

    def total(lo: int = 0, hi: int = nx) -> Segs:
        acc = Segs.zeros(hi - lo)
        for r in range(W):
            acc = acc + vals.init[(r, x)][lo:hi]
        return acc

    opname = c.op.value if c.op else ""
    if c.kind is K.ALLREDUCE:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        t = total()
        for r in range(W):
            expected[(r, out)] = t
        describe[out] = f"the {opname} over all ranks of {x}[i]"
    elif c.kind is K.ALLGATHER and c.in_place:
        # x holds world blocks; block `rank` is the rank's input, and after the call block p is
        # rank p's block p
        if nx % W:
            return shape(nx - nx % W, f"{x} to hold world blocks")
        m = nx // W
        gathered = Segs.concat(vals.init[(p, x)][p * m:(p + 1) * m] for p in range(W))
        for r in range(W):
            expected[(r, x)] = gathered
        describe[x] = f"block i // {m} of the gather: {x}[i] of rank i // {m} (its own block)"
    elif c.kind is K.ALLGATHER:
        if nout != nx * W:
            return shape(nx * W, f"{out} to hold world x {x}")
        gathered = Segs.concat(vals.init[(p, x)] for p in range(W))
        for r in range(W):
            expected[(r, out)] = gathered
        describe[out] = f"block i // {nx} of the gather: {x}[i % {nx}] of rank i // {nx}"
    elif c.kind is K.REDUCESCATTER and c.in_place:
        # after the call block `rank` of x is the reduction of every rank's block `rank`; the
        # other blocks are the schedule's to use (NCCL's in-place ReduceScatter: recvbuff is
        # sendbuff + rank * recvcount)
        if nx % W:
            return shape(nx - nx % W, f"{x} to hold world blocks")
        m = nx // W
        for r in range(W):
            want = Segs.concat([Segs.zeros(r * m), total(r * m, (r + 1) * m), Segs.zeros(nx - (r + 1) * m)])
            expected[(r, x)] = want
            care[(r, x)] = [(r * m, (r + 1) * m)]
        describe[x] = f"in block `rank` (of {m}), the {opname} over all ranks of that block of {x}"
    elif c.kind is K.REDUCESCATTER:
        if nx != nout * W:
            return shape(nout * W, f"{x} to hold world x {out}")
        for r in range(W):
            expected[(r, out)] = total(r * nout, (r + 1) * nout)
        describe[out] = f"the {opname} over all ranks of block `rank` of {x}"
    elif c.kind is K.BROADCAST:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        root = inst.sizes[c.root]
        for r in range(W):
            expected[(r, out)] = vals.init[(root, x)]
        describe[out] = f"{x}[i] of the root, rank {root}"
    elif c.kind is K.REDUCE:
        if nout != nx:
            return shape(nx, f"{out} as large as {x}")
        root = inst.sizes[c.root]
        for r in range(W):
            if r == root:
                expected[(r, out)] = total()
            elif not c.in_place:
                expected[(r, out)] = None
        describe[out] = f"on the root (rank {root}), the {opname} over all ranks of {x}[i]"
    else:  # ALLTOALL
        if nx != nout or nx % W:
            return shape(nx - nx % W if nx % W else nx,
                         f"{x} and {out} of one size, a multiple of the world size")
        m = nx // W
        for r in range(W):
            expected[(r, out)] = Segs.concat(vals.init[(p, x)][r * m:(r + 1) * m] for p in range(W))
        describe[out] = f"block p of {out} on rank r is block r of {x} on p (blocks of {m})"
    return _compare(inst, vals, {k: (v, care.get(k)) if v is not None else None
                                 for k, v in expected.items()}, describe)


def _compare(inst: Instance, vals: Values, expected: dict, describe: dict[str, str]) -> list[Diagnostic]:
    """The first buffer, rank by rank, that holds other than `expected` says: {(rank, buffer):
    (value, the ranges it is said of, None for all) or None (nothing is said)}; a buffer not in it
    keeps its input value."""
    s, c = inst.schedule, inst.schedule.contract
    for r in range(inst.world):
        for b in vals.names:
            if s.param(b).scratch:
                continue
            if (r, b) not in expected:
                want, care = vals.init[(r, b)], None
            elif expected[(r, b)] is None:
                continue
            else:
                want, care = expected[(r, b)]
            got = vals.cur[(r, b)]
            bad = mismatch(got, want, care)
            if bad is None:
                continue
            i, count = bad
            what = describe.get(b, f"its input value (the contract leaves {b} unchanged)")
            return [error(Codes.CONTRACT, f"the schedule does not implement {c} ({context(inst)}): "
                          f"{b}@{r}[{i}] should be {what}, but {_explain(vals, int(got[i]))}"
                          + (f"; {count} elements are wrong" if count > 1 else ""), c.span)]
    return []


def moe_layout(ids: list[np.ndarray], experts: int, capacity: int | None,
               region: int | None = None) -> dict:
    """The window row of every routed entry: {(source rank, token, k): (owner, row)}, by the
    contract's definition. Packed (capacity None): on each owner, local expert by local expert, the
    rows from rank 0, then rank 1, ..., each rank's in token order; with `region` (per_expert(R))
    local expert l's rows start at row l * R instead of right after l - 1's. Slotted: rank s's j-th
    row for local expert l is row (l * world + s) * capacity + j."""
    W = len(ids)
    L = experts // W
    out = {}
    for o in range(W):
        row = 0
        for l in range(L):
            e = o * L + l
            if region is not None:
                row = l * region
            for src in range(W):
                j = 0
                for t, k in zip(*np.nonzero(ids[src] == e)):
                    out[(src, int(t), int(k))] = (o, row if capacity is None else (l * W + src) * capacity + j)
                    row += 1
                    j += 1
    return out


def _moe_contract(inst: Instance, vals: Values) -> list[Diagnostic]:
    s, W, c = inst.schedule, inst.world, inst.schedule.contract
    ids_name = c.inputs[1]
    T, K = (inst.buffer_shapes[ids_name] + (1,))[:2]
    ids = [vals.init[(r, ids_name)].astype(np.int64).reshape(T, K) for r in range(W)]
    counts_name = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    E = inst.buffer_shapes[counts_name][-1]
    cap = inst.sizes[c.capacity] if c.capacity else None
    live = [inst.live(r) for r in range(W)]
    if inst.active is not None:
        # a masked call: a masked rank routes nothing, and an entry for an expert of a masked rank
        # is dropped (as if it were -1): no row, no count, weight 0 in the combine
        ids = [live_entries(i, E, live) if live[r] else np.full_like(i, -1) for r, i in enumerate(ids)]
    region = inst.sizes[c.region] if c.region else None
    layout = moe_layout(ids, E, cap, region)
    matrix = np.stack([np.bincount(i[(i >= 0) & (i < E)], minlength=E)[:E] for i in ids]).reshape(-1)
    expected: dict[tuple[int, str], tuple] = {}   # value, the ranges checked (None: all)
    describe: dict[str, str] = {}
    # the bound of a packed window: when some owner would receive more rows than the window holds
    # (per_expert(R): some expert more than R), every rank reports it (the owner or expert with the
    # most rows, its rows, the bound, how many are over) and nothing is placed or gathered: the
    # window (dispatch) or the output (combine) keeps its input value
    win_name = c.outputs[0] if c.kind.dispatch else c.inputs[0]
    bound = inst.buffer_shapes[win_name][0] if region is None else region
    L = E // W
    recv = matrix.reshape(W, W, L).sum(axis=(0, 2)) if region is None else matrix.reshape(W, E).sum(axis=0)
    who, holds = ("rank", f"the {bound} rows of {win_name}") if region is None else \
        ("expert", f"the {bound} rows of its region of {win_name} ({c.region})")
    report = None
    if cap is None and (recv > bound).any():
        worst = int(np.argmax(recv))
        report = (worst, int(recv[worst]), bound, int((recv > bound).sum()))
    for r in range(W):
        got = sorted({v for (rr, _), v in vals.overflow.items() if rr == r})
        if got != ([report] if report and live[r] else []):
            want = (f"report that {who} {report[0]} would receive {report[1]} rows, more than "
                    f"{holds}" if report else
                    f"report no overflow (every {who} receives at most {bound} rows, {holds})")
            return [error(Codes.CONTRACT, f"the schedule does not implement {c} ({context(inst)}): rank {r} "
                          f"should {want}, but it reports {got or 'none'}", c.span)]
    def counts_want(r: int) -> np.ndarray:
        """What rank r's count table holds after a dispatch: every live source's row; a masked
        source's row is not written (it keeps what it held: a dead rank's stale counts)."""
        want = matrix.astype(np.uint64).reshape(W, E).copy()
        for q in range(W):
            if not live[q]:
                want[q] = np.asarray(vals.init[(r, counts_name)]).reshape(W, E)[q]
        return want.reshape(-1)
    if report and c.kind.dispatch:
        for r in range(W):
            if live[r]:
                expected[(r, c.outputs[1])] = (counts_want(r), None)
        describe[c.outputs[1]] = f"the number of entries of {ids_name} on rank i // experts equal to i % experts"
    elif report:
        pass   # nothing gathered: every buffer keeps its input value
    elif c.kind.dispatch:
        # the tokens, then every pair of rows that travels with them (c.side: a quantised
        # payload's scales), each by the same layout: the scales of a token land in the row of
        # their window that its row lands in, on the same rank
        for x, win in ((c.inputs[0], c.outputs[0]),) + c.side:
            H = inst.buffer_shapes[x][1]
            if inst.buffer_shapes[win][1] != H or inst.buffer_shapes[x][0] != T:
                return [error(Codes.SHAPE, f"{c.kind.value} moves rows of {x} ({inst.buffer_shapes[x]}) "
                              f"into {win} ({inst.buffer_shapes[win]}): {T} rows of one width on both "
                              f"sides ({context(inst)})", c.span)]
            want = {r: vals.init[(r, win)].copy() for r in range(W)}
            rows: dict[int, list[tuple[int, int]]] = {r: [] for r in range(W)}
            for (src, t, _), (o, row) in layout.items():
                want[o][row * H:(row + 1) * H] = vals.init[(src, x)][t * H:(t + 1) * H]
                rows[o].append((row * H, (row + 1) * H))
            for r in range(W):
                if live[r]:   # a masked rank: nothing of it is written (the default: every input kept)
                    expected[(r, win)] = (want[r], rows[r])
            describe[win] = ("the token row the layout puts there" if win == c.outputs[0] else
                             f"the row of {x} whose token the layout puts in that row of {c.outputs[0]}")
        for r in range(W):
            if live[r]:
                expected[(r, counts_name)] = (counts_want(r), None)
        describe[counts_name] = f"the number of entries of {ids_name} on rank i // experts equal to i % experts"
    else:
        win, weights, y = c.inputs[0], c.inputs[2], c.outputs[0]
        H = inst.buffer_shapes[y][1]
        for r in range(W):
            if not live[r]:
                continue
            token_rows = []
            for t in range(T):
                acc = Segs.zeros(H)
                for k in range(K):
                    hit = layout.get((r, t, k))
                    if hit:
                        o, row = hit
                        acc = acc + int(vals.init[(r, weights)][t * K + k]) * \
                            vals.init[(o, win)][row * H:(row + 1) * H]
                token_rows.append(acc)
            expected[(r, y)] = (Segs.concat(token_rows), None)
        describe[y] = f"the sum over k of {weights}[t, k] times the window row of entry (t, k)"
    return _compare(inst, vals, expected, describe)


def _explain(vals: Values, value: int) -> str:
    for (r, b), buf in vals.init.every():
        i = buf.find(value)
        if i is not None:
            return f"it holds {b}@{r}[{i}] as the call found it"
    return "it holds a combination with some contribution missing or counted twice"
