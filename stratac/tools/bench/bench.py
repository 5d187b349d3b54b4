"""`stratac bench`: sweep sizes for every schedule of a file on the CPU build and report nccl-tests
style figures, optionally side by side with torch.distributed (gloo) and MPI, interleaved at every
size, plus the copies each engine made (from the CPU model's counters).

One stratac job per run (stratac.runner, one Case per size); gloo is measured inside its rank
processes and MPI in a separate mpirun job; they take turns through a gate (stratac.benchpeer).

Metrics (DESIGN.md §7, nccl-tests): algbw = S / t, busbw = algbw x factor, GB = 1e9 B; factor
AllReduce 2(n-1)/n, AllGather/ReduceScatter/AllToAll (n-1)/n, Broadcast/Reduce 1; S is the whole
gathered/scattered buffer for AllGather/ReduceScatter, one rank's send buffer for AllToAll, the
buffer otherwise. t is the slowest rank's mean time per call over --iters calls after --warmup.

A file of MoE schedules (moe_dispatch/moe_combine, alltoallv) sweeps tokens per rank and routings
instead of sizes (run_moe): dispatch and combine times, received bytes per rank as DeepEP counts
them, algbw = received bytes / time, and the dispatch's per-core balance (CPU model counters) beside
the balance a one-core-per-peer partition would have, computed from the same routing. No peers.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stratac.host import comm
from stratac.ir import passes
from stratac.lang.frontend import load_source
from stratac.tools.bench import benchpeer
from stratac.tools.options import parse_counts, parse_sizes
from stratac.tools.run import runner

PEERS = ("gloo", "mpi")
DEFAULT_SIZES = "8:256M"
MOE_TOKENS = "16:1024"   # the default --tokens sweep of a MoE file
MPI_APT = ["openmpi-bin", "libopenmpi-dev"]


class BenchError(Exception):
    """Something the bench cannot do, said in one message (the CLI prints it, no traceback).
    `status` is the exit status it calls for."""

    status = 1


class BenchUsageError(BenchError):
    """Options that do not fit the file (e.g. --vs for MoE schedules): exit status 2."""

    status = 2


@dataclass
class BenchSpec:
    file: str
    world: int
    sizes: list[int] | None = field(default_factory=lambda: parse_sizes(DEFAULT_SIZES))
    dtype: str = "f32"
    op: str = "sum"
    root: int = 0
    iters: int = 20
    warmup: int = 5
    cores: int | None = None
    peers: list[str] = field(default_factory=list)
    timeout: float = 120.0
    seed: int = 0
    soc: str = passes.DEFAULT_SOC
    progress: bool = False
    ceiling_bytes: int = 256 << 20
    trace: str | None = None      # write a Chrome/Perfetto trace of one call per schedule and size
    # MoE dispatch/combine files (None: the defaults below, or stratac.workload.MOE_DEFAULTS)
    tokens: list[int] | None = None     # tokens per rank, swept (default MOE_TOKENS)
    hidden: int | None = None
    topk: int | None = None
    experts: int | None = None
    routings: list[str] | None = None   # default ["uniform"]


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.4g}{unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------------------------------
# the copy ceiling

def copy_ceiling(nbytes: int = 256 << 20, reps: int = 5) -> dict:
    """The best of `reps` torch copies of `nbytes` (GB/s = bytes copied / s; each byte is read
    once and written once), with one thread and with all of torch's threads."""
    import torch
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)   # both touched: no page faults in the timing
    threads = torch.get_num_threads()
    out = {"bytes": nbytes, "threads": threads}
    try:
        for key, n in (("gbps_1_thread", 1), ("gbps_all_threads", threads)):
            torch.set_num_threads(n)
            dst.copy_(src)
            best = math.inf
            for _ in range(reps):
                t0 = time.perf_counter()
                dst.copy_(src)
                best = min(best, time.perf_counter() - t0)
            out[key] = nbytes / best / 1e9
    finally:
        torch.set_num_threads(threads)
    return out


# ---------------------------------------------------------------------------------------------
# MPI: find it, install it

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


# ---------------------------------------------------------------------------------------------
# planning: cases (one per size) and the peers' tasks of each case

@dataclass
class Plan:
    compiled: list            # comm.Compiled
    cases: list[runner.Case]
    tasks: list[list[dict]]   # per case: the distinct collectives the peers run


def _min_copies(kind: str, world: int, in_place: bool) -> float:
    """Bytes the contract needs written into GM per rank (mean over ranks), per payload byte S."""
    w = world
    if w == 1 and in_place:
        return 0.0
    return {"allreduce": 1.0, "allgather": (w - 1) / w if in_place else 1.0,
            "reducescatter": 1 / w, "broadcast": (w - 1) / w if in_place else 1.0,
            "reduce": 1 / w, "alltoall": (w - 1) / w if in_place else 1.0}[kind]


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_needed(spec: BenchSpec, pl: Plan, heap: int) -> int:
    """A generous estimate of the run's peak memory: per rank the heap, the torch reference check
    (about 32 bytes per element of the largest tensor: int64 draws, float64 accumulator, the
    expected tensor) and the gloo buffers; per MPI rank its buffers; 300 MB per process."""
    from stratac.ir import DType
    from stratac.tools.run.workload import Workload
    elem = DType.parse(spec.dtype).nbytes
    n_max = 0
    for case in pl.cases:
        for c in pl.compiled:
            s = c.schedule
            wl = Workload(s, spec.world, Workload.count_for_bytes(s, spec.world, case.size, elem))
            n_max = max([n_max] + [wl.numel(p) for p in s.params])
    rank = heap + 32 * n_max + (2 * n_max * elem if "gloo" in spec.peers else 0) + (300 << 20)
    mpi = 2 * n_max * elem + (300 << 20) if "mpi" in spec.peers else 0
    return spec.world * (rank + mpi)


def _min_fabric(kind: str, world: int) -> float:
    """Bytes that must cross between ranks per rank (mean over ranks), per payload byte S: nccl-tests'
    bus factor, except Broadcast and Reduce, whose factor 1 counts the root's link: (n-1) ranks
    each receive (or send) S, (n-1)/n per rank."""
    w = world
    return 2 * (w - 1) / w if kind == "allreduce" else (w - 1) / w


