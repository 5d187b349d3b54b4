"""Scenarios run by test_comm.py, one process per rank: `python ranks.py SCENARIO RANK WORLD STORE`.
Each prints `PASS <scenario>` on success; any failed expectation raises (non-zero exit)."""

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from call_schedules import EVEN_ONLY, GRAB, TWO_LEVEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/: expect.py
from expect import Failed, check, expect_error  # noqa: E402

import stratac
from stratac import codegen
from stratac.diagnostics import Source
from stratac.host.comm import Communicator
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.host.schedule import Compiled, Module
from stratac.ir import passes
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]
AR = ROOT / "examples" / "allreduce_twoshot.strata"
AG = ROOT / "examples" / "allgather_push.strata"
PREFILL = ROOT / "examples" / "moe_prefill.strata"
DECODE = ROOT / "examples" / "moe_decode.strata"
BOUNDED = ROOT / "examples" / "moe_prefill_bounded.strata"
EXPERTS = ROOT / "examples" / "moe_prefill_experts.strata"
DIVISOR_FILE = ROOT / "tests" / "verify" / "corpus" / "good_divisor_team_size.strata"


def inputs(world, n, seed):
    return [torch.randint(-8, 9, (n,), generator=torch.Generator().manual_seed(seed * 100 + r))
            .float() for r in range(world)]


def interleaved(comm, rank, world):
    """Back-to-back calls alternating two schedules and sizes: every result right (epochs)."""
    ar, ag = comm.load(AR), comm.load(AG)
    for it in range(40):
        n = [1, 37, 1000, 4099][it % 4]
        x = comm.empty(n, dtype=torch.float32)
        xs = inputs(world, n, it)
        x.copy_(xs[rank])
        ar.allreduce_twoshot(x, op="sum", cores=3)
        check(torch.equal(x, torch.stack(xs).sum(0)), it)
        out = comm.empty(n * world, dtype=torch.float32)
        x.copy_(xs[rank])
        ag.allgather_push(x, out, cores=2)
        check(torch.equal(out, torch.cat(xs)), it)
        comm.free(out)
        comm.free(x)


def bad_input(comm, rank, world):
    ar = comm.load(AR)
    expect_error(StrataUsageError, "not on the symmetric heap: allocate it with comm.empty",
                 ar.allreduce_twoshot, torch.zeros(8), op="sum")
    x = comm.empty(8, dtype=torch.float64)
    expect_error(StrataUsageError, "parameter x has dtype torch.float64", ar.allreduce_twoshot, x,
                 op="sum")
    q = comm.empty(8, dtype=torch.int8)   # a type variable's schedule has no int8 kernel
    expect_error(StrataUsageError, "allreduce_twoshot is built for torch.float32, torch.float16, "
                 "torch.bfloat16, torch.int32, not torch.int8", ar.allreduce_twoshot, q, op="sum")
    x32 = comm.empty(8, dtype=torch.float32)
    expect_error(StrataUsageError, "missing argument(s) op", ar.allreduce_twoshot, x32)
    expect_error(StrataUsageError, "op must be one of sum, max, min, got 'avg'", ar.allreduce_twoshot,
                 x32, op="avg")
    ag = comm.load(AG)
    x = comm.empty(8, dtype=torch.float32)
    out = comm.empty(8 * world + 1, dtype=torch.float32)
    expect_error(StrataUsageError, f"parameter out must have (n * world) = {8 * world} elements, got "
                 f"{8 * world + 1}", ag.allgather_push, x, out)
    y = comm.empty(8 * world, dtype=torch.float16)
    expect_error(StrataUsageError, "parameter out is torch.float16 but an earlier T parameter is "
                 "torch.float32", ag.allgather_push, x, y)
    expect_error(StrataUsageError, "missing argument(s) out", ag.allgather_push, x)
    expect_error(StrataUsageError, "has no parameter 'y'", ag.allgather_push, x, out=y, y=y)
    expect_error(StrataUsageError, "must be contiguous", ar.allreduce_twoshot,
                 comm.empty(4, 4, dtype=torch.float32).t(), op="sum")
    expect_error(StrataRuntimeError, "symmetric heap exhausted", comm.empty, 1 << 40)
    import inspect
    sig = str(inspect.signature(ag.allgather_push))
    check(sig == "(x: 'sym T[n]', out: 'sym T[n * world]', *, cores=None)", sig)


def segment_gone(comm, rank, world):
    """The segment's name is removed as soon as every rank mapped it (rank 0 removes it right
    after the bootstrap's last barrier; one more barrier and every rank sees it gone)."""
    comm.barrier()
    check(not os.path.exists("/dev/shm/" + comm.segment.lstrip("/")), "the segment's name is left")
    x = comm.zeros(16)
    check(float(x.sum()) == 0.0, x)


def closed(comm, rank, world):
    ar = comm.load(AR)
    x = comm.empty(4)
    comm.close()
    expect_error(StrataUsageError, "closed", comm.empty, 4)
    expect_error(StrataUsageError, "closed", ar.allreduce_twoshot, x, op="sum")


