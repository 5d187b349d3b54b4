"""The MPI peer seen from the bench's own process: is MPI usable, install it, and run the peer as
its own mpirun job beside the stratac ranks.

In: the world size and the bench's peer spec (tasks per case, the gate's directory, iterations),
the same dict the ranks get. Out: setup_mpi's version line (or BenchError naming the failing step);
MpiJob's measurements (the STRATAC-PEER lines of benchpeer.mpi_main) and, if the job failed, why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from stratac.tools.bench import benchpeer
from stratac.tools.bench.benchspec import BenchError

MPI_APT = ["openmpi-bin", "libopenmpi-dev"]

# the directory that holds the stratac package: the MPI job imports benchpeer from the same tree
PKG_ROOT = str(Path(__file__).resolve().parents[3])


def _mpi_problem() -> str | None:
    """None when mpirun and mpi4py are usable, else what is missing."""
    if shutil.which("mpirun") is None:
        return "mpirun is not on PATH"
    probe = subprocess.run([sys.executable, "-c", "import mpi4py, mpi4py.MPI"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"mpi4py cannot be imported ({last})"
    return None


def _step(cmd: list[str], echo, env=None) -> None:
    echo("stratac bench: $ " + " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except FileNotFoundError:
        raise BenchError(f"cannot set up MPI: {cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise BenchError(f"cannot set up MPI: `{' '.join(cmd)}` did not finish in 30 minutes") from None
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
        raise BenchError(f"cannot set up MPI: `{' '.join(cmd)}` failed with status {p.returncode}"
                         + (f":\n{tail}" if tail else ""))


def setup_mpi(echo=print) -> str:
    """Installs Open MPI (apt-get) and mpi4py (pip) where they are missing; returns the library
    version line. Raises BenchError with the failing step's output on failure."""
    problem = _mpi_problem()
    if problem is None:
        return mpi_version()
    echo(f"stratac bench: MPI is not ready ({problem}); installing Open MPI "
         f"({' '.join(MPI_APT)}, apt-get) and mpi4py (pip)")
    if shutil.which("mpirun") is None or shutil.which("mpicc") is None:
        if shutil.which("apt-get") is None:
            raise BenchError("cannot set up MPI: no apt-get here; install Open MPI (mpirun) and "
                             "mpi4py yourself, then run the bench again")
        if os.geteuid() != 0:
            raise BenchError("cannot set up MPI: apt-get needs root; run `sudo apt-get install -y "
                             f"{' '.join(MPI_APT)} && pip install mpi4py`, then the bench again")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        try:
            _step(["apt-get", "install", "-y", "-q", *MPI_APT], echo, env)
        except BenchError:   # a stale package list is the usual cause: refresh it once
            _step(["apt-get", "update", "-q"], echo, env)
            _step(["apt-get", "install", "-y", "-q", *MPI_APT], echo, env)
    probe = subprocess.run([sys.executable, "-c", "import mpi4py.MPI"], capture_output=True)
    if probe.returncode != 0:
        _step([sys.executable, "-m", "pip", "install", "-q", "mpi4py"], echo)
    problem = _mpi_problem()
    if problem is not None:
        raise BenchError(f"MPI is still not usable after the setup: {problem}")
    version = mpi_version()
    echo(f"stratac bench: MPI ready: {version}")
    return version


def mpi_version() -> str:
    p = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                        "print(MPI.Get_library_version().strip().splitlines()[0])"],
                       capture_output=True, text=True, timeout=120)
    mpi4py = subprocess.run([sys.executable, "-c", "import mpi4py; print(mpi4py.__version__)"],
                            capture_output=True, text=True, timeout=120).stdout.strip()
    lib = p.stdout.strip().split(",")[0] if p.returncode == 0 else "unknown MPI"
    return f"mpi4py {mpi4py} on {lib}"


def mpirun_command(world: int, script: list[str]) -> list[str]:
    cmd = [shutil.which("mpirun") or "mpirun"]
    ver = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=60)
    if "Open MPI" in ver.stdout + ver.stderr:
        # more ranks than cores is the point on a small machine; no pinning, like stratac's ranks
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd + ["-np", str(world)] + script


class MpiJob:
    """`mpirun -np W python -m stratac.tools.bench.benchpeer SPEC`, from start() to stop().

    While it runs, a watcher marks the gate's ABORT as soon as the job exits, so that stratac's
    ranks do not wait for turns a dead job will never take. stop() waits for the job (it ends
    by itself once stratac's last case is marked, or on ABORT), kills it after 30 s, and reads its
    output: `results` are its measurements, `failure` why it exited non-zero (None if it did not).
    """

    def __init__(self, world: int, bench: dict, tmp: Path):
        self.world, self.bench, self.tmp = world, bench, tmp
        self.gate = benchpeer.Gate(bench["gate"])
        self.results: list[dict] = []
        self.failure: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stop_watch = threading.Event()

    def start(self) -> None:
        spec_file = self.tmp / "mpi.json"
        spec_file.write_text(json.dumps(dict(self.bench, world=self.world)))
        self._out = open(self.tmp / "mpi.out", "w+")
        self._err = open(self.tmp / "mpi.err", "w+")
        # waits yield (what Open MPI picks itself when oversubscribed, and what stratac's CPU
        # model does): busy polling on a machine with fewer CPUs than processes is noise
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   OMPI_MCA_mpi_yield_when_idle=os.environ.get("OMPI_MCA_mpi_yield_when_idle", "1"),
                   PYTHONPATH=os.pathsep.join(filter(None, [PKG_ROOT, os.environ.get("PYTHONPATH")])))
        self._proc = subprocess.Popen(
            mpirun_command(self.world, [sys.executable, "-m", "stratac.tools.bench.benchpeer",
                                        str(spec_file)]),
            stdout=self._out, stderr=self._err, env=env, start_new_session=True)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop_watch.wait(0.2):
            if self._proc.poll() is not None:
                self.gate.mark(self.gate.ABORT)
                return

    def stop(self) -> None:
        self._stop_watch.set()
        self.gate.mark(self.gate.ABORT)   # a job still waiting for a turn stops now
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _killpg(self._proc)
        self._out.seek(0)
        self._err.seek(0)
        for line in self._out.read().splitlines():
            if line.startswith(benchpeer.PEER_PREFIX):
                self.results.append(json.loads(line[len(benchpeer.PEER_PREFIX):]))
        if self._proc.returncode != 0:
            tail = "\n".join(self._err.read().strip().splitlines()[-12:])
            self.failure = (f"the MPI job (mpirun) exited with status {self._proc.returncode}"
                            + (f":\n{tail}" if tail else ""))
        self._out.close()
        self._err.close()


def _killpg(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