def plan(spec: BenchSpec) -> Plan:
    from stratac.ir import DType
    from stratac.tools.run.workload import Workload
    source = load_source(spec.file)
    opts = passes.Options(soc=spec.soc, cores=spec.cores)
    opts.check()
    compiled = comm.compile_source(source, opts, worlds=[spec.world])
    if not compiled:
        raise BenchError(f"{spec.file} holds no schedule")
    elem = DType.parse(spec.dtype).nbytes
    cases, tasks, seen_counts = [], [], None
    for size in spec.sizes:
        counts = tuple(Workload.count_for_bytes(c.schedule, spec.world, size, elem) for c in compiled)
        if counts == seen_counts:   # below the smallest size a schedule can take: same case again
            continue
        seen_counts = counts
        case_tasks: dict[tuple, dict] = {}
        for c, n in zip(compiled, counts):
            s = c.schedule
            wl = Workload(s, spec.world, n, op=spec.op, root=spec.root)
            kind = s.contract.kind.value
            x = s.param(s.contract.inputs[0])
            out_numel = None
            if kind in ("allgather", "reducescatter", "alltoall"):
                out_numel = wl.numel(s.param(s.contract.outputs[0]))
                if s.contract.in_place:   # the peers run out of place: the output's own size
                    out_numel = {"allgather": wl.numel(x) * spec.world,
                                 "reducescatter": wl.numel(x) // spec.world,
                                 "alltoall": wl.numel(x)}[kind]
            task = {"kind": kind, "in_numel": wl.numel(x), "out_numel": out_numel,
                    "dtype": spec.dtype, "op": spec.op, "root": spec.root,
                    "size": wl.size_bytes(elem), "busbw_factor": wl.busbw_factor(),
                    "case": len(cases)}
            case_tasks.setdefault((kind, task["in_numel"], out_numel), task)
        cases.append(runner.Case(dtype=spec.dtype, size=size, op=spec.op, root=spec.root))
        tasks.append(list(case_tasks.values()))
    return Plan(compiled, cases, tasks)


# ---------------------------------------------------------------------------------------------
# progress

class Progress:
    """A one-line bar on stderr: cases done (and the MPI job's turns), the size, the time."""

    def __init__(self, gate: benchpeer.Gate, cases: list[runner.Case], mpi: bool, enabled: bool):
        self.gate, self.cases, self.mpi, self.enabled = gate, cases, mpi, enabled
        self.total = len(cases) * (2 if mpi else 1)
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def done(self) -> int:
        n = sum(self.gate.has(f"stratac-{i}") for i in range(len(self.cases)))
        if self.mpi:
            n += sum(self.gate.has(f"mpi-{i}") for i in range(len(self.cases)))
        return n

    def line(self, width: int = 30) -> str:
        d = self.done()
        fill = int(width * d / self.total) if self.total else width
        i = min(len(self.cases) - 1, sum(self.gate.has(f"stratac-{k}") for k in range(len(self.cases))))
        case = self.cases[i] if self.cases else None
        if case is None:
            now = ""
        elif case.size is None and case.tokens is not None:   # MoE: tokens and routing
            now = f"{case.tokens} tokens {case.routing}"
        else:
            now = fmt_bytes(case.size)
        moe = case is not None and case.size is None
        unit = "measurements" if self.mpi else ("cases" if moe else "sizes")
        return (f"\r[{'#' * fill}{'.' * (width - fill)}] {d}/{self.total} "
                f"{unit}  next {now:<9} {time.monotonic() - self.t0:6.0f} s")

    def _loop(self):
        while not self._stop.wait(0.5):
            sys.stderr.write(self.line())
            sys.stderr.flush()

    def __enter__(self):
        if self.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            sys.stderr.write(self.line() + "\n")
            sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# the run

@dataclass
class BenchResult:
    meta: dict
    records: list[dict]          # every system, every size (the JSON's "results")
    failures: list[str]
    exit_code: int