def moe_bad_input(comm, rank, world):
    """Routing inputs are checked before anything is written: each bad call leaves the window and
    the counts as they were, and a good call afterwards still works."""
    T, H, K, E = 5, 16, 2, 2 * world
    mod = comm.load(PREFILL)
    x = comm.empty(T, H, dtype=torch.bfloat16)
    x.copy_(torch.randint(-8, 9, (T, H)).to(torch.bfloat16))
    ids = comm.empty(T, K, dtype=torch.int32)
    counts = comm.zeros(world, E, dtype=torch.int32)
    win = comm.zeros(world * T * K, H, dtype=torch.bfloat16)
    ids.copy_(torch.tensor([[0, 1]] * T, dtype=torch.int32))
    ids[3, 1] = E
    expect_error(StrataUsageError, f"ids[3, 1] = {E} is not an expert: it must lie in [0, {E}) or be -1",
                 mod.moe_prefill_dispatch, x, ids, counts, win)
    ids[3, 1] = -2
    expect_error(StrataUsageError, "ids[3, 1] = -2 is not an expert", mod.moe_prefill_dispatch, x, ids,
                 counts, win)
    check(int(win.abs().sum()) == 0 and int(counts.abs().sum()) == 0, "something was written")
    f_ids = comm.empty(T, K, dtype=torch.float32)
    expect_error(StrataUsageError, "parameter ids must be int32, got torch.float32",
                 mod.moe_prefill_dispatch, x, f_ids, counts, win)
    expect_error(StrataUsageError, "parameter win must have shape [(world * tokens) * topk, hidden]",
                 mod.moe_prefill_dispatch, x, ids, counts, comm.empty(7, H, dtype=torch.bfloat16))
    expect_error(StrataUsageError, "parameter x must have shape [tokens, hidden] (2 dimensions), got [80]",
                 mod.moe_prefill_dispatch, comm.empty(T * H, dtype=torch.bfloat16), ids, counts, win)
    xi = comm.empty(T, H, dtype=torch.int32)
    wi = comm.empty(world * T * K, H, dtype=torch.int32)
    expect_error(StrataUsageError, "the tokens must be float32, float16 or bfloat16, got torch.int32",
                 mod.moe_prefill_dispatch, xi, ids, counts, wi)
    wide = comm.empty(T, 2 * world + 1, dtype=torch.int32)   # topk 2 * world + 1 > experts
    expect_error(StrataUsageError, f"topk = {2 * world + 1} must be at most the number of experts ({E})",
                 mod.moe_prefill_dispatch, x, wide, counts,
                 comm.empty(world * T * (2 * world + 1), H, dtype=torch.bfloat16))
    if world > 1:
        odd = comm.zeros(world, E + 1, dtype=torch.int32)
        expect_error(StrataUsageError, f"{E + 1} experts do not divide over {world} ranks",
                     mod.moe_prefill_dispatch, x, ids, odd, win)
    dec = comm.load(DECODE)
    cap = 2
    dwin = comm.zeros(E * cap, H, dtype=torch.bfloat16)
    ids.copy_(torch.tensor([[1, 0]] * T, dtype=torch.int32))   # T = 5 tokens to expert 1 > 2 slots
    expect_error(StrataUsageError, f"5 tokens of rank {rank} go to expert 0, more than the capacity of 2",
                 dec.moe_decode_dispatch, x, ids, counts, dwin)
    check(int(dwin.abs().sum()) == 0, "the decode window was written")
    # a good call after all that
    ids.copy_(torch.tensor([[0, -1]] * T, dtype=torch.int32))
    comm.barrier()
    mod.moe_prefill_dispatch(x, ids, counts, win)
    check(counts[:, 0].tolist() == [T] * world, counts)
    v = comm.load(ROOT / "examples" / "alltoallv.strata")
    rows = comm.empty(T, H, dtype=torch.float32)
    dest = comm.empty(T, dtype=torch.int32)
    dest.copy_(torch.tensor([0, world, 0, -1, 0], dtype=torch.int32))
    vcounts = comm.zeros(world, world, dtype=torch.int32)
    out = comm.zeros(world * T, H, dtype=torch.float32)
    expect_error(StrataUsageError, f"dest[1] = {world} is not a rank: it must lie in [0, {world})",
                 v.alltoallv, rows, dest, vcounts, out)


