"""`stratac run` under faults: `--timeout` reaches the kernels' waits, a stopped or killed rank
ends the whole job promptly with a diagnosis, the runner reaps every rank it started, no segment is
left in /dev/shm, and the next run works."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from faultkit import ROOT, descendants, leftover_shm, shm_names

from stratac.tools.run import runner

AR = ROOT / "examples" / "allreduce_twoshot.strata"


def _workers(parent: int) -> dict[int, int]:
    """rank -> pid of the `stratac run` rank processes below `parent`."""
    out = {}
    for pid in descendants(parent):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"stratac.tools.run.worker" in argv:
            out[json.loads(argv[argv.index(b"stratac.tools.run.worker") + 1])["rank"]] = pid
    return out


def _wait_in_loop(parent: int, world: int, alive) -> dict[int, int]:
    """Once every rank has its kernels loaded, and half a second more (in the timed loop)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and alive():
        workers = _workers(parent)
        loaded = 0
        for pid in workers.values():
            try:
                with open(f"/proc/{pid}/maps") as f:
                    loaded += "liballreduce_twoshot.so" in f.read()
            except OSError:
                pass
        if len(workers) == world and loaded == world:
            time.sleep(0.5)
            return workers
        time.sleep(0.05)
    raise AssertionError("the ranks of stratac run did not get going")


LONG = ["--count", "4096", "--cores", "2", "--iters", "1000000"]   # a timed loop far longer than the test


def test_cli_timeout_reaches_the_waits_and_a_stopped_rank_is_stopped(tmp_path):
    """`stratac run --timeout 2` with rank 1 stopped (SIGSTOP) in the timed loop: ranks 0 and 2 time
    out 2 s later naming rank 1; the runner stops rank 1 after its grace period and exits 1."""
    before = shm_names()
    proc = subprocess.Popen([sys.executable, "-m", "stratac", "run", str(AR), "--world", "3", *LONG,
                             "--timeout", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = _wait_in_loop(proc.pid, 3, lambda: proc.poll() is None)
        os.kill(workers[1], signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode == 1, err
    assert 2.0 <= took < 2.0 + runner.GRACE_S + 3.0, took
    assert re.search(r"stratac: rank [02] exited with status 1:\n.*allreduce_twoshot failed on rank [02]: "
                     r"rank [02] core [01] strata:\d+ kernel allreduce_twoshot_f32(?:_sum)?: "
                     r"aclshmem_signal_wait_until timed out after 2 s: barrier slot of rank 1 ", err), err
    assert "ranks that have not arrived at this barrier: 1" in err
    assert re.search(r"stratac: rank 1: still running 2 s after rank [02] failed; stopped", err), err
    for pid in workers.values():
        assert not os.path.exists(f"/proc/{pid}"), "a rank process is left (or a zombie)"
    assert leftover_shm(before) == set()


def test_killed_rank_ends_the_run_promptly_and_the_next_run_works():
    """runner.run (as `stratac run` calls it) with a 30 s timeout; rank 2 is SIGKILLed in the timed
    loop. The others report it gone within a fraction of a second, the runner returns 1 at once,
    every rank is reaped, nothing is left in /dev/shm, and a normal run right after works."""
    before = shm_names()
    spec = runner.RunSpec(file=str(AR), world=3, cases=[runner.Case(count=4096)], iters=1000000,
                          warmup=0, cores=2, timeout=30)
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("out", runner.run(spec, echo=lambda s: None)))
    th.start()
    workers = _wait_in_loop(os.getpid(), 3, th.is_alive)
    os.kill(workers[2], signal.SIGKILL)
    t0 = time.monotonic()
    th.join(timeout=60)
    took = time.monotonic() - t0
    assert not th.is_alive()
    out = result["out"]
    assert out.exit_code == 1
    assert took < 3.0, took                    # the waits' timeout is 30 s
    text = "\n".join(out.failures)
    assert out.failures[0].startswith("rank 2 was killed by SIGKILL"), text
    for r in (0, 1):
        assert re.search(rf"rank {r} exited with status 1:\n(.*\n)*.*rank 2 is gone: process {workers[2]} "
                         r"(no longer exists|has exited \(a zombie, not yet reaped\)) \(killed or crashed\) "
                         r"without leaving the pool", text), text
    for pid in workers.values():
        assert not os.path.exists(f"/proc/{pid}")
    assert leftover_shm(before) == set()
    # the next run on the machine works
    ok = runner.run(runner.RunSpec(file=str(AR), world=3, cases=[runner.Case(count=1000)], iters=2,
                                   warmup=0, cores=2, timeout=30), echo=lambda s: None)
    assert ok.exit_code == 0 and ok.failures == [] and all(r["ok"] for r in ok.results)
    assert leftover_shm(before) == set()


def test_cli_refuses_a_bad_timeout(tmp_path):
    p = subprocess.run([sys.executable, "-m", "stratac", "run", str(AR), "--world", "1", "--timeout", "0"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert "--timeout: must be a positive number of seconds, got 0" in p.stderr