def run(spec: BenchSpec, echo=print) -> BenchResult:
    pairs = _moe_file(spec)
    if pairs is not None:
        return run_moe(spec, pairs, echo)
    if spec.sizes is None:
        spec.sizes = parse_sizes(DEFAULT_SIZES)
    for p in spec.peers:
        if p not in PEERS:
            raise BenchError(f"--vs {p}: the peers are {', '.join(PEERS)}")
    if spec.world < 1:
        raise BenchError(f"--world must be at least 1, got {spec.world}")
    if not 0 <= spec.root < spec.world:
        raise BenchError(f"--root {spec.root} is not a rank of a world of {spec.world}")
    meta: dict = {"file": str(spec.file), "world": spec.world, "dtype": spec.dtype, "op": spec.op,
                  "root": spec.root, "iters": spec.iters, "warmup": spec.warmup,
                  "cores": spec.cores, "peers": list(spec.peers), "cpus": os.cpu_count(),
                  "loadavg_before": os.getloadavg()[0]}
    import torch
    meta["torch"] = torch.__version__
    if "mpi" in spec.peers:
        meta["mpi"] = setup_mpi(echo)
    meta["copy_ceiling"] = copy_ceiling(spec.ceiling_bytes)   # before anything else runs
    pl = plan(spec)
    meta["cores"] = spec.cores or pl.compiled[0].schedule.kernel.cores
    records: list[dict] = []
    failures: list[str] = []
    mpi = "mpi" in spec.peers
    rspec = runner.RunSpec(file=spec.file, world=spec.world, cases=pl.cases, iters=spec.iters,
                           warmup=spec.warmup, timeout=spec.timeout, check=True, seed=spec.seed,
                           soc=spec.soc, cores=spec.cores)
    need, avail = memory_needed(spec, pl, runner._heap_bytes(rspec, pl.compiled)), _mem_available()
    if avail is not None and need > 0.8 * avail:   # an OOM kill would take other processes too
        raise BenchError(f"the largest size needs about {need / 2**30:.1f} GiB of memory ({spec.world} "
                         f"ranks: heap, reference check, peer buffers) but {avail / 2**30:.1f} GiB are "
                         f"available: lower the largest --sizes (now {fmt_bytes(pl.cases[-1].size)})")
    with tempfile.TemporaryDirectory(prefix="stratac-bench-") as tmp:
        gate = benchpeer.Gate(Path(tmp) / "gate")
        gate.path.mkdir()
        bench = {"peers": list(spec.peers), "tasks": pl.tasks, "gate": str(gate.path),
                 "iters": spec.iters, "warmup": spec.warmup, "peer_timeout": spec.timeout * 4,
                 "trace": None}
        if spec.trace:
            bench["trace"] = str(Path(tmp) / "trace")
            Path(bench["trace"]).mkdir()
        mpi_proc = mpi_out = mpi_err = None
        if mpi:
            spec_file = Path(tmp) / "mpi.json"
            spec_file.write_text(json.dumps(dict(bench, world=spec.world)))
            mpi_out = open(Path(tmp) / "mpi.out", "w+")
            mpi_err = open(Path(tmp) / "mpi.err", "w+")
            pkg_root = str(Path(__file__).resolve().parent.parent)
            # waits yield (what Open MPI picks itself when oversubscribed, and what stratac's CPU
            # model does): busy polling on a machine with fewer CPUs than processes is noise
            env = dict(os.environ, OMP_NUM_THREADS="1",
                       OMPI_MCA_mpi_yield_when_idle=os.environ.get("OMPI_MCA_mpi_yield_when_idle", "1"),
                       PYTHONPATH=os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")])))
            mpi_proc = subprocess.Popen(
                mpirun_command(spec.world, [sys.executable, "-m", "stratac.tools.bench.benchpeer", str(spec_file)]),
                stdout=mpi_out, stderr=mpi_err, env=env, start_new_session=True)
        stop_watch = threading.Event()

        def watch_mpi():   # the MPI job died: stop the stratac ranks from waiting for it
            while not stop_watch.wait(0.2):
                if mpi_proc.poll() is not None:
                    gate.mark(gate.ABORT)
                    return

        watcher = threading.Thread(target=watch_mpi, daemon=True) if mpi else None
        if watcher:
            watcher.start()
        rspec.bench = bench
        try:
            with Progress(gate, pl.cases, mpi, spec.progress):
                outcome = runner.run(rspec, echo=echo)
        finally:
            stop_watch.set()
            gate.mark(gate.ABORT)   # an MPI job still waiting for a turn stops now
            if mpi_proc is not None:
                try:
                    mpi_proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _killpg(mpi_proc)
        failures += outcome.failures
        if mpi_proc is not None:
            mpi_out.seek(0)
            mpi_err.seek(0)
            for line in mpi_out.read().splitlines():
                if line.startswith(benchpeer.PEER_PREFIX):
                    outcome.results.append(json.loads(line[len(benchpeer.PEER_PREFIX):]))
            if mpi_proc.returncode != 0:
                tail = "\n".join(mpi_err.read().strip().splitlines()[-12:])
                failures.append(f"the MPI job (mpirun) exited with status {mpi_proc.returncode}"
                                + (f":\n{tail}" if tail else ""))
            mpi_out.close()
            mpi_err.close()
        if spec.trace:
            meta["trace"] = write_trace(Path(bench["trace"]), spec, meta)
    meta["loadavg_after"] = os.getloadavg()[0]
    records = _records(outcome.results, pl, spec)
    exit_code = outcome.exit_code or (1 if failures else 0)
    return BenchResult(meta, records, failures, exit_code)


def _killpg(p: subprocess.Popen) -> None:
    import signal
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _figures(size: int, time_s: float | None, factor: float) -> dict:
    if time_s is None or not time_s > 0:
        return {"time_us": None, "algbw": None, "busbw": None}
    algbw = size / time_s / 1e9
    return {"time_us": time_s * 1e6, "algbw": algbw, "busbw": algbw * factor}


def _records(results: list[dict], pl: Plan, spec: BenchSpec) -> list[dict]:
    """One record per system, schedule (or peer collective) and size."""
    scheds = {c.schedule.name: c.schedule for c in pl.compiled}
    w = spec.world
    peers = [r for r in results if "system" in r]
    ours: dict[tuple, list[dict]] = {}
    for r in results:
        if "system" not in r:
            ours.setdefault((r["schedule"], r["count"], r["dtype"]), []).append(r)
    out = []
    for (name, count, dtype), ranks in ours.items():
        ranks.sort(key=lambda r: r["rank"])
        r0 = ranks[0]
        s = scheds[name]
        kind = s.contract.kind.value
        size = r0["size"]
        per_rank = []
        for r in ranks:
            ctr = r["counters"]
            tot = {k: sum(c[k] for c in ctr) for k in ("mte_in", "mte_out", "sdma",
                                                        "remote_read", "remote_write")}
            cores = [c["mte_in"] + c["mte_out"] + c["sdma"] for c in ctr]
            mean = sum(cores) / len(cores) if cores else 0
            per_rank.append({"rank": r["rank"], "aiv_in": tot["mte_in"], "aiv_out": tot["mte_out"],
                             "sdma": tot["sdma"], "remote_read": tot["remote_read"],
                             "remote_write": tot["remote_write"],
                             "core_balance": max(cores) / mean if mean else None,
                             "per_core": [{"core": i, "aiv_in": c["mte_in"], "aiv_out": c["mte_out"],
                                           "sdma": c["sdma"]} for i, c in enumerate(ctr)],
                             "heap_bytes": r["heap_bytes"]})
        n = len(per_rank)
        mean_of = lambda k: sum(p[k] for p in per_rank) / n
        engines = {k: mean_of(k) for k in ("aiv_in", "aiv_out", "sdma", "remote_read", "remote_write")}
        landed = engines["aiv_out"] + engines["sdma"]
        balances = [p["core_balance"] for p in per_rank if p["core_balance"] is not None]
        rec = {"system": "stratac", "schedule": name, "kind": kind, "world": w, "size": size,
               "count": count, "dtype": dtype, "op": r0["op"], "root": r0["root"],
               **_figures(size, r0["time_s"], r0["busbw_factor"]),
               "errors": r0["ranks_wrong"], "why": [r["why"] for r in ranks if r["why"]],
               "cores": r0["cores"], "engines": engines,
               "copies_per_byte": landed / size if size else None,
               "min_copies_per_byte": _min_copies(kind, w, s.contract.in_place),
               "fabric_per_byte": (engines["remote_read"] + engines["remote_write"]) / size if size else None,
               "min_fabric_per_byte": _min_fabric(kind, w),
               "core_balance": max(balances) if balances else None,
               "heap_bytes": max(p["heap_bytes"] for p in per_rank),
               "staging": bool(s.scratch), "per_rank": per_rank}
        out.append(rec)
    for p in peers:
        rec = {"system": p["system"], "schedule": p["schedule"], "kind": p["kind"], "world": w,
               "size": p["size"], "count": p["count"], "dtype": p["dtype"],
               "op": p["op"] if p["kind"] in ("allreduce", "reducescatter", "reduce") else None,
               "root": p["root"] if p["kind"] in ("broadcast", "reduce") else None,
               **_figures(p["size"], p["time_s"], p["busbw_factor"]),
               "errors": p["errors"], "note": p["note"]}
        out.append(rec)
    # stratac/peer: the ratio of busbw (equivalently of the peer's time to stratac's) at that size
    index = {(r["system"], r["kind"], r["size"]): r for r in out if r["system"] != "stratac"}
    for r in out:
        if r["system"] == "stratac":
            r["ratio"] = {}
            for peer in spec.peers:
                q = index.get((peer, r["kind"], r["size"]))
                r["ratio"][peer] = (r["busbw"] / q["busbw"] if q and q["busbw"] and r["busbw"]
                                    else None)
    order = {name: i for i, name in enumerate(scheds)}
    out.sort(key=lambda r: (r["system"] != "stratac", order.get(r["schedule"], 0), r["kind"],
                            r["system"], r["size"]))
    return out


# ---------------------------------------------------------------------------------------------
# MoE dispatch/combine: a sweep of tokens per routing instead of a sweep of sizes
#
# One stratac job, one runner.Case per (routing, tokens); each case runs every dispatch/combine pair
# of the file (stratac.worker: dispatch, the host's stand-in expert step, combine; checked before
# and after the timed calls). A record per pair, routing and tokens joins the two phases.

_MOE_OPTIONS = (("tokens", "--tokens"), ("hidden", "--hidden"), ("topk", "--topk"),
                ("experts", "--experts"), ("routings", "--routing"))
PER_PEER_SOURCE = "computed from the routing (stratac.routing.expert_ids), not measured"


def _moe_file(spec: BenchSpec) -> list[tuple[str, str | None]] | None:
    """None for a file of collectives; for a file of MoE schedules its (dispatch, combine or None)
    pairs in file order, once the options are known to fit a MoE bench (BenchUsageError if not)."""
    from stratac.lang.frontend import schedules
    scheds = schedules(load_source(spec.file))
    moe = [s.name for s in scheds if s.contract.kind.moe]
    given = [flag for key, flag in _MOE_OPTIONS if getattr(spec, key) is not None]
    if not moe:
        if given:
            raise BenchUsageError(f"{', '.join(given)} apply to MoE dispatch/combine schedules and "
                                  f"{spec.file} holds none: its collectives sweep --sizes")
        return None
    others = [s.name for s in scheds if not s.contract.kind.moe]
    if others:
        raise BenchUsageError(f"{spec.file} mixes MoE schedules ({', '.join(moe)}) with collectives "
                              f"({', '.join(others)}): MoE schedules sweep --tokens, collectives "
                              "--sizes; bench them from separate files")
    if spec.peers:
        raise BenchUsageError(f"--vs {','.join(spec.peers)}: no peer is available for MoE dispatch/"
                              "combine (neither gloo nor MPI has a routed dispatch or combine to run "
                              "side by side); drop --vs to measure stratac alone")
    if spec.trace:
        raise BenchUsageError("--trace records collectives only; MoE dispatch/combine runs record no "
                              "trace yet: drop --trace")
    if spec.sizes is not None and spec.sizes != parse_sizes(DEFAULT_SIZES):
        raise BenchUsageError(f"--sizes sweeps the bytes of a collective, and {spec.file} holds MoE "
                              "schedules: sweep --tokens (with --hidden, --topk, --experts, --routing)")
    return moe_pairs(scheds)


def moe_pairs(scheds) -> list[tuple[str, str | None]]:
    """(dispatch, combine) names in file order, paired as `stratac run` pairs them
    (workload.moe_pairs); an alltoallv alone (None)."""
    from stratac.tools.run.workload import PairingError
    from stratac.tools.run.workload import moe_pairs as pair_ir
    try:
        items = pair_ir(scheds)
    except PairingError as exc:
        raise BenchUsageError(str(exc)) from None
    return [(d.name, c.name if c else None) for d, c in (i for i in items if isinstance(i, tuple))]


def _moe_cases(spec: BenchSpec) -> list[runner.Case]:
    from stratac.tools.run.workload import moe_options_problem
    for r in spec.routings or ["uniform"]:
        problem = moe_options_problem(spec.world, spec.topk, spec.experts, r)
        if problem:
            raise BenchUsageError(problem)
    for key, flag in _MOE_OPTIONS[1:4]:
        v = getattr(spec, key)
        if v is not None and v < 1:
            raise BenchUsageError(f"{flag} must be at least 1, got {v}")
    tokens = spec.tokens or parse_counts(MOE_TOKENS)
    return [runner.Case(dtype=spec.dtype, tokens=t, hidden=spec.hidden, topk=spec.topk,
                        experts=spec.experts, routing=r)
            for r in (spec.routings or ["uniform"]) for t in tokens]


def moe_memory_needed(rspec: runner.RunSpec, compiled) -> int:
    """A generous estimate of the run's peak memory: per rank the heap, the torch reference check
    (the expected window about three times over, y in float64) and 300 MB per process."""
    from stratac.ir import DType
    heap = rspec.heap_bytes or runner._heap_bytes(rspec, compiled)
    ref = 0
    for case in rspec.cases:
        for wl in runner.moe_workloads(rspec, case, compiled):
            d = wl.dispatch
            rows = wl.shape(d, d.param(d.contract.outputs[0]))[0]
            elem = DType.parse(case.dtype).nbytes
            ref = max(ref, 3 * rows * wl.hidden * elem + 16 * wl.tokens * wl.hidden)
    return rspec.world * (heap + ref + (300 << 20))


def run_moe(spec: BenchSpec, pairs: list[tuple[str, str | None]], echo=print) -> BenchResult:
    """The MoE bench: every (routing, tokens) case of spec on every dispatch/combine pair."""
    from stratac.tools.run.workload import MOE_DEFAULTS
    if spec.world < 1:
        raise BenchUsageError(f"--world must be at least 1, got {spec.world}")
    cases = _moe_cases(spec)
    tokens = sorted({c.tokens for c in cases})
    meta: dict = {"file": str(spec.file), "world": spec.world, "dtype": spec.dtype,
                  "iters": spec.iters, "warmup": spec.warmup, "cores": spec.cores, "peers": [],
                  "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0],
                  "moe": {"pairs": [{"dispatch": d, "combine": c} for d, c in pairs],
                          "tokens": tokens, "hidden": spec.hidden or MOE_DEFAULTS["hidden"],
                          "topk": spec.topk or MOE_DEFAULTS["topk"],
                          "experts": spec.experts or MOE_DEFAULTS["experts_per_rank"] * spec.world,
                          "routings": list(spec.routings or ["uniform"]), "seed": spec.seed,
                          "per_peer": PER_PEER_SOURCE}}
    import torch
    meta["torch"] = torch.__version__
    meta["copy_ceiling"] = copy_ceiling(spec.ceiling_bytes)   # before anything else runs
    opts = passes.Options(soc=spec.soc, cores=spec.cores)
    opts.check()
    compiled = comm.compile_source(load_source(spec.file), opts, worlds=[spec.world])
    meta["cores"] = spec.cores or compiled[0].schedule.kernel.cores
    rspec = runner.RunSpec(file=spec.file, world=spec.world, cases=cases, iters=spec.iters,
                           warmup=spec.warmup, timeout=spec.timeout, check=True, seed=spec.seed,
                           soc=spec.soc, cores=spec.cores)
    rspec.heap_bytes = runner._heap_bytes(rspec, compiled)
    need, avail = moe_memory_needed(rspec, compiled), _mem_available()
    if avail is not None and need > 0.8 * avail:   # an OOM kill would take other processes too
        raise BenchError(f"the largest case needs about {need / 2**30:.1f} GiB of memory ({spec.world} "
                         f"ranks: heap, reference check) but {avail / 2**30:.1f} GiB are available: "
                         f"lower the largest --tokens (now {tokens[-1]}) or --hidden")
    with tempfile.TemporaryDirectory(prefix="stratac-bench-") as tmp:
        gate = benchpeer.Gate(Path(tmp) / "gate")   # no peers: the marks only drive the progress bar
        gate.path.mkdir()
        rspec.bench = {"peers": [], "tasks": [[] for _ in cases], "gate": str(gate.path),
                       "iters": spec.iters, "warmup": spec.warmup, "peer_timeout": spec.timeout * 4,
                       "trace": None}
        with Progress(gate, cases, False, spec.progress):
            outcome = runner.run(rspec, echo=echo)
    meta["loadavg_after"] = os.getloadavg()[0]
    records = moe_records(outcome.results, pairs, spec)
    exit_code = outcome.exit_code or (1 if outcome.failures else 0)
    return BenchResult(meta, records, list(outcome.failures), exit_code)


def _core_bytes(rec: dict) -> list[int]:
    """Bytes each vector core moved in one call: aiv in + aiv out + sdma (the copies it posted)."""
    return [c["mte_in"] + c["mte_out"] + c["sdma"] for c in rec["counters"]]


def _max_mean(xs: list[int]) -> float | None:
    mean = sum(xs) / len(xs) if xs else 0
    return max(xs) / mean if mean else None


def _phase(ranks: list[dict]) -> dict:
    """One phase over all ranks: time, per-core balance (the worst rank's), engine bytes (mean)."""
    cores = [_core_bytes(r) for r in ranks]
    balances = [b for b in map(_max_mean, cores) if b is not None]
    n = len(ranks)
    engines = {k: sum(sum(c[src] for c in r["counters"]) for r in ranks) / n
               for k, src in (("aiv_in", "mte_in"), ("aiv_out", "mte_out"), ("sdma", "sdma"),
                              ("remote_read", "remote_read"), ("remote_write", "remote_write"))}
    t = ranks[0]["time_s"]
    return {"time_us": t * 1e6 if t and t > 0 else None,
            "max_mean": max(balances) if balances else None,
            "max_bytes": max((max(c) for c in cores if c), default=0),
            "engines": engines, "core_bytes": cores}


def per_peer_bytes(routing: str, world: int, tokens: int, topk: int, experts: int, row_bytes: int,
                   seed: int) -> list[list[int]]:
    """[source rank][destination rank]: the bytes a one-core-per-peer partition puts on rank
    source's core for destination (every row it routes there, the rank itself included), from the
    routing alone: stratac.routing.expert_ids, expert e owned by rank e // (experts / world)."""
    import numpy as np

    from stratac.verify.routing import expert_ids
    local = experts // world
    out = []
    for r in range(world):
        ids = expert_ids(routing, r, tokens, topk, experts, seed)
        owners = ids[ids >= 0].astype(np.int64) // local
        out.append([int(n) * row_bytes for n in np.bincount(owners, minlength=world)])
    return out


def moe_records(results: list[dict], pairs: list[tuple[str, str | None]], spec: BenchSpec) -> list[dict]:
    """One record per dispatch/combine pair, routing and tokens (both phases joined)."""
    from stratac.ir import DType
    elem = DType.parse(spec.dtype).nbytes
    pair_of = {}
    for i, (d, c) in enumerate(pairs):
        pair_of[d] = pair_of[c] = i
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in results:
        m = r.get("moe")
        if not m or r["schedule"] not in pair_of:
            continue
        key = (pair_of[r["schedule"]], m["routing"], m["tokens"])
        groups.setdefault(key, {"dispatch": [], "combine": []})[m["phase"]].append(r)
    routings = list(spec.routings or ["uniform"])
    out = []
    for key in sorted(groups, key=lambda k: (k[0], routings.index(k[1]) if k[1] in routings else 99, k[2])):
        d_name, c_name = pairs[key[0]]
        ph = groups[key]
        dr = sorted(ph["dispatch"], key=lambda r: r["rank"])
        cr = sorted(ph["combine"], key=lambda r: r["rank"])
        if not dr:
            continue
        r0, m = dr[0], dr[0]["moe"]
        w = r0["world"]
        disp = _phase(dr)
        comb = _phase(cr) if cr else None
        errors = max(r["ranks_wrong"] for r in dr + cr)
        recv = r0["size"]
        seed = m["counters_seed"]   # the routing of the call the counters were read in
        peer = None if seed is None else per_peer_bytes(
            m["routing"], w, m["tokens"], m["topk"], m["experts"], m["hidden"] * elem, seed)
        peer_bal = [b for b in map(_max_mean, peer or []) if b is not None]
        peer_max = max((max(p) for p in peer), default=0) if peer else None
        algbw = lambda ph: recv / ph["time_us"] / 1e3 if ph and ph["time_us"] else None
        out.append({
            "system": "stratac", "kind": "moe", "schedule": d_name, "dispatch": d_name,
            "combine": c_name, "world": w, "dtype": r0["dtype"], "tokens": m["tokens"],
            "hidden": m["hidden"], "topk": m["topk"], "experts": m["experts"],
            "routing": m["routing"], "capacity": m["capacity"], "window_rows": m["window_rows"],
            "cores": r0["cores"], "recv_bytes": recv,
            "dispatch_us": disp["time_us"], "combine_us": comb["time_us"] if comb else None,
            "op_us": r0["op_time_s"] * 1e6,
            "algbw": algbw(disp), "combine_algbw": algbw(comb),
            "core_max_mean": disp["max_mean"], "core_max_bytes": disp["max_bytes"],
            "combine_core_max_mean": comb["max_mean"] if comb else None,
            "per_peer_max_mean": max(peer_bal) if peer_bal else None,
            "per_peer_max_bytes": peer_max, "per_peer_cores": w, "per_peer_bytes": peer,
            "per_peer_seed": seed, "per_peer_source": PER_PEER_SOURCE,
            "busiest_ratio": (peer_max / disp["max_bytes"] if peer_max is not None and disp["max_bytes"]
                              else None),
            "errors": errors, "why": [r["why"] for r in dr + cr if r["why"]],
            "heap_bytes": max(r["heap_bytes"] for r in dr),
            "dispatch_engines": disp["engines"], "combine_engines": comb["engines"] if comb else None,
            "per_rank": [{"rank": r["rank"], "dispatch_core_bytes": disp["core_bytes"][i],
                          "combine_core_bytes": comb["core_bytes"][i] if comb and i < len(cr) else None}
                         for i, r in enumerate(dr)],
        })
    return out


MOE_COLUMNS = ["tokens", "hidden", "topk", "experts", "routing", "recv(B)"]
MOE_PHASE_COLUMNS = ["time(us)", "algbw", "max/mean"]
MOE_BALANCE_COLUMNS = ["tokens", "routing", "max/mean", "busiest(B)", "max/mean", "busiest(B)",
                       "busiest x"]


def moe_table(res: BenchResult) -> list[str]:
    m = res.meta
    mo = m["moe"]
    lines = [f"# stratac bench {m['file']}  world {m['world']}  dtype {m['dtype']}  cores {m['cores']}  "
             f"iters {m['iters']}  warmup {m['warmup']}  ({m['cpus']} CPUs, load average "
             f"{m['loadavg_before']:.1f} before, {m['loadavg_after']:.1f} after)"]
    c = m["copy_ceiling"]
    lines.append(f"# copy ceiling (torch copy_ of {fmt_bytes(c['bytes'])}): "
                 f"{c['gbps_1_thread']:.2f} GB/s on 1 thread, {c['gbps_all_threads']:.2f} GB/s on "
                 f"{c['threads']} threads")
    lines.append(f"# MoE dispatch/combine, tokens per rank swept, routings {', '.join(mo['routings'])}; "
                 "peers: none (neither gloo nor MPI has a routed dispatch/combine)")
    lines.append("# recv: bytes each rank receives in dispatch, mean over ranks (DeepEP's count: routed "
                 "(token, expert) rows x hidden x element size); time: median over the timed calls of each call's slowest rank; "
                 "algbw = recv / time (GB/s, GB = 1e9 B); op: the whole operation, dispatch + the host's "
                 "stand-in expert step + combine, timed the same way; max/mean: bytes of the busiest vector core "
                 "(aiv in + aiv out + sdma, CPU model counters) over the mean of all cores, worst rank; "
                 "#wrong: ranks whose counts, window or combined y differed from torch")
    by_pair: dict[str, list[dict]] = {}
    for r in res.records:
        by_pair.setdefault(r["dispatch"], []).append(r)
    for d_name, recs in by_pair.items():
        c_name = recs[0]["combine"]
        lines.append("#")
        lines.append(f"# {d_name}" + (f" + {c_name}" if c_name else " (dispatch only)")
                     + f", world {m['world']}")
        head1 = (f"# {'':>6} {'':>6} {'':>4} {'':>7} {'':>8} {'':>10} | {'dispatch':^26} | {'combine':^26} "
                 f"| {'whole':^10} |")
        head2 = (f"# {'tokens':>6} {'hidden':>6} {'topk':>4} {'experts':>7} {'routing':>8} {'recv(B)':>10} "
                 f"| {'time(us)':>10} {'algbw':>7} {'max/mean':>8} | {'time(us)':>10} {'algbw':>7} "
                 f"{'max/mean':>8} | {'op(us)':>10} | {'#wrong':>6}")
        lines += [head1, head2]
        for r in recs:
            comb = (f"{_f(r['combine_us'], '.1f', 10)} {_f(r['combine_algbw'], '.3f', 7)} "
                    f"{_f(r['combine_core_max_mean'], '.2f', 8)}" if r["combine"] else
                    f"{'-':>10} {'-':>7} {'-':>8}")
            lines.append(f"  {r['tokens']:>6} {r['hidden']:>6} {r['topk']:>4} {r['experts']:>7} "
                         f"{r['routing']:>8} {r['recv_bytes']:>10} | {_f(r['dispatch_us'], '.1f', 10)} "
                         f"{_f(r['algbw'], '.3f', 7)} {_f(r['core_max_mean'], '.2f', 8)} | {comb} | "
                         f"{_f(r['op_us'], '.1f', 10)} | {r['errors']:>6}")
        lines += moe_balance_table(res, recs)
    for r in res.records:
        for why in r["why"]:
            lines.append(f"# wrong: {r['dispatch']} tokens {r['tokens']} {r['routing']}: {why}")
    return lines


def moe_balance_table(res: BenchResult, recs: list[dict]) -> list[str]:
    """Dispatch's per-core balance: stratac's partition (measured) against one core per peer
    (computed from the same routing)."""
    m = res.meta
    w, cores = m["world"], recs[0]["cores"]
    idle = f"{w} of the {cores} cores busy, max/mean over those {w}" if cores > w else \
        f"{w} cores, one per destination rank"
    lines = ["#",
             f"# core balance of {recs[0]['dispatch']}, world {w}, {cores} cores: bytes per core, the "
             "busiest core over the mean, worst rank",
             f"#   stratac: MEASURED, CPU model counters of one checked dispatch call (aiv in + aiv out "
             f"+ sdma per core): the routed rows split evenly over all {cores} cores",
             "#   one core per peer: COMPUTED FROM THE ROUTING, NOT MEASURED: the partition of HCCL and "
             "the SHMEM examples, core p of rank r carries every row r routes to rank p (rows x hidden "
             f"x element size, the same routing draw as the counters); {idle}",
             "#   busiest x = the one-core-per-peer partition's busiest core / stratac's busiest core, "
             "in bytes (the busiest core bounds the call)",
             f"# {'':>6} {'':>8} | {'stratac (measured)':^20} | {'one core per peer (computed)':^30}",
             f"# {'tokens':>6} {'routing':>8} | {'max/mean':>8} {'busiest(B)':>11} | {'max/mean':>8} "
             f"{'busiest(B)':>11} {'busiest x':>9}"]
    for r in recs:
        lines.append(f"  {r['tokens']:>6} {r['routing']:>8} | {_f(r['core_max_mean'], '.2f', 8)} "
                     f"{r['core_max_bytes']:>11} | {_f(r['per_peer_max_mean'], '.2f', 8)} "
                     f"{_f(r['per_peer_max_bytes'], 'd', 11)} {_f(r['busiest_ratio'], '.2f', 9)}")
    return lines


def moe_plot(res: BenchResult, path: str) -> None:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines: dict[str, list] = {}
    for r in res.records:
        for phase, name, bw in (("dispatch", r["dispatch"], r["algbw"]),
                                ("combine", r["combine"], r["combine_algbw"])):
            if name and bw is not None:
                lines.setdefault(f"{name} {r['routing']}", []).append((r["tokens"], bw, phase))
    for label, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                linestyle="-" if pts[0][2] == "dispatch" else "--", label=label)
    m = res.meta
    _finish_plot(fig, ax, path, "tokens per rank", "algbw = received bytes per rank / time (GB/s)",
                 f"{Path(m['file']).name}: MoE, world {m['world']}, hidden {m['moe']['hidden']}, "
                 f"topk {m['moe']['topk']}, {m['moe']['experts']} experts, CPU model ({m['cpus']} CPUs)")


