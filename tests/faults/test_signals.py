"""SIGINT and SIGTERM to a rank blocked in a kernel wait (a peer that never arrives): the wait
stops at its next poll, not at its timeout (60 s here), the rank ends as the signal says, the peer
stops too, naming the signal, and no shared-memory segment is left (runtime/cpu/src/host_signals.cpp
OnHostSignal; docs/robustness.md, "Signals"). Real processes (tests/faults/ranks.py `signalled`):
the test sends the signal once rank 1 has seen rank 0 announce its arrival at the kernel's first
barrier, so the signal lands inside the launch, in the wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from faultkit import leftover_segments

# seconds from the signal to the end of rank 0 (its wait polls every few ms; a SIGTERM exit also
# tears down torch, about a second on a busy two-core machine), against the 60 s wait timeout
PROMPT = 10.0
INTERRUPTED = ("aclshmem_signal_wait_until interrupted: this rank's process got {sig}; the launch is "
               "abandoned")


def _signal_in_the_wait(ranks, sig, arg=""):
    """Starts the scenario, sends `sig` to rank 0 once it waits in the kernel, and returns the job
    and the seconds until rank 0 ended."""
    job = ranks("signalled", 2, 60.0, arg)
    job.wait_for("READY signalled", [1], limit=300)
    time.sleep(0.2)                          # rank 0 polls its barrier slot meanwhile
    assert job.ranks[0].proc.poll() is None
    sent = time.monotonic()
    os.kill(job.ranks[0].proc.pid, sig)
    job.ranks[0].proc.wait(timeout=60)
    took = time.monotonic() - sent
    job.wait(limit=60)
    return job, took


def _peer_names_the_signal(job, sig):
    line = job.ranks[1].first("ERROR signalled")
    assert line is not None, (job.ranks[1].out, job.ranks[1].err)
    assert "the job is aborted: rank 0 core" in line and INTERRUPTED.format(sig=sig) in line, line
    assert job.ranks[1].proc.returncode == 3
    assert not leftover_segments(job.segments()), job.segments()


def test_sigint_in_a_kernel_wait_raises_keyboard_interrupt_promptly(ranks):
    job, took = _signal_in_the_wait(ranks, signal.SIGINT)
    r0 = job.ranks[0]
    assert took < PROMPT, took
    assert r0.first("INTERRUPTED signalled") is not None, (r0.out, r0.err)
    assert r0.first("RETURNED signalled") is None and r0.proc.returncode == 3
    assert "Traceback" not in r0.err, r0.err
    _peer_names_the_signal(job, "SIGINT")


def test_sigterm_in_a_kernel_wait_exits_cleanly_with_a_message(ranks):
    """Under the default SIGTERM action (a torchrun worker's) the process used to die inside the
    kernel; now the launch stops, and the communicator ends the process: a message and 143."""
    job, took = _signal_in_the_wait(ranks, signal.SIGTERM)
    r0 = job.ranks[0]
    assert took < PROMPT, took
    assert r0.proc.returncode == 128 + signal.SIGTERM, (r0.proc.returncode, r0.err)
    assert ("stratac: rank 0: SIGTERM while allreduce_twoshot ran: the call was abandoned (its waits "
            "stopped; the pool is aborted, so every rank's call fails); exiting") in r0.err, r0.err
    assert "Traceback" not in r0.err and r0.first("RETURNED signalled") is None
    _peer_names_the_signal(job, "SIGTERM")


def test_sigterm_reaches_the_programs_own_handler_promptly(ranks):
    """A program's own SIGTERM handler (a Python one, as a launcher may install) used to run only
    once the wait timed out; it runs as soon as the launch stops, and its exception propagates."""
    job, took = _signal_in_the_wait(ranks, signal.SIGTERM, "handler")
    r0 = job.ranks[0]
    assert took < PROMPT, took
    line = r0.first("TERMINATED signalled")
    assert line is not None, (r0.out, r0.err)
    assert line.split(" ", 1)[1] == f"signal {int(signal.SIGTERM)}", line
    assert r0.proc.returncode == 3, (r0.proc.returncode, r0.err)
    _peer_names_the_signal(job, "SIGTERM")


IDLE = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)   # as in ranks.main: Python's own, inherited or not
from stratac.host.comm import Communicator, _segment_name, unlink_segment
name = _segment_name()
comm = Communicator(0, 1, segment=name, create=True, heap_bytes=1 << 20)
unlink_segment(name)        # as the bootstrap does: the kernel frees it with the last mapping
print("READY", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_outside_a_launch_a_signal_does_what_it_did(sig, tmp_path):
    """The model's handler stays on for the communicator's lifetime; outside a launch it only hands
    the signal on: an idle rank still dies of SIGTERM at once (the default action, re-raised) and
    still ends in Python's KeyboardInterrupt on SIGINT (the interpreter then re-raises SIGINT)."""
    p = subprocess.Popen([sys.executable, "-c", IDLE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
        sent = time.monotonic()
        p.send_signal(sig)
        p.wait(timeout=30)
        assert time.monotonic() - sent < PROMPT
        err = p.stderr.read()
        assert p.returncode == -sig, (p.returncode, err)
        assert ("KeyboardInterrupt" in err) == (sig == signal.SIGINT), err
        assert "stratac:" not in err, err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
