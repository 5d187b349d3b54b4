"""Through the Python API (Communicator(timeout=...)): a wait that never comes ends at the timeout
with a message naming the schedule, the .strata line, rank, core, the flag, the values expected and
seen and who has not arrived; a peer killed while others wait for it is reported by them at once,
not at the timeout; many more threads than CPUs still complete. Nothing is left in /dev/shm."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from faultkit import ROOT, leftover_segments

AR = ROOT / "examples" / "allreduce_twoshot.strata"


def schedule_line(path) -> int:
    """The line of a file's first schedule header: where a kernel's agreement of the ranks (its
    first statement, a barrier of the live ranks) is attributed."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("schedule "))


WORLD = 4
TIMEOUT = 2.0        # the wait timeout of skip_call's calling ranks
VICTIM_TIMEOUT = 60.0  # the wait timeout in the victim scenario (ranks.py HOST_WAIT)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One job of 4 ranks running three scenarios in turn (each on a fresh communicator).

    oversubscribed: 4 ranks x 16 cores, then 4 ranks x 48 cores, on this (2-CPU) machine.

    skip_call (Communicator(timeout=2) on ranks 0-2): rank 3 never calls the two-shot AllReduce.
    Ranks 0-2 stop after 2 s in the first barrier, naming rank 3 as the one not arrived; rank 3,
    waiting in a host barrier with a 60 s timeout, stops when the pool is aborted. The 2 s kernel
    wait is the case's only deadline (ranks.py: the host waits around it take up to 60 s), so a
    busy machine cannot make another 2 s deadline expire first.

    victim (timeout 60 s): ranks 0-2 call, rank 3 does not and is SIGKILLed once it has seen all
    of them announce their arrival at the kernel's first barrier (its READY). It stays a zombie
    (this fixture is its parent and reaps it only at the end)."""
    from faultkit import Ranks
    tmp = tmp_path_factory.mktemp("api_faults")
    j = Ranks("oversubscribed,skip_call,victim", WORLD, tmp, TIMEOUT)
    try:
        j.wait_for("READY victim", [WORLD - 1], limit=300)
        victim = j.ranks[-1].proc
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        j.wait_for("ERROR victim", range(WORLD - 1), limit=30)
        j.detected = time.monotonic() - killed
        for rk in j.ranks[:-1]:
            rk.proc.wait(timeout=30)
        victim.wait()
        j.read()
        yield j
    finally:
        j.kill()


def test_oversubscribed_ranks_and_cores_complete(job):
    """4 ranks x 16 and x 48 cores (with an SDMA thread per core) on 2 CPUs: every call right and
    no wait ran into its 60 s timeout (waits back off and yield). No wall-clock bound beyond that:
    the times depend on what else the machine runs."""
    for r, rk in enumerate(job.ranks):
        assert rk.first("PASS oversubscribed") is not None, (rk.out, rk.err)
        stats = json.loads(rk.first("STATS oversubscribed"))
        assert stats["calls"] == 20 and {"seconds_16", "seconds_48"} <= stats.keys(), stats


def test_a_rank_that_never_arrives_times_out_with_a_diagnosis(job):
    line = schedule_line(AR)   # a missing rank is waited for at the agreement
    last = WORLD - 1
    waited = []
    for r, rk in enumerate(job.ranks):
        assert rk.first("ERROR skip_call") is not None, (rk.out, rk.err)
        elapsed, msg = rk.first("ERROR skip_call").split(" ", 1)
        if r == last:
            # never its own (60 s) timeout: the abort of the pool by the rank that timed out
            assert msg.startswith(f"rank {last}: store barrier 1: the job is aborted: "), msg
        else:
            # its own timeout, or the abort by the peer that timed out first (which quotes it)
            assert f"allreduce_twoshot failed on rank {r}: rank {r} core " in msg, msg
            waited.append(float(elapsed))
    # the first rank to give up waited the whole timeout (the others may have started later)
    assert max(waited) >= TIMEOUT, waited
    for r, rk in enumerate(job.ranks):
        msg = rk.first("ERROR skip_call").split(" ", 1)[1]
        m = re.search(rf"rank (\d) core (\d) strata:(\d+) kernel allreduce_twoshot_f32(?:_sum)?: "
                      rf"aclshmem_signal_wait_until timed out after 2 s: barrier slot of rank {last} "
                      rf"\(flag at rank \1 heap offset \d+ \(0x[0-9a-f]+\)\): ACLSHMEM_CMP_GE "
                      rf"\(expected >= (\d+)\), seen 0 \(never signalled\); ranks that have not arrived "
                      rf"at this barrier: {last}$", msg)
        assert m, msg
        assert int(m.group(1)) < last and int(m.group(2)) == last % 2   # cores=2: core p % 2 waits for p
        assert int(m.group(3)) == line


def test_a_killed_rank_is_reported_gone_by_the_others(job):
    last = WORLD - 1
    victim = job.ranks[last].proc
    assert job.detected < VICTIM_TIMEOUT, job.detected   # reported as gone, not at the timeout
    for r, rk in enumerate(job.ranks[:last]):
        msg = rk.first("ERROR victim").split(" ", 1)[1]
        assert rk.proc.returncode == 3, (rk.out, rk.err)
        assert msg.startswith(f"allreduce_twoshot failed on rank {r}: rank "), msg
        assert re.search(rf"rank {last} is gone: process {victim.pid} (has exited \(a zombie, not yet "
                         rf"reaped\)|no longer exists) \(killed or crashed\) without leaving the pool; this "
                         rf"core was waiting for barrier slot of rank {last} ", msg), msg
    assert victim.returncode == -signal.SIGKILL


def test_nothing_is_left_in_dev_shm(job):
    """The job's own segments (their names are in its store, one per scenario) are gone; other
    jobs' segments on the machine are not counted."""
    names = job.segments()
    assert len(names) == 3 and len(set(names)) == 3, names
    assert leftover_segments(names) == set()