def _finish_plot(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> None:
    """Log-scaled x, labels, grid and legend; written as PNG and closed."""
    import matplotlib.pyplot as plt
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# output

def fmt_ratio(x: float | None) -> str:
    """2 decimals, or 2 significant digits below 0.1 (so a small ratio does not read 0.00x)."""
    if x is None:
        return "n/a"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _f(v, spec: str, width: int) -> str:
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}{spec}}"


TABLE_COLUMNS = ["size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"]
PEER_COLUMNS = ["time(us)", "busbw", "#wrong", "ratio"]
ENGINE_COLUMNS = ["aiv in", "aiv out", "sdma", "copies/B"]


def table(res: BenchResult) -> list[str]:
    if res.meta.get("moe"):
        return moe_table(res)
    m = res.meta
    peers = m["peers"]
    lines = [f"# stratac bench {m['file']}  world {m['world']}  dtype {m['dtype']}  op {m['op']}  "
             f"cores {m['cores']}  iters {m['iters']}  warmup {m['warmup']}  ({m['cpus']} CPUs, load "
             f"average {m['loadavg_before']:.1f} before, {m['loadavg_after']:.1f} after)"]
    c = m["copy_ceiling"]
    lines.append(f"# copy ceiling (torch copy_ of {fmt_bytes(c['bytes'])}): "
                 f"{c['gbps_1_thread']:.2f} GB/s on 1 thread, {c['gbps_all_threads']:.2f} GB/s on "
                 f"{c['threads']} threads")
    lines.append(f"# peers: {', '.join(peers) or 'none'}"
                 + (f"  (gloo: torch.distributed {m['torch']} in stratac's rank processes)" if "gloo" in peers else "")
                 + (f"  (mpi: {m['mpi']}, mpirun -np {m['world']})" if "mpi" in peers else ""))
    lines.append("# time: median over the timed calls of each call's slowest rank; algbw = size/time, busbw = algbw x factor "
                 "(GB/s, nccl-tests); ratio = stratac busbw / peer busbw; #wrong = ranks whose "
                 "result differed from the reference; engine bytes: per rank and call, mean over ranks")
    peer_recs = {(r["system"], r["kind"], r["size"]): r for r in res.records if r["system"] != "stratac"}
    notes: list[str] = []
    by_sched: dict[str, list[dict]] = {}
    for r in res.records:
        if r["system"] == "stratac":
            by_sched.setdefault(r["schedule"], []).append(r)
    for name, recs in by_sched.items():
        lines.append("#")
        lines.append(f"# {name}: {recs[0]['kind']}, world {m['world']}"
                     + ("  (staging baseline: copies through a scratch buffer)" if recs[0]["staging"] else ""))
        head1 = f"# {'':>10} {'':>11} {'':>5} {'':>5} {'':>4} {'stratac':^35}"
        for p in peers:
            head1 += f" | {p:^36}"
        head1 += f" | {'engine bytes per rank and call':^44}"
        head2 = (f"# {'size':>10} {'count':>11} {'type':>5} {'redop':>5} {'root':>4} {'time(us)':>10} "
                 f"{'algbw':>7} {'busbw':>7} {'#wrong':>7}")
        for p in peers:
            head2 += f" | {'time(us)':>10} {'busbw':>7} {'#wrong':>6} {'ratio':>8}"
        head2 += f" | {'aiv in':>10} {'aiv out':>10} {'sdma':>10} {'copies/B':>9}"
        lines += [head1, head2]
        for r in recs:
            e = r["engines"]
            row = (f"  {r['size']:>10} {r['count']:>11} {r['dtype']:>5} {r['op'] or '-':>5} "
                   f"{'-' if r['root'] is None else r['root']:>4} {_f(r['time_us'], '.1f', 10)} "
                   f"{_f(r['algbw'], '.3f', 7)} {_f(r['busbw'], '.3f', 7)} {r['errors']:>7}")
            for p in peers:
                q = peer_recs.get((p, r["kind"], r["size"]))
                if q is None or q["time_us"] is None:
                    why = q["note"] if q else "not measured"
                    if f"# {p}: {why}" not in notes:
                        notes.append(f"# {p}: {why}")
                    row += f" | {'n/a':>10} {'n/a':>7} {'-':>6} {'-':>8}"
                    continue
                row += (f" | {q['time_us']:>10.1f} {q['busbw']:>7.3f} {q['errors']:>6} "
                        f"{fmt_ratio(r['ratio'].get(p)):>8}")
            row += (f" | {e['aiv_in']:>10.0f} {e['aiv_out']:>10.0f} {e['sdma']:>10.0f} "
                    f"{_f(r['copies_per_byte'], '.2f', 9)}")
            lines.append(row)
    lines += notes
    lines += copies_table(res)
    return lines


