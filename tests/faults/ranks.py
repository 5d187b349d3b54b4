"""Fault scenarios, one process per rank: `python ranks.py SCENARIOS RANK WORLD STORE TIMEOUT [ARG]`.

SCENARIOS is one name or several joined by commas, run one after the other in the same processes,
each on a fresh communicator bootstrapped through one FileStore (Communicator.from_store with the
scenario's name as prefix); TIMEOUT is the wait timeout of the ranks that call in skip_call and
hang_flag (the others, and the rank of skip_call that never calls, use 60 s). TIMEOUT is the one
deadline of those scenarios: every host-side wait around the call (the start before the bootstrap,
the start of the call, the rank that never calls) waits up to 60 s or until the pool is aborted, so
a slow rank on a busy machine cannot end the scenario at another deadline first.
Lines on stdout the tests read (SCEN: the scenario's name):
  ENTER SCEN <t>              about to call the schedule (t: time.time())
  READY SCEN <t>              (a victim) alive and not calling
  INTERRUPTED SCEN <s> <msg>  (signalled) the call raised KeyboardInterrupt, s seconds after it began
  TERMINATED SCEN <s> <msg>   (signalled) the call raised the program's own SIGTERM handler's exception
  ERROR SCEN <elapsed> <msg>  the call (or what followed) raised; msg on one line
  STATS SCEN <json>           measurements (soak, oversubscription)
  PASS SCEN                   everything this rank checked held
  SEGMENT SCEN <name>         (rank 0) the scenario's shared-memory segment, for the leak checks
The exit status is 3 if any scenario raised. Ranks end with os._exit: the interpreter's teardown
of torch costs about half a second of CPU per process, which adds up on a two-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from stratac import codegen
from stratac.codegen import abi
from stratac.host.comm import Communicator, store_barrier
from stratac.host.cpu_model import check_pool
from stratac.host.schedule import Compiled, Module
from stratac.ir import passes
from stratac.lang import frontend

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AR = ROOT / "examples" / "allreduce_twoshot.strata"
AG = ROOT / "examples" / "allgather_push.strata"
PREFILL = ROOT / "examples" / "moe_prefill.strata"
DECODE = ROOT / "examples" / "moe_decode.strata"


CURRENT = ["?"]   # the scenario running
HOST_WAIT = 60.0  # seconds a host-side wait of a scenario may take (never the deadline under test)
STORE: list = []  # the job's store


def say(tag: str, *parts) -> None:
    print(tag, CURRENT[0], *parts, flush=True)


class Failed(Exception):
    """A scenario's call raised (already reported with say("ERROR", ...))."""


def report(t0: float, exc: BaseException) -> None:
    say("ERROR", f"{time.monotonic() - t0:.3f}", str(exc).replace("\n", " | "))


def load_unverified_for_tests(comm: Communicator, path: Path) -> Module:
    """TEST HOOK: compiles a schedule the verifier would reject (a wait that never comes) by
    running the passes, code generation and build directly, without stratac.verify, and lets its
    calls skip the proof of their instance. Production code has no way to skip verification."""
    compiled = []
    for s in frontend.schedules(frontend.load_source(path)):
        lowered = passes.pipeline(s, passes.Options(cores=2))
        compiled.append(Compiled(lowered, codegen.generate(lowered), (comm.world,)))
    mod = Module(comm, compiled)
    for fn in mod.schedules.values():
        fn._check_instance = lambda params, active=None: None
    return mod