def moe_masks(comm, rank, world):
    """Masks of active ranks (docs/robustness.md, "Masked ranks"): a bad mask is refused before
    anything is written (wrong length, shape, dtype, value or type; the calling rank masked; a
    schedule that takes none); an all-true mask is the unmasked call; then the last rank sits out
    a masked dispatch and combine of the others, whose entries for its experts are dropped."""
    T, H, K, E = 4, 8, 2, 2 * world
    mod = comm.load(PREFILL)
    x = comm.empty(T, H, dtype=torch.float32)
    x.copy_(torch.arange(T * H, dtype=torch.float32).reshape(T, H) + 100 * rank)
    ids = comm.empty(T, K, dtype=torch.int32)
    ids.copy_(torch.tensor([[0, E - 1]] * T, dtype=torch.int32))   # expert E - 1: the last rank's
    w = comm.empty(T, K, dtype=torch.float32)
    w.copy_(torch.tensor([[0.5, 0.25]] * T))
    counts = comm.zeros(world, E, dtype=torch.int32)
    win = comm.zeros(world * T * K, H, dtype=torch.float32)
    y = comm.zeros(T, H, dtype=torch.float32)
    d = mod.moe_prefill_dispatch
    for bad, text in (([1] * (world - 1), f"active must have one entry per rank ({world}), got {world - 1}"),
                      (torch.ones(1, world, dtype=torch.bool), "active must be a 1-D tensor"),
                      (torch.ones(world), "active must be a bool or integer tensor, got torch.float32"),
                      ([2] + [1] * (world - 1), "active[0] = 2; each entry must be true/1"),
                      ("all", "active must be a tensor, list or tuple"),
                      ([r != rank for r in range(world)], f"active[{rank}] is false on rank {rank} itself")):
        expect_error(StrataUsageError, text, d, x, ids, counts, win, active=bad)
    ar = comm.load(AR)
    expect_error(StrataUsageError, "only MoE dispatch and combine schedules take a mask",
                 ar.allreduce_twoshot, comm.empty(8, dtype=torch.float32), op="sum",
                 active=[True] * world)
    check(int(win.abs().sum()) == 0 and int(counts.abs().sum()) == 0, "something was written")
    comm.barrier()
    d(x, ids, counts, win, active=torch.ones(world, dtype=torch.int32))   # every rank live: no mask
    check(counts[:, 0].tolist() == [T] * world and counts[:, E - 1].tolist() == [T] * world, counts)
    comm.barrier()
    win.zero_()
    counts.fill_(7)
    comm.barrier()
    live = [r != world - 1 for r in range(world)]
    if live[rank]:
        d(x, ids, counts, win, active=torch.tensor(live))
        for s in range(world):    # live sources: their counts without the masked rank's expert
            want = [T] + [0] * (E - 1) if live[s] else [7] * E
            check(counts[s].tolist() == want, (s, counts[s].tolist(), want))
        if rank == 0:             # expert 0's rows: source 0's tokens, then source 1's, ...
            want = torch.cat([torch.arange(T * H, dtype=torch.float32).reshape(T, H) + 100 * s
                              for s in range(world) if live[s]])
            check(torch.equal(win[:len(want)], want), win)
            check(int(win[len(want):].abs().sum()) == 0, "rows past the live ones were written")
        mod.moe_prefill_combine(win, ids, w, counts, y, active=live)
        check(torch.equal(y, 0.5 * x), y)   # only expert 0's entry survives, weight 0.5
    comm.barrier()
    if not live[rank]:
        check(int(win.abs().sum()) == 0 and counts.tolist() == [[7] * E] * world,
              "the masked rank's window or counts were written")


def moe_masks_wide(comm, rank, world):
    """A mask at a world above 64 (the kernels read it from the sync area, one bit per rank): ranks
    3, 66 and world - 2 sit out a dispatch and a combine of the others. Token 0 of every rank goes
    to experts 3 and world - 2 (both masked: dropped), token 1 to the next rank's expert and to 66
    (dropped). Counts, windows and outputs are checked against values worked out here."""
    T, H, K, E = 2, 8, 2, world
    masked = {3, 66, world - 2}
    live = [r not in masked for r in range(world)]
    mod = comm.load(PREFILL)
    xs = [torch.arange(T * H, dtype=torch.float32).reshape(T, H) + 100 * r for r in range(world)]
    x = comm.empty(T, H, dtype=torch.float32)
    x.copy_(xs[rank])
    ids = comm.empty(T, K, dtype=torch.int32)
    ids.copy_(torch.tensor([[3, world - 2], [(rank + 1) % world, 66]], dtype=torch.int32))
    w = comm.empty(T, K, dtype=torch.float32)
    w.copy_(torch.tensor([[0.5, 0.25]] * T))
    counts = comm.empty(world, E, dtype=torch.int32)
    counts.fill_(7)
    win = comm.zeros(world * T * K, H, dtype=torch.float32)
    y = comm.zeros(T, H, dtype=torch.float32)
    comm.barrier()
    if live[rank]:
        mod.moe_prefill_dispatch(x, ids, counts, win, active=live)
        for s in range(world):
            want = [7] * E
            if live[s]:
                want = [0] * E
                want[(s + 1) % world] = int(live[(s + 1) % world])
            check(counts[s].tolist() == want, (s, counts[s].tolist(), want))
        src = (rank - 1) % world     # the one source whose token 1 comes here
        rows = 1 if live[src] else 0
        if rows:
            check(torch.equal(win[0], xs[src][1]), (win[0], xs[src][1]))
        check(int(win[rows:].abs().sum()) == 0, "rows past the routed ones were written")
        mod.moe_prefill_combine(win, ids, w, counts, y, active=torch.tensor(live))
        want_y = torch.zeros(T, H)
        if live[(rank + 1) % world]:
            want_y[1] = 0.5 * xs[rank][1]
        check(torch.equal(y, want_y), (y, want_y))
    comm.barrier()
    if not live[rank]:
        check(int(win.abs().sum()) == 0 and int(y.abs().sum()) == 0 and counts.eq(7).all(),
              "a masked rank's window, counts or output were written")