def copies_table(res: BenchResult) -> list[str]:
    """Copies and engines at the largest size: per engine, per payload byte, against the minimum."""
    ours = [r for r in res.records if r["system"] == "stratac"]
    if not ours:
        return []
    top = max(r["size"] for r in ours)
    at = [r for r in ours if r["size"] == top] or ours
    lines = ["#", f"# copies and engines at {fmt_bytes(top)} (bytes per payload byte S, per rank and "
             "call, mean over ranks; CPU model counters)",
             "#   copies/B = (aiv out + sdma) / S, the bytes landed in GM; min = what the contract "
             "must land; fabric/B = (remote read + remote write) / S; min = what must cross between ranks",
             f"# {'schedule':<28} {'aiv in/B':>8} {'aiv out/B':>9} {'sdma/B':>7} {'copies/B':>8} "
             f"{'min':>5} {'extra/B':>7} {'fabric/B':>8} {'min':>5} {'core max/mean':>13} {'heap/rank':>10}"]
    for r in at:
        s, e = r["size"], r["engines"]
        extra = r["copies_per_byte"] - r["min_copies_per_byte"]
        lines.append(f"  {r['schedule']:<28} {e['aiv_in'] / s:>8.2f} {e['aiv_out'] / s:>9.2f} "
                     f"{e['sdma'] / s:>7.2f} {r['copies_per_byte']:>8.2f} {r['min_copies_per_byte']:>5.2f} "
                     f"{extra:>7.2f} {r['fabric_per_byte']:>8.2f} {r['min_fabric_per_byte']:>5.2f} "
                     f"{_f(r['core_balance'], '.2f', 13)} {fmt_bytes(r['heap_bytes']):>10}")
        if len({(p["aiv_in"], p["aiv_out"], p["sdma"]) for p in r["per_rank"]}) > 1:
            for p in r["per_rank"]:
                lines.append(f"    rank {p['rank']:<21} {p['aiv_in'] / s:>8.2f} {p['aiv_out'] / s:>9.2f} "
                             f"{p['sdma'] / s:>7.2f} {(p['aiv_out'] + p['sdma']) / s:>8.2f}")
    for kind in sorted({r["kind"] for r in at}):
        same = [r for r in at if r["kind"] == kind]
        best = min(same, key=lambda r: r["copies_per_byte"])
        for r in same:
            if r["staging"]:
                d = r["copies_per_byte"] - best["copies_per_byte"]
                lines.append(f"# {r['schedule']} lands {r['copies_per_byte']:.2f} B per payload byte, "
                             f"{best['schedule']} {best['copies_per_byte']:.2f}: the staging copies are "
                             f"{d:.2f} B/B more ({d * s:.0f} bytes per rank and call at this size), "
                             f"and {fmt_bytes(r['heap_bytes'] - best['heap_bytes'])} more heap per rank")
    return lines


