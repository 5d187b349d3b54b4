"""`stratac run` under faults: `--timeout` reaches the kernels' waits, a stopped or killed rank
ends the whole job promptly with a diagnosis, the runner reaps every rank it started, no segment is
left in /dev/shm, and the next run works."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from faultkit import ROOT, descendants, leftover_segments, mapped_segments

from stratac.tools.run import runner, worker

AR = ROOT / "examples" / "allreduce_twoshot.strata"


def _workers(parent: int, ready: Path, world: int) -> dict[int, int]:
    """rank -> pid of the `stratac run` rank processes, as each wrote it to its ready file; every
    one a process below `parent` (forked from the runner's server, stratac.tools.run.procs)."""
    out = {r: int((ready / f"rank{r}").read_text()) for r in range(world)}
    below = set(descendants(parent))
    assert set(out.values()) <= below, (out, below)
    return out


def _wait_in_loop(parent: int, world: int, alive, ready: Path) -> dict[int, int]:
    """Once every rank is in its timed loop: each says so through the worker's test hook
    STRATAC_TEST_READY (a file per rank in `ready`), written after the last host collective before
    the loop, so that a rank stopped or killed from then on is stopped between or in kernel calls.
    The one deadline is the case's (RUN_LIMIT)."""
    deadline = time.monotonic() + RUN_LIMIT
    while time.monotonic() < deadline and alive():
        if all((ready / f"rank{r}").exists() for r in range(world)):
            return _workers(parent, ready, world)
        time.sleep(0.02)
    raise AssertionError("the ranks of stratac run did not reach their timed loops")


RUN_LIMIT = 300   # seconds: how long a case may take on a busy machine before it counts as hung
LONG = ["--count", "4096", "--cores", "2", "--iters", "1000000"]   # a timed loop far longer than the test


def test_cli_timeout_reaches_the_waits_and_a_stopped_rank_is_stopped(tmp_path):
    """`stratac run --timeout 2` with rank 1 stopped (SIGSTOP) in the timed loop: ranks 0 and 2 time
    out 2 s later naming rank 1; the runner stops rank 1 after its grace period and exits 1."""
    ready = tmp_path / "ready"
    ready.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "stratac", "run", str(AR), "--world", "3", *LONG,
                             "--timeout", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **{worker.TEST_READY_ENV: str(ready)}))
    try:
        workers = _wait_in_loop(proc.pid, 3, lambda: proc.poll() is None, ready)
        names = mapped_segments(workers.values())
        os.kill(workers[1], signal.SIGSTOP)
        out, err = proc.communicate(timeout=RUN_LIMIT)
    finally:
        proc.kill()
    # no wall-clock bound: the messages say which deadline ended it (the kernels' 2 s wait, then the
    # runner's grace period), and the case's one deadline (RUN_LIMIT) catches a hang
    assert proc.returncode == 1, err
    # the first wait to expire names rank 1's slot, or that of a rank held up behind rank 1 (still
    # in the previous call, waiting for rank 1 there); either way rank 1 has not arrived
    assert re.search(r"stratac: rank [02] exited with status 1:\n.*allreduce_twoshot failed on rank [02]: "
                     r"rank [02] core [01] strata:\d+ kernel allreduce_twoshot_f32(?:_sum)?: "
                     r"aclshmem_signal_wait_until timed out after 2 s: barrier slot of rank [12] ", err), err
    assert "ranks that have not arrived at this barrier: 1" in err
    assert re.search(r"stratac: rank 1: still running 2 s after rank [02] failed; stopped", err), err
    for pid in workers.values():
        assert not os.path.exists(f"/proc/{pid}"), "a rank process is left (or a zombie)"
    assert len(names) == 1, names
    assert leftover_segments(names) == set()


def test_killed_rank_ends_the_run_promptly_and_the_next_run_works(tmp_path, monkeypatch):
    """runner.run (as `stratac run` calls it) with a 30 s timeout; rank 2 is SIGKILLed in the timed
    loop. The others report it gone (not at the timeout), the runner returns 1, every rank is
    reaped, nothing is left in /dev/shm, and a normal run right after works."""
    ready = tmp_path / "ready"
    ready.mkdir()
    monkeypatch.setenv(worker.TEST_READY_ENV, str(ready))
    spec = runner.RunSpec(file=str(AR), world=3, cases=[runner.Case(count=4096)], iters=1000000,
                          warmup=0, cores=2, timeout=30)
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("out", runner.run(spec, echo=lambda s: None)))
    th.start()
    workers = _wait_in_loop(os.getpid(), 3, th.is_alive, ready)
    names = mapped_segments(workers.values())
    os.kill(workers[2], signal.SIGKILL)
    t0 = time.monotonic()
    th.join(timeout=RUN_LIMIT)
    took = time.monotonic() - t0
    assert not th.is_alive()
    out = result["out"]
    assert out.exit_code == 1
    assert took < spec.timeout, took          # reported gone, not at the waits' timeout
    text = "\n".join(out.failures)
    assert out.failures[0].startswith("rank 2 was killed by SIGKILL"), text
    for r in (0, 1):
        assert re.search(rf"rank {r} exited with status 1:\n(.*\n)*.*rank 2 is gone: process {workers[2]} "
                         r"(no longer exists|has exited \(a zombie, not yet reaped\)) \(killed or crashed\) "
                         r"without leaving the pool", text), text
    for pid in workers.values():
        assert not os.path.exists(f"/proc/{pid}")
    assert len(names) == 1, names
    assert leftover_segments(names) == set()
    # the next run on the machine works
    monkeypatch.delenv(worker.TEST_READY_ENV)
    ok = runner.run(runner.RunSpec(file=str(AR), world=3, cases=[runner.Case(count=1000)], iters=2,
                                   warmup=0, cores=2, timeout=30), echo=lambda s: None)
    assert ok.exit_code == 0 and ok.failures == [] and all(r["ok"] for r in ok.results)


def test_cli_refuses_a_bad_timeout(tmp_path):
    p = subprocess.run([sys.executable, "-m", "stratac", "run", str(AR), "--world", "1", "--timeout", "0"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert "--timeout: must be a positive number of seconds, got 0" in p.stderr