def moe_bounded(comm, rank, world):
    """A bounded window (max_recv rows): a routing that sends one rank more rows than the bound is
    reported on every rank, naming the rank, its rows and the bound, and nothing is written (the
    window and the guard rows after it keep their sentinel); a routing exactly at the bound places
    every row where the layout says, and the guard rows stay untouched."""
    T, H, K, E, G = 15, 8, 2, 2 * world, 4
    bound = T * K                      # what a balanced routing sends each rank
    mod = comm.load(BOUNDED)
    x = comm.empty(T, H, dtype=torch.float32)
    x.copy_((100 * rank + torch.arange(T, dtype=torch.float32))[:, None].expand(T, H))
    ids = comm.empty(T, K, dtype=torch.int32)
    counts = comm.zeros(world, E, dtype=torch.int32)
    big = comm.empty(bound + G, H, dtype=torch.float32)
    big.fill_(-7.0)
    win = big[:bound]
    # every token to experts 0 and 1 (both on rank 0): world * T * K rows for rank 0
    ids.copy_(torch.tensor([[0, 1]] * T, dtype=torch.int32))
    comm.barrier()
    expect_error(StrataRuntimeError, f"the routing sends {world * T * K} rows to rank 0, more than the "
                 f"{bound} rows of its window win (max_recv = {bound})", mod.moe_prefill_bounded_dispatch,
                 x, ids, counts, win)
    check(bool((big == -7.0).all()), "the window or the rows after it were written")
    check(counts[:, 0].tolist() == [T] * world, counts)
    # token t to rank t % world's two experts: every rank receives exactly T * K rows
    L = E // world
    ids.copy_(torch.tensor([[(t % world) * L, (t % world) * L + 1] for t in range(T)], dtype=torch.int32))
    comm.barrier()
    mod.moe_prefill_bounded_dispatch(x, ids, counts, win)
    want = [100 * s + t for l in range(L) for s in range(world) for t in range(T) if t % world == rank]
    want = torch.tensor(want, dtype=torch.float32)
    check(len(want) == bound and bool((win == want[:, None]).all()), win[:, 0])
    check(bool((big[bound:] == -7.0).all()), "the rows after the window were written")
    moe_bounded_per_expert(comm, rank, world)


def moe_bounded_per_expert(comm, rank, world):
    """A region of R rows per local expert (per_expert(R), examples/moe_prefill_experts.strata): a
    routing that sends one expert more than R rows is reported on every rank by dispatch and by
    combine, naming the expert, its rows and R, and nothing is written; a routing that fills every
    region exactly puts local expert l's rows from row l * R, source by source."""
    T, H, K, E, G = 4 * world, 8, 2, 2 * world, 4
    L, R = E // world, T                # the balanced routing below sends each expert T rows
    mod = comm.load(EXPERTS)
    x = comm.empty(T, H, dtype=torch.float32)
    x.copy_((100 * rank + torch.arange(T, dtype=torch.float32))[:, None].expand(T, H))
    ids = comm.empty(T, K, dtype=torch.int32)
    w = comm.empty(T, K, dtype=torch.float32)
    w.fill_(1.0)
    counts = comm.zeros(world, E, dtype=torch.int32)
    big = comm.empty(L * R + G, H, dtype=torch.float32)
    big.fill_(-7.0)
    win = big[:L * R]
    y = comm.empty(T, H, dtype=torch.float32)
    y.fill_(-3.0)
    ids.copy_(torch.tensor([[0, 1]] * T, dtype=torch.int32))   # experts 0 and 1: world * T rows each
    comm.barrier()
    said = (f"the routing sends {world * T} rows to expert 0, more than the {R} rows of its region of win "
            f"(expert_rows = {R}); 2 experts are over the bound. Nothing was")
    expect_error(StrataRuntimeError, said + " placed", mod.moe_prefill_experts_dispatch, x, ids, counts, win)
    check(bool((big == -7.0).all()), "the window or the rows after it were written")
    check(counts[:, 0].tolist() == [T] * world, counts)
    expect_error(StrataRuntimeError, said + " gathered", mod.moe_prefill_experts_combine, win, ids, w, counts, y)
    check(bool((y == -3.0).all()), "the combine wrote its output")
    # token t to rank t % world's two experts: every expert receives exactly R rows
    ids.copy_(torch.tensor([[(t % world) * L, (t % world) * L + 1] for t in range(T)], dtype=torch.int32))
    comm.barrier()
    mod.moe_prefill_experts_dispatch(x, ids, counts, win)
    mine = [100 * s + t for s in range(world) for t in range(T) if t % world == rank]
    want = torch.tensor(mine * L, dtype=torch.float32)        # region l = rows 0..R-1 from row l * R
    check(len(mine) == R and bool((win == want[:, None]).all()), win[:, 0])
    check(bool((big[L * R:] == -7.0).all()), "the rows after the window were written")