def write_trace(trace_dir: Path, spec: BenchSpec, meta: dict) -> dict:
    """Merges the ranks' spans into one Chrome trace (chrome://tracing, ui.perfetto.dev): a
    process per rank; a track per vector core (kernel, stages named by their .strata line, flag
    waits, SyncAll, SDMA quiets), one per SDMA queue (copies), one for the whole call."""
    lines = load_source(spec.file).text.splitlines()
    events = []
    for path in sorted(trace_dir.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    t0 = min((e["ts"] for e in events), default=0.0)
    tracks: set[tuple[int, int]] = set()
    for e in events:
        e["ts"] = round(e["ts"] - t0, 3)
        tracks.add((e["pid"], e["tid"]))
        m = re.fullmatch(r"strata:(\d+)", e["name"])
        if m:
            n = int(m.group(1))
            text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
            e["name"] = f"L{n}: {text}" if text else e["name"]
    meta_events = []
    for pid in sorted({p for p, _ in tracks}):
        meta_events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"rank {pid}"}})
        meta_events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    for pid, tid in sorted(tracks):
        if tid == benchpeer.HOST_TID:
            name, order = "call (host)", -1
        elif tid >= 1000:
            name, order = f"sdma queue {tid - 1000}", 2 * (tid - 1000) + 1
        else:
            name, order = f"core {tid}", 2 * tid
        meta_events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        meta_events.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                            "args": {"sort_index": order}})
    Path(spec.trace).write_text(json.dumps(
        {"traceEvents": meta_events + events, "displayTimeUnit": "ms",
         "otherData": {"stratac": "bench --trace: one call per schedule and size, CPU model",
                       "file": str(spec.file), "world": spec.world}}) + "\n")
    return {"path": str(spec.trace), "events": len(events)}


def write_json(res: BenchResult, path: str) -> None:
    Path(path).write_text(json.dumps({"meta": res.meta, "results": res.records}, indent=1) + "\n")


def plot(res: BenchResult, path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install 'stratac[bench]'") from None
    matplotlib.use("Agg")
    if res.meta.get("moe"):
        return moe_plot(res, path)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines: dict[str, list] = {}
    for r in res.records:
        if r["busbw"] is None:
            continue
        label = f"stratac {r['schedule']}" if r["system"] == "stratac" else f"{r['system']} {r['schedule']}"
        lines.setdefault(label, []).append((r["size"], r["busbw"]))
    for label, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                linestyle="-" if label.startswith("stratac") else "--", label=label)
    c = res.meta["copy_ceiling"]
    ax.axhline(c["gbps_1_thread"], color="grey", linewidth=0.8, linestyle=":",
               label=f"copy ceiling, 1 thread ({c['gbps_1_thread']:.1f} GB/s)")
    m = res.meta
    _finish_plot(fig, ax, path, "size S (bytes)", "busbw (GB/s)",
                 f"{Path(m['file']).name}: world {m['world']}, {m['dtype']}, CPU model ({m['cpus']} CPUs)")