def inputs(world: int, n: int, it: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Small integers: exact in every dtype, sums of 4 ranks included (< 256 for bf16)."""
    i = torch.arange(n)
    return [(((r + 1) * (i % 13) + it) % 61).to(dtype) for r in range(world)]


# ---- a rank that never arrives -------------------------------------------------------------

def skip_call(comm, rank, world, arg):
    """Every rank but the last calls the two-shot AllReduce; the last never does (it waits in a host
    barrier, which ends when the others fail)."""
    ar = comm.load(AR)
    x = comm.empty(4096, dtype=torch.float32)
    host_barrier(comm, "go")
    t0 = time.monotonic()
    try:
        if rank != world - 1:
            say("ENTER", time.time())
            ar.allreduce_twoshot(x, op="sum", cores=2)
        host_barrier(comm, "after")   # the last rank: ends when the pool is aborted
    except Exception as exc:  # noqa: BLE001 - reported to the test
        report(t0, exc)
        raise Failed from exc


def hang_flag(comm, rank, world, arg):
    """tests/faults/hang_flag.strata (unverified): rank 0 waits for go[0], which nobody signals."""
    mod = load_unverified_for_tests(comm, HERE / "hang_flag.strata")
    x = comm.empty(64, dtype=torch.float32)
    host_barrier(comm, "go")
    t0 = time.monotonic()
    try:
        say("ENTER", time.time())
        mod.hang_flag(x, cores=2)
        host_barrier(comm, "after")   # rank 1: ends when rank 0's timeout aborts the pool
    except Exception as exc:  # noqa: BLE001
        report(t0, exc)
        raise Failed from exc


def victim(comm, rank, world, arg):
    """The last rank never calls and waits to be killed; the others call the AllReduce, so they
    wait in its first barrier for a rank that is about to die. The last rank says READY once every
    other rank has announced its arrival at that barrier in the last rank's slots of the sync area
    (slot p of rank q: the stamp of the last barrier rank p announced to q, strata::Barrier), i.e.
    once they are in the barrier that waits for it."""
    ar = comm.load(AR)
    x = comm.empty(4096, dtype=torch.float32)
    comm.barrier()
    t0 = time.monotonic()
    if rank == world - 1:
        deadline = time.monotonic() + HOST_WAIT
        slots = [comm._sync + p * abi.SYNC_SLOT_BYTES for p in range(world - 1)]   # one 64-byte line each
        while not all(struct.unpack_from("i", comm._buffer, at)[0] for at in slots):
            if time.monotonic() > deadline:
                raise AssertionError(f"the other ranks did not reach the barrier within {HOST_WAIT} s")
            time.sleep(0.005)
        say("READY", time.time())
        time.sleep(600)
        return
    try:
        say("ENTER", time.time())
        ar.allreduce_twoshot(x, op="sum", cores=2)
    except Exception as exc:  # noqa: BLE001
        report(t0, exc)
        raise Failed from exc


# ---- a signal to a rank blocked in a kernel wait ---------------------------------------------

class Terminated(Exception):
    """Raised by the SIGTERM handler a program may install (like a launcher's): arg "handler"."""


def signalled(comm, rank, world, arg):
    """Rank 0 calls the two-shot AllReduce and blocks in its first barrier (rank 1 never calls);
    rank 1 says READY once rank 0 announced its arrival there (as in `victim`), so that the test's
    signal to rank 0 lands in the kernel wait, then waits in a host barrier that ends when the pool
    is aborted. Rank 0 says INTERRUPTED (seconds since its call began) on a KeyboardInterrupt and
    TERMINATED on its own SIGTERM handler's exception (installed when arg is "handler"); under
    the default SIGTERM action the communicator ends the process (SystemExit, a line on stderr)."""
    if arg == "handler" and rank == 0:
        def on_term(signum, frame):
            raise Terminated(f"signal {signum}")
        signal.signal(signal.SIGTERM, on_term)
    ar = comm.load(AR)
    x = comm.empty(4096, dtype=torch.float32)
    comm.barrier()
    t0 = time.monotonic()
    if rank == 0:
        say("ENTER", time.time())
        try:
            ar.allreduce_twoshot(x, op="sum", cores=2)
        except KeyboardInterrupt as exc:
            say("INTERRUPTED", f"{time.monotonic() - t0:.3f}", str(exc).replace("\n", " | "))
            raise Failed from exc
        except Terminated as exc:
            say("TERMINATED", f"{time.monotonic() - t0:.3f}", str(exc))
            raise Failed from exc
        say("RETURNED")
        return
    try:
        deadline = time.monotonic() + HOST_WAIT
        at = comm._sync   # slot 0 of this rank's sync area: rank 0's barrier arrivals
        while not struct.unpack_from("i", comm._buffer, at)[0]:
            if time.monotonic() > deadline:
                raise AssertionError(f"rank 0 did not reach the barrier within {HOST_WAIT} s")
            time.sleep(0.005)
        say("READY", time.time())
        host_barrier(comm, "after")   # ends when rank 0's interrupted call aborts the pool
    except Exception as exc:  # noqa: BLE001
        report(t0, exc)
        raise Failed from exc


# ---- a rank killed between MoE calls, the next calls masked -----------------------------------

MOE_T, MOE_H, MOE_K, MOE_CAP = 6, 8, 3, 6    # tokens, hidden, top-k per rank; decode capacity


def moe_inputs(world: int, call: int):
    """Every rank's tokens, expert ids and weights of one call, from seeds: each rank computes all
    of them, for its torch reference. Small integers and weights in 1/8: exact in float32."""
    E = 2 * world
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(1000 * call + r)
        x = torch.randint(-8, 9, (MOE_T, MOE_H), generator=g).to(torch.float32)
        ids = torch.stack([torch.randperm(E, generator=g)[:MOE_K] for _ in range(MOE_T)]).to(torch.int32)
        ids[torch.rand(MOE_T, MOE_K, generator=g) < 0.2] = -1
        w = torch.randint(1, 8, (MOE_T, MOE_K), generator=g).to(torch.float32) / 8
        out.append((x, ids, w))
    return out


def moe_reference(world: int, live: list[bool], call: int, rank: int, capacity: int | None):
    """The torch reference of rank `rank` (plain loops, nothing of stratac's): the window it holds
    after the dispatch (rows by the contract's layout: packed, local expert by local expert, then
    source rank, then token; or slotted, (l * world + s) * capacity + j), the counts of every live
    source, and the combine's output when every expert multiplies its rows by (e + 1). An entry
    whose expert lives on a masked rank is dropped (no row, weight 0); masked ranks route nothing."""
    E = 2 * world
    L = E // world
    data = moe_inputs(world, call)
    keep = [[[bool(live[r] and 0 <= int(ids[t, k]) and live[int(ids[t, k]) // L]) for k in range(MOE_K)]
             for t in range(MOE_T)] for r, (_, ids, _) in enumerate(data)]
    counts = torch.zeros(world, E, dtype=torch.int32)
    for s, (_, ids, _) in enumerate(data):
        for t in range(MOE_T):
            for k in range(MOE_K):
                if keep[s][t][k]:
                    counts[s, int(ids[t, k])] += 1
    rows = world * MOE_T * MOE_K if capacity is None else E * capacity
    win = torch.zeros(rows, MOE_H)
    where = {}    # (source, t, k) -> (owner, row)
    for o in range(world):
        row = 0
        for l in range(L):
            e = o * L + l
            for s, (x, ids, _) in enumerate(data):
                j = 0
                for t in range(MOE_T):
                    for k in range(MOE_K):
                        if keep[s][t][k] and int(ids[t, k]) == e:
                            at = row if capacity is None else (l * world + s) * capacity + j
                            where[(s, t, k)] = (o, at)
                            if o == rank:
                                win[at] = x[t]
                            row += 1
                            j += 1
    x, ids, w = data[rank]
    y = torch.zeros(MOE_T, MOE_H)
    for t in range(MOE_T):
        for k in range(MOE_K):
            if keep[rank][t][k]:
                y[t] += w[t, k] * (int(ids[t, k]) + 1) * x[t]
    return data[rank], win, counts, y, where


def moe_expert_step(win: torch.Tensor, counts: torch.Tensor, rank: int, world: int, live: list[bool],
                    capacity: int | None) -> None:
    """The expert step stand-in on this rank's window: the rows of expert e times (e + 1), found
    from the count table's live rows (what a serving engine does with the counts)."""
    E = counts.shape[1]
    L = E // world
    row = 0
    for l in range(L):
        e = rank * L + l
        for s in range(world):
            if not live[s]:
                continue
            n = int(counts[s, e])
            at = row if capacity is None else (l * world + s) * capacity
            win[at:at + n] *= e + 1
            row += n


def masked_moe(comm, rank, world, arg):
    """Two MoE layers (prefill and decode dispatch, expert step, combine) on every rank, checked
    against the torch reference; then the last rank says READY and waits to be killed. The
    others wait until comm.dead_rank() names it, and run the next call of both layers with
    active = every rank but it: the dead rank's experts' entries are dropped, nobody waits for it,
    and every result (window, counts, output) matches the reference with its experts dropped."""
    pre, dec = comm.load(PREFILL), comm.load(DECODE)
    E = 2 * world
    x = comm.empty(MOE_T, MOE_H, dtype=torch.float32)
    ids = comm.empty(MOE_T, MOE_K, dtype=torch.int32)
    w = comm.empty(MOE_T, MOE_K, dtype=torch.float32)
    counts = comm.zeros(world, E, dtype=torch.int32)
    win = comm.zeros(world * MOE_T * MOE_K, MOE_H, dtype=torch.float32)
    dwin = comm.zeros(E * MOE_CAP, MOE_H, dtype=torch.float32)
    y = comm.empty(MOE_T, MOE_H, dtype=torch.float32)
    host_barrier(comm, "allocated")

    def layer(call: int, live: list[bool], capacity: int | None) -> None:
        (xi, idsi, wi), want_win, want_counts, want_y, where = moe_reference(world, live, call, rank,
                                                                              capacity)
        x.copy_(xi)
        ids.copy_(idsi)
        w.copy_(wi)
        before = counts.clone()
        window = win if capacity is None else dwin
        window.zero_()
        active = None if all(live) else torch.tensor(live)
        mod, d, c = (pre, "moe_prefill_dispatch", "moe_prefill_combine") if capacity is None else \
            (dec, "moe_decode_dispatch", "moe_decode_combine")
        # the window is zeroed on every rank before any rank writes into it (a decode dispatch
        # writes with no barrier first): a barrier of the live ranks, on the host
        if all(live):
            comm.barrier()
        else:
            store_barrier(STORE[0], sum(live), HOST_WAIT, f"{CURRENT[0]}/live/{call}")()
        getattr(mod, d)(x, ids, counts, window, cores=2, active=active)
        rows = {at for (o, at) in where.values() if o == rank}
        for at in range(window.shape[0]):      # rows the layout fills; the others stay zero
            if not torch.equal(window[at], want_win[at] if at in rows else torch.zeros(MOE_H)):
                raise AssertionError(f"call {call}: window row {at} is {window[at].tolist()}, the "
                                     f"reference {want_win[at].tolist()}")
        for s in range(world):
            want = want_counts[s] if live[s] else before[s]   # a masked rank's row is not written
            if not torch.equal(counts[s], want):
                raise AssertionError(f"call {call}: counts row {s} is {counts[s].tolist()}, want "
                                     f"{want.tolist()}")
        moe_expert_step(window, counts, rank, world, live, capacity)
        getattr(mod, c)(window, ids, w, counts, y, cores=2, active=active)
        if not torch.equal(y, want_y):
            raise AssertionError(f"call {call}: combine output {y.tolist()}, the reference "
                                 f"{want_y.tolist()}")

    t0 = time.monotonic()
    all_live = [True] * world
    try:
        layer(1, all_live, None)
        layer(2, all_live, MOE_CAP)
    except Exception as exc:  # noqa: BLE001
        report(t0, exc)
        raise Failed from exc
    host_barrier(comm, "first calls done")
    if rank == world - 1:
        say("READY", time.time())
        time.sleep(600)
        return
    # the survivors: wait for the death to be seen, then mask the dead rank
    deadline = time.monotonic() + HOST_WAIT
    while (gone := comm.dead_rank()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no dead rank seen within {HOST_WAIT} s")
        time.sleep(0.02)
    say("DEAD", gone[0])
    live = [r != gone[0] for r in range(world)]
    t0 = time.monotonic()
    try:
        say("ENTER", time.time())
        layer(3, live, None)
        layer(4, live, MOE_CAP)
        layer(5, live, None)       # a second masked call of the same instance
    except Exception as exc:  # noqa: BLE001
        report(t0, exc)
        raise Failed from exc
    say("MASKED", f"{time.monotonic() - t0:.3f}")
    comm.close(collective=False)   # a collective close would wait for the dead rank


# ---- long runs -------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32]
SIZES = [1, 7, 64, 1000, 4099]


def soak(comm, rank, world, arg):
    """`arg` back-to-back calls alternating AllReduce and AllGather, 5 sizes and 4 dtypes (2 cores),
    every result checked; every 50 calls one tensor is freed and allocated again. RSS and open file
    descriptors are measured after a warm-up and at the end."""
    calls = int(arg)
    ar, ag = comm.load(AR), comm.load(AG)
    bufs = {}
    for d in DTYPES:
        for n in SIZES:
            bufs[d, n] = (comm.empty(n, dtype=d), comm.empty(n * world, dtype=d))
    expected = {}
    for d in DTYPES:
        for n in SIZES:
            for k in range(64):
                xs = inputs(world, n, k, d)
                expected[d, n, k] = (xs[rank], torch.stack([x.float() for x in xs]).sum(0).to(d),
                                     torch.cat(xs))
    warm = min(200, calls // 4)
    start = None
    t0 = time.monotonic()
    for it in range(calls):
        if it == warm:
            comm.barrier()
            start = (_rss(), _fds(), time.monotonic())
        d = DTYPES[(it // 2) % len(DTYPES)]
        n = SIZES[(it // 8) % len(SIZES)]
        mine, total, gathered = expected[d, n, it % 64]
        x, out = bufs[d, n]
        x.copy_(mine)
        if it % 2 == 0:
            ar.allreduce_twoshot(x, op="sum", cores=2)
            if not torch.equal(x, total):
                raise AssertionError(f"call {it}: allreduce {d} n={n} wrong on rank {rank}")
        else:
            ag.allgather_push(x, out, cores=2)
            if not torch.equal(out, gathered):
                raise AssertionError(f"call {it}: allgather {d} n={n} wrong on rank {rank}")
        if it % 50 == 49:   # allocator churn: free and allocate the same shape again (collective)
            comm.free(out)
            out = comm.empty(n * world, dtype=d)
            bufs[d, n] = (x, out)
    comm.barrier()
    end = (_rss(), _fds(), time.monotonic())
    say("STATS", json.dumps({"rank": rank, "calls": calls, "seconds": end[2] - t0,
                             "rss_start": start[0], "rss_end": end[0], "fds_start": start[1],
                             "fds_end": end[1], "measured_calls": calls - warm,
                             "measured_seconds": end[2] - start[2], "heap_used": comm.heap_used}))


def oversubscribed(comm, rank, world, arg):
    """Far more threads than CPUs: 20 checked AllReduce calls (64 KiB) with 16 cores per rank, then
    20 with 48 (each core with its SDMA engine thread; compiled for Ascend910B1, whose 48 vector
    cores allow it)."""
    ar = comm.load(AR, options=passes.Options(soc="Ascend910B1"))
    n = 16384
    x = comm.empty(n, dtype=torch.float32)
    stats = {"rank": rank, "calls": 20}
    for cores in (16, 48):
        comm.barrier()
        t0 = time.monotonic()
        for it in range(20):
            xs = inputs(world, n, it, torch.float32)
            x.copy_(xs[rank])
            ar.allreduce_twoshot(x, op="sum", cores=cores)
            if not torch.equal(x, torch.stack(xs).sum(0)):
                raise AssertionError(f"call {it} with {cores} cores wrong on rank {rank}")
        stats[f"seconds_{cores}"] = time.monotonic() - t0
    say("STATS", json.dumps(stats))


SCENARIOS = {f.__name__: f for f in (skip_call, hang_flag, victim, soak, oversubscribed, masked_moe,
                                      signalled)}


def host_barrier(comm, what: str) -> None:
    """A barrier of the job's ranks over the store that waits up to HOST_WAIT, not the
    communicator's timeout; it ends early when the pool is aborted or a peer died (check_pool)."""
    store_barrier(STORE[0], comm.world, HOST_WAIT, f"{CURRENT[0]}/{what}", rank=comm.rank,
                  check=lambda where: check_pool(comm._lib, comm.rank, where))()


def wait_timeout(name: str, rank: int, world: int, timeout: float) -> float:
    """The communicator's timeout in scenario `name`: TIMEOUT for the ranks whose waits are under
    test, 60 s for everything else (skip_call's last rank never calls: it must not time out)."""
    if name == "hang_flag" or (name == "skip_call" and rank != world - 1):
        return timeout
    return HOST_WAIT


def main(scenarios: str, rank: int, world: int, store_path: str, timeout: float, arg: str) -> int:
    # a rank under torchrun gets Python's own SIGINT handler; a test run started in the background
    # of a non-interactive shell would hand its children SIGINT ignored (POSIX), and then no
    # program, with or without stratac, sees a KeyboardInterrupt (the signal scenarios)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    store = dist.FileStore(store_path, world)
    STORE[:] = [store]
    status = 0
    for name in scenarios.split(","):
        CURRENT[0] = name
        # every rank is here before any starts the bootstrap, whose barriers use the (short) timeout
        store_barrier(store, world, HOST_WAIT, f"{name}/start", rank=rank)()
        comm = Communicator.from_store(rank, world, store, heap_bytes=16 << 20,
                                       timeout=wait_timeout(name, rank, world, timeout), prefix=name)
        if rank == 0:
            say("SEGMENT", comm.segment)
        try:
            SCENARIOS[name](comm, rank, world, arg)
        except Failed:
            comm.close(collective=False)
            status = 3
            continue
        comm.close()
        say("PASS")
    return status


if __name__ == "__main__":
    rc = main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]),
              sys.argv[6] if len(sys.argv) > 6 else "")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