def moe_interleaved(comm, rank, world):
    """Prefill and decode dispatch/combine alternating with an AllReduce, back to back (epochs and
    the shared flag area), every result checked against a torch reference built from all ranks'
    inputs."""
    T, H, K, E, cap = 6, 24, 2, 2 * world, 6
    pre, dec, ar = comm.load(PREFILL), comm.load(DECODE), comm.load(AR)
    x = comm.empty(T, H, dtype=torch.float32)
    ids = comm.empty(T, K, dtype=torch.int32)
    w = comm.empty(T, K, dtype=torch.float32)
    counts = comm.zeros(world, E, dtype=torch.int32)
    y = comm.empty(T, H, dtype=torch.float32)
    pwin = comm.zeros(world * T * K, H, dtype=torch.float32)
    dwin = comm.zeros(E * cap, H, dtype=torch.float32)
    v = comm.empty(100, dtype=torch.float32)
    for it in range(12):
        g = torch.Generator().manual_seed(it)
        all_ids = [torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
                   for _ in range(world)]
        for r in range(world):
            all_ids[r][it % T, it % K] = -1
        xs = [torch.randint(-8, 9, (T, H), generator=g).float() for _ in range(world)]
        ws = [torch.randint(0, 17, (T, K), generator=g).float() / 16 for _ in range(world)]
        x.copy_(xs[rank])
        ids.copy_(all_ids[rank])
        w.copy_(ws[rank])
        comm.barrier()   # host writes done everywhere before a decode dispatch may write here
        decode = it % 2 == 1
        disp, comb, win = ((dec.moe_decode_dispatch, dec.moe_decode_combine, dwin) if decode
                           else (pre.moe_prefill_dispatch, pre.moe_prefill_combine, pwin))
        disp(x, ids, counts, win, cores=3)
        L = E // world
        row = 0
        for l in range(L):
            e = rank * L + l
            for s in range(world):
                hits = [t for t, k in (all_ids[s] == e).nonzero().tolist()]
                start = (l * world + s) * cap if decode else row
                for j, t in enumerate(hits):
                    check(torch.equal(win[start + j], xs[s][t]), (it, e, s, t))
                win[start:start + len(hits)] *= e + 1
                row += len(hits)
        comb(win, ids, w, counts, y, cores=2)
        want = torch.zeros(T, H)
        for t in range(T):
            for k in range(K):
                e = int(all_ids[rank][t, k])
                if e >= 0:
                    want[t] += ws[rank][t, k] * xs[rank][t] * (e + 1)
        check(torch.equal(y, want), it)
        comm.barrier()   # everyone has read its window before the next (decode) dispatch writes
        v.fill_(rank + it)
        ar.allreduce_twoshot(v, op="max")
        check(float(v[0]) == world - 1 + it, (it, float(v[0])))


def unproven(comm, text: str) -> Module:
    """The schedules of text built without load-time verification, as schedules whose flaw no
    load-time sample hit would reach the call: only the call's own checks and proof stand between
    them and the machine."""
    compiled = []
    for s in frontend.schedules(Source("unproven.strata", text)):
        lowered = passes.pipeline(s, passes.Options(cores=2))
        compiled.append(Compiled(lowered, codegen.generate(lowered), (comm.world,)))
    return Module(comm, compiled)


