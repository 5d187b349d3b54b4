"""Rank processes forked from one server that has imported torch, instead of started afresh.

Every rank is a Python process that imports torch (about 1.2 s of CPU here) before its first line
of work; started with subprocess, every rank of every run pays it again. Here a rank is forked
from a multiprocessing forkserver that imported torch, torch.distributed and stratac's host once, when
this process asked for its first rank. The server lives as long as this process (`stratac run`, or
a test session that starts many runs) and exits when it does; a rank dies with the server.

A forked rank is what a started one was: its own process group in the caller's session (see
rank_preexec below for why not a session of its own), SIGKILLed if its parent dies, stdin on
/dev/null, stdout and stderr on the caller's files, the caller's environment and working directory
of the moment of the call, Python's default signal handlers. It runs `python -m MODULE ARGS` or
`python SCRIPT ARGS` the way the interpreter would (runpy; a SystemExit's status, a traceback and
status 1 for an exception, atexit handlers at the end) and skips only the interpreter's teardown.
What differs: /proc/PID/cmdline is the server's, not the rank's argv (a test that looks for its
ranks asks them for their pid), and a module imported by the server is not re-imported by the rank.
If the forkserver was started by someone else before us (a program's own multiprocessing), our
preload is not applied and each rank imports torch itself: slower, not different.

In: argv without the interpreter (["-m", MODULE, ARG...] or [SCRIPT, ARG...]), the open files for
stdout and stderr, env, cwd. Out: a Rank with Popen's pid, poll(), wait(timeout) and returncode.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from multiprocessing import reduction

# what every rank imports first; not the module a rank runs (runpy runs it as __main__, afresh, and
# warns when it is already imported, since the two copies would differ)
PRELOAD = ["torch", "torch.distributed", "stratac.host.comm", "stratac.tools.run.workload"]
_lock = threading.Lock()
_context = None


def _forkserver():
    """The forkserver context, its server started on first use with torch imported (and one thread
    for OpenMP: the server's environment is what torch reads at import)."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            from multiprocessing import forkserver
            saved = os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = "1"
            try:
                forkserver.ensure_running()
            finally:
                if saved is None:
                    del os.environ["OMP_NUM_THREADS"]
                else:
                    os.environ["OMP_NUM_THREADS"] = saved
            _context = ctx
        return _context


class _Fd:
    """A file descriptor of the caller handed to the forked rank (sent over the forkserver's socket
    when the rank's arguments are pickled, as multiprocessing sends its own pipes)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return (_attached, (reduction.DupFd(self.fd),))


def _attached(dup) -> int:
    return dup.detach()


class Rank:
    """One forked rank, with the part of subprocess.Popen's interface the runners use."""

    def __init__(self, argv: list[str], stdout, stderr, env: dict[str, str], cwd: str | None = None):
        ctx = _forkserver()
        fds = [_Fd(f.fileno() if f is not None else n) for n, f in ((1, stdout), (2, stderr))]
        self._proc = ctx.Process(target=_rank_main, args=(list(argv), fds, dict(env), cwd or os.getcwd()),
                                 name=f"stratac-rank {' '.join(argv[:2])}")
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(["stratac-rank"], timeout)
        return self._proc.exitcode


def _rank_main(argv: list[str], fds: list[int], env: dict[str, str], cwd: str) -> None:
    """In the forked rank: become the process `python ARGV` would have been, run it, exit."""
    import atexit
    import runpy
    import traceback

    status, interrupted = 1, False
    try:
        rank_preexec()
        if os.getppid() == 1:   # the server (and so the caller) died before PDEATHSIG was set
            os._exit(1)
        for target, fd in zip((1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = list(argv) if argv[0] != "-m" else [argv[1]] + list(argv[2:])
        try:
            if argv[0] == "-m":
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
                runpy.run_path(argv[0], run_name="__main__")
            status = 0
        except SystemExit as exc:
            code = exc.code
            if code is None:
                status = 0
            elif isinstance(code, int):
                status = code & 0xff
            else:
                print(code, file=sys.stderr)
                status = 1
        except KeyboardInterrupt:   # the interpreter then ends itself by SIGINT
            traceback.print_exc()
            interrupted = True
        except BaseException:   # noqa: BLE001 - what the interpreter prints for an uncaught exception
            traceback.print_exc()
            status = 1
        try:
            threading._shutdown()   # the interpreter waits for non-daemon threads, so we do
        except Exception:   # noqa: BLE001
            pass
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status)


def rank_preexec() -> None:
    """In a rank process before it runs: a process group of its own (so that killing the group
    reaches what it started) but the runner's session, and die_with_parent. Not a session of its
    own: with the kernel's autogroup scheduling (sched_autogroup_enabled) every session is a
    scheduling group of its own, and sched_yield never hands the CPU to another group, so a rank's
    yield could not let a peer rank run (mpirun's ranks share its session too; docs/bench.md,
    "4 KiB on 4 ranks")."""
    os.setpgid(0, 0)
    die_with_parent()


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:   # noqa: BLE001 - best effort; the runner's deadline still applies
        pass


def kill(ranks) -> None:
    """SIGKILL every rank still running, with its process group, and reap them all."""
    for p in ranks:
        if p.poll() is None:
            for send in (os.killpg, os.kill):   # os.kill: a rank not yet in its own group
                try:
                    send(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for p in ranks:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