def test_named_flag_wait_names_the_flag_and_slot(ranks):
    """tests/faults/hang_flag.strata, compiled without verification (a test hook in ranks.py):
    rank 0 waits for go[0], which no rank signals; the timeout names the flag and slot and lists
    the slots of the flag not signalled in this call."""
    from stratac import codegen
    from stratac.ir import passes
    from stratac.lang import frontend
    from stratac.targets import cpu as build
    s = frontend.schedules(frontend.load_source(ROOT / "tests" / "faults" / "hang_flag.strata"))[0]
    # built here once (as ranks.py's test hook builds it), so that the ranks find it cached
    build.build_cpu(codegen.generate(passes.pipeline(s, passes.Options(cores=2))))
    job = ranks("hang_flag", 2, timeout=1.5)
    job.wait(limit=60)
    msg = job.ranks[0].first("ERROR hang_flag")
    assert msg is not None, (job.ranks[0].out, job.ranks[0].err)
    assert re.search(r"hang_flag failed on rank 0: rank 0 core 0 strata:9 kernel hang_flag_f32: "
                     r"aclshmem_signal_wait_until timed out after 1.5 s: flag go\[0\] \(flag at rank 0 "
                     r"heap offset \d+ \(0x[0-9a-f]+\)\): ACLSHMEM_CMP_GE \(expected >= \d+\), seen 0 "
                     r"\(never signalled\); slots of go on rank 0 not yet signalled in this call: 0 "
                     r"\(of 2\)", msg), msg
    for rk in job.ranks:
        assert rk.proc.returncode != 0


def test_a_masked_moe_call_after_a_rank_is_killed_completes_on_the_others(tmp_path):
    """masked_moe (ranks.py), 4 ranks: a prefill and a decode MoE layer (dispatch, expert step,
    combine) on every rank, checked against the torch reference; then rank 3 is SIGKILLed between
    calls. The survivors see it dead (comm.dead_rank()), and their next calls with active = ranks
    0-2 (prefill, decode, prefill again) complete with every window row, count row and combine
    output equal to the reference with rank 3's experts dropped; nobody waits for rank 3, and the
    dead rank does not abort the masked calls' waits."""
    from faultkit import Ranks
    j = Ranks("masked_moe", WORLD, tmp_path, VICTIM_TIMEOUT)
    try:
        j.wait_for("READY masked_moe", [WORLD - 1], limit=300)
        victim = j.ranks[-1].proc
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        for rk in j.ranks[:-1]:
            rk.proc.wait(timeout=120)
        j.read()
        for r, rk in enumerate(j.ranks[:-1]):
            assert rk.proc.returncode == 0, (r, rk.out, rk.err)
            assert rk.first("DEAD masked_moe") == str(WORLD - 1), rk.out
            assert rk.first("MASKED masked_moe") is not None, rk.out
            assert rk.first("PASS masked_moe") is not None, rk.out
            assert rk.first("ERROR masked_moe") is None, rk.out
        assert victim.returncode == -signal.SIGKILL
    finally:
        j.kill()