def call_refusals(comm, rank, world):
    """Calls whose instance breaks what was proven are refused before anything is launched or
    written: extents that break a size relation, an instance the verifier rejects, a tensor given
    back with comm.free, cores=0. The same schedules then run right where they are proven."""
    grab = unproven(comm, GRAB).grab
    x = comm.empty(128, dtype=torch.float32)
    neighbour = comm.empty(128, dtype=torch.float32)   # what an unchecked grab would read
    out = comm.empty(256, dtype=torch.float32)
    x.fill_(rank + 1)
    neighbour.fill_(100 + rank)
    out.fill_(-1)
    epoch = comm._epoch
    comm.barrier()
    expect_error(StrataUsageError, "grab: on rank 0, line 4 reads x[0:m]@root = x[0:256], but parameter x "
                 "has 128 elements: the schedule was proven for calls where m <= n, and this call has "
                 "m = 256, n = 128; nothing was written", grab, x, out, root=world - 1)
    short = out[:64]
    expect_error(StrataUsageError, f"grab: this call's instance (world={world}, m=64, n=128, root="
                 f"{world - 1}) is not proven, so it was refused before anything was written:\n"
                 "unproven.strata:2:28: error[E0202]: broadcast needs out as large as x", grab, x, short,
                 root=world - 1)
    check(bool((out == -1).all()), "grab wrote out although it was refused")
    even = unproven(comm, EVEN_ONLY).even_only
    y = comm.empty(9, dtype=torch.float32)
    y.fill_(rank + 1)
    expect_error(StrataUsageError, f"even_only: this call's instance (world={world}, n=9) is not proven, "
                 "so it was refused before anything was written:\nunproven.strata:", even, y, op="sum")
    check(bool((y == rank + 1).all()), "even_only wrote y although it was refused")
    ar = comm.load(AR)
    old = comm.empty(64, dtype=torch.float32)
    comm.free(old)
    new = comm.empty(64, dtype=torch.float32)   # the same memory, another tensor
    check(new.data_ptr() == old.data_ptr(), "the allocator did not reuse the freed memory")
    new.fill_(rank + 1)
    expect_error(StrataUsageError, "allreduce_twoshot: parameter x was given back with comm.free: its "
                 "memory may belong to another tensor now", ar.allreduce_twoshot, old, op="sum")
    expect_error(StrataUsageError, "allreduce_twoshot: parameter x was given back with comm.free",
                 ar.allreduce_twoshot, old[8:16], op="sum")
    expect_error(StrataUsageError, "the tensor to free was given back with comm.free", comm.free, old)
    expect_error(StrataUsageError, "allreduce_twoshot: cores must be between 1 and 40, got 0",
                 ar.allreduce_twoshot, new, op="sum", cores=0)
    check(bool((new == rank + 1).all()), "new was written by a refused call")
    check(comm._epoch == epoch, "a refused call launched a kernel")
    # where the proof holds, the same schedules run, and right
    comm.barrier()
    grab(x, out[:128], root=world - 1)
    check(bool((out[:128] == world).all()) and bool((out[128:] == -1).all()), out)
    z = comm.empty(10, dtype=torch.float32)
    z.fill_(rank + 1)
    even(z, op="sum")
    check(bool((z == world * (world + 1) // 2).all()), z)
    ar.allreduce_twoshot(new, op="sum")
    check(bool((new == world * (world + 1) // 2).all()), new)


def verdict_cache(comm, rank, world):
    """Counts the verifier's runs on the instance of a call (after loading: load-time verification
    is not counted) and prints `VERIFIED <count>`; the result is checked as usual."""
    import stratac.verify
    ar = comm.load(AR)
    runs, real = [0], stratac.verify.verify

    def counted(*args, **kw):
        runs[0] += 1
        return real(*args, **kw)

    stratac.verify.verify = counted
    x = comm.empty(1000, dtype=torch.float32)
    for _ in range(2):
        x.fill_(rank + 1)
        ar.allreduce_twoshot(x, op="sum")
        check(bool((x == world * (world + 1) // 2).all()), x)
    print(f"VERIFIED {runs[0]}", flush=True)


def half_sums_round_once(comm, rank, world):
    """half and bfloat16 AllReduce sums accumulate in float and round once (strata::Mover; on A2/A3
    there is no bfloat16 Add): a large value on rank 0 plus small ones elsewhere, where rounding
    after every addition would lose the small ones and rounding once keeps them."""
    ar = comm.load(AR)
    n = 64
    small = torch.arange(n) % 4
    for dtype, big in ((torch.bfloat16, 256.0), (torch.float16, 2048.0)):
        parts = [torch.full((n,), big, dtype=torch.float64) if r == 0 else small.double() for r in range(world)]
        exact = torch.stack(parts).sum(0)
        once = exact.to(dtype)                            # one rounding of the exact sum
        per_op = parts[0].to(dtype)
        for r in range(1, world):
            per_op = per_op + parts[r].to(dtype)          # torch rounds every addition to dtype
        check(not torch.equal(once, per_op), "the inputs do not tell the two roundings apart")
        x = comm.empty(n, dtype=dtype)
        x.copy_(parts[rank].to(dtype))
        ar.allreduce_twoshot(x, op="sum", cores=2)
        check(torch.equal(x, once), (dtype, x.tolist(), once.tolist()))
        comm.free(x)


BCAST = ROOT / "examples" / "broadcast.strata"


def cached_calls(comm, rank, world):
    """A repeated call reuses its checked launch (bind does not run again) but is still refused
    when what the signature cannot fix has changed: a tensor given back with comm.free, the
    expert ids' values; and a call whose signature differs in anything bind checks (a bool for a
    rank, another op, a view, another dtype) is checked afresh."""
    ar = comm.load(AR)
    fn = ar.allreduce_twoshot
    x = comm.empty(1000, dtype=torch.float32)
    x.fill_(rank + 1)
    comm.barrier()
    fn(x, op="sum")
    check(bool((x == world * (world + 1) // 2).all()), x)
    real_bind = fn.bind

    def no_bind(*a, **k):
        raise Failed("bind ran again for a call of the same signature")

    fn.bind = no_bind
    x.fill_(rank + 1)
    comm.barrier()
    fn(x, op="sum")                                   # the same signature: no bind
    check(bool((x == world * (world + 1) // 2).all()), x)
    expect_error(Failed, "bind ran again", fn, x, op="max")           # another op: checked afresh
    expect_error(Failed, "bind ran again", fn, x[:500], op="sum")     # a view: checked afresh
    expect_error(Failed, "bind ran again", fn, x, op="sum", cores=2)  # other cores: checked afresh
    fn.bind = real_bind
    epoch = comm._epoch
    expect_error(StrataUsageError, "op must be one of sum, max, min, got 'mean'", fn, x, op="mean")
    expect_error(StrataUsageError, "cores must be between 1 and 40, got True", fn, x, op="sum", cores=True)
    comm.free(x)
    expect_error(StrataUsageError, "parameter x was given back with comm.free", fn, x, op="sum")
    check(comm._epoch == epoch, "a refused call launched a kernel")
    bc = comm.load(BCAST)
    b = comm.zeros(16, dtype=torch.int32)
    if rank == world - 1:
        b.fill_(7)
    comm.barrier()
    bc.broadcast(b, root=world - 1)
    check(int(b.sum()) == 112, b)
    expect_error(StrataUsageError, "root must be a rank in", bc.broadcast, b, root=True if world > 1 else 1.0)
    # MoE: the same tensors with a bad expert id written in place are refused, nothing written
    T, H, K, E = 4, 16, 2, 2 * world
    mod = comm.load(PREFILL)
    xm = comm.empty(T, H, dtype=torch.float32)
    xm.fill_(1)
    ids = comm.empty(T, K, dtype=torch.int32)
    ids.copy_(torch.tensor([[0, 1]] * T, dtype=torch.int32))
    counts = comm.zeros(world, E, dtype=torch.int32)
    win = comm.zeros(world * T * K, H, dtype=torch.float32)
    comm.barrier()
    mod.moe_prefill_dispatch(xm, ids, counts, win)
    comm.barrier()
    win.zero_()
    counts.zero_()
    ids[2, 0] = E
    comm.barrier()
    epoch = comm._epoch
    expect_error(StrataUsageError, f"ids[2, 0] = {E} is not an expert", mod.moe_prefill_dispatch, xm,
                 ids, counts, win)
    check(comm._epoch == epoch and int(win.abs().sum()) == 0 and int(counts.abs().sum()) == 0,
          "a refused dispatch wrote or launched")


def selecting_entry_point(comm, rank, world):
    """mod.allreduce picks a candidate by bytes and world: from a table (given as a dict), or by
    the default rule without one (selection=False); in place through the out-of-place one-shot
    (a copy, up to 64 KiB) and out of place through the in-place two-shot; results right."""
    src = AR.read_text() + "\n" + (ROOT / "examples" / "allreduce_oneshot.strata").read_text()
    table = {"stratac_selection": 1, "provenance": {}, "entries": [
        {"kind": "allreduce", "world": world, "dtype": "f32", "rows": [
            {"upto": 4096, "order": ["allreduce_oneshot", "allreduce_twoshot"]},
            {"upto": None, "order": ["allreduce_twoshot", "allreduce_oneshot"]}]}]}
    mod = comm.load(src, name="two.strata", selection=table)
    plain = comm.load(src, name="two.strata", selection=False)
    total = world * (world + 1) // 2
    for m, n, out_of_place, want in (
            (mod, 1000, False, "allreduce_oneshot"),    # 4000 B: the table's first row, via a copy
            (mod, 1000, True, "allreduce_oneshot"),
            (mod, 5000, False, "allreduce_twoshot"),    # 20000 B: the second row
            (mod, 5000, True, "allreduce_twoshot"),     # out of place through in place (copy)
            (mod, 40000, True, "allreduce_oneshot"),    # 160 KB, above 64 KiB: its own form, no copy
            (plain, 1000, False, "allreduce_oneshot"),  # default rule, small: fewest statements
            (plain, 40000, False, "allreduce_twoshot")):  # default rule, large: the first of its form
        x = comm.empty(n, dtype=torch.float32)
        x.fill_(rank + 1)
        out = comm.empty(n, dtype=torch.float32) if out_of_place else None
        comm.barrier()
        m.allreduce(x, out, op="sum")
        got = out if out_of_place else x
        check(bool((got == total).all()), (n, out_of_place, got[:4]))
        check(m.allreduce.last == want, (n, out_of_place, m.allreduce.last, want))
        check(m.collective("allreduce") is m.allreduce, "collective() is the attribute")
    expect_error(StrataUsageError, "no schedule of this module implements broadcast", mod.collective,
                 "broadcast")
    expect_error(StrataUsageError, "is not a stratac selection table", comm.load, src, name="two.strata",
                 selection={"entries": []})


def several_communicators(comm, rank, world):
    """Communicators side by side in one process: a second one over every rank, one over a
    subgroup (ranks 0 and 1), and a MoE Buffer with a communicator of its own. Calls alternate
    between them; each keeps its heap, sync area and stamps, so every result is right; closing one
    leaves the others working."""
    twin = Communicator.from_process_group(heap_bytes=8 << 20)
    pair = dist.new_group([0, 1])
    sub = Communicator.from_process_group(heap_bytes=8 << 20, group=pair) if rank < 2 else None
    check(sub is None or (sub.rank, sub.world) == (rank, 2), "the subgroup's rank and world")
    mods = [(comm, comm.load(AR), world), (twin, twin.load(AR), world)]
    if sub is not None:
        mods.append((sub, sub.load(AR), 2))
    for it in range(12):
        for k, (c, mod, w) in enumerate(mods):
            n = [5, 300, 4099][(it + k) % 3]
            x = c.empty(n, dtype=torch.float32)
            xs = inputs(w, n, it * 10 + k)
            x.copy_(xs[c.rank])
            mod.allreduce_twoshot(x, op="sum", cores=2)
            check(torch.equal(x, torch.stack(xs).sum(0)), (it, k))
            c.free(x)
    experts, hidden, tokens = 2 * world, 64, 8
    buf = stratac.Buffer(None, hidden=hidden, max_tokens=tokens, num_experts=experts, topk=2,
                         dtype=torch.float32)

    def routing(r):
        return torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(r * 7 + t))[:2]
                            for t in range(tokens)])
    x = torch.arange(tokens * hidden, dtype=torch.float32).view(tokens, hidden) + 1000 * rank
    recv, counts, handle = buf.dispatch(x, routing(rank))
    mine = [e for e in range(experts) if e // (experts // world) == rank]
    want = [sum(int((routing(r) == e).sum()) for r in range(world)) for e in mine]
    check(list(map(int, counts)) == want, ("dispatch counts", counts, want))
    mod = mods[1][1]
    y = twin.empty(64, dtype=torch.float32)
    y.fill_(rank + 1)
    mod.allreduce_twoshot(y, op="sum")          # a Buffer call in between changes nothing
    check(bool((y == world * (world + 1) // 2).all()), y[:4])
    buf.close()
    twin.close()
    z = comm.empty(64, dtype=torch.float32)     # the first communicator, after the others closed
    z.fill_(1)
    mods[0][1].allreduce_twoshot(z, op="sum")
    check(bool((z == world).all()), z[:4])
    if sub is not None:
        w = sub.empty(32, dtype=torch.float32)
        w.fill_(rank + 2)
        mods[2][1].allreduce_twoshot(w, op="max")
        check(bool((w == 3).all()), w[:4])
        sub.close()
    dist.barrier()


def divisor_params(comm, rank, world):
    """A divisor parameter (the node size of a two-level AllReduce): every divisor of the world
    gives the sum; a value that does not divide it is refused before anything is written; ranks
    that give different values are stopped by the ranks' agreement, every rank naming both calls."""
    mod = comm.load(TWO_LEVEL)
    n = 1001
    x = comm.empty(n, dtype=torch.float32)
    for it, g in enumerate(d for d in range(1, world + 1) if world % d == 0):
        xs = inputs(world, n, it)
        x.copy_(xs[rank])
        mod.two_level(x, g=g, op="sum")
        check(torch.equal(x, torch.stack(xs).sum(0)), g)
    x.fill_(7)
    expect_error(StrataUsageError, f"g must divide the world ({world}): one of 1, {world}; got 2",
                 mod.two_level, x, g=2, op="sum")
    expect_error(StrataUsageError, "g must divide the world", mod.two_level, x, g=0, op="sum")
    check(bool((x == 7).all()), "a refused call wrote")
    expect_error(StrataUsageError, "the ranks made different calls", mod.two_level, x,
                 g=1 if rank == 0 else world, op="sum")
    check(bool((x == 7).all()), "a call the ranks disagreed on wrote")
    # a scratch buffer sized by g: each rank allocated its own call's before the ranks compared
    # their calls; the refused call gives it back on every rank, so the heaps are alike again and
    # the next call (and an allocation between) is right
    gather = comm.load(DIVISOR_FILE)
    out = comm.zeros(n * world)
    expect_error(StrataUsageError, "the ranks made different calls", gather.node_gather, x, out,
                 g=1 if rank == 0 else world)
    z = comm.zeros(4 * n)
    xs = inputs(world, n, 99)
    x.copy_(xs[rank])
    gather.node_gather(x, out, g=world)
    check(torch.equal(out, torch.cat(xs)), "the call after a disagreement")
    check(bool((z == 0).all()), "the call after a disagreement wrote into a later allocation")
    for t in (z, out, x):
        comm.free(t)


SCENARIOS = {f.__name__: f for f in (interleaved, divisor_params, bad_input, segment_gone, closed, moe_bad_input, moe_masks,
                                     moe_masks_wide, moe_bounded,
                                     moe_interleaved, call_refusals, verdict_cache, half_sums_round_once,
                                     cached_calls, selecting_entry_point,
                                     several_communicators)}


def main(scenario, rank, world, store_path, mode):
    if mode == "pg":
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        comm = stratac.Communicator.from_process_group(heap_bytes=16 << 20)
    else:
        store = dist.FileStore(store_path, world)
        comm = Communicator.from_store(rank, world, store, heap_bytes=16 << 20)
    SCENARIOS[scenario](comm, rank, world)
    comm.close()
    print(f"PASS {scenario}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
