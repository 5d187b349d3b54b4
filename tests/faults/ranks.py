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
        fn._check_instance = lambda params: None
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


SCENARIOS = {f.__name__: f for f in (skip_call, hang_flag, victim, soak, oversubscribed)}


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
