"""The runner starts each rank in a process group of its own (so that it can kill what it started)
but in the runner's session: with autogroup scheduling every session is a scheduling group, and a
rank's sched_yield could not hand the CPU to a peer of another session (docs/bench.md, "4 KiB on 4
ranks: waiting when ranks outnumber CPUs"). mpirun's ranks share its session in the same way."""
import os
import subprocess
import sys

from stratac.tools.run import runner


def test_a_rank_shares_the_runner_session_in_a_group_of_its_own():
    code = "import os; print(os.getpid(), os.getpgid(0), os.getsid(0))"
    p = subprocess.run([sys.executable, "-c", code], preexec_fn=runner._rank_preexec,
                       capture_output=True, text=True, check=True)
    pid, pgid, sid = map(int, p.stdout.split())
    assert pgid == pid, "the rank leads a process group of its own (killpg reaches it alone)"
    assert pgid != os.getpgid(0)
    assert sid == os.getsid(0), "the rank is in the runner's session (one scheduling group)"
