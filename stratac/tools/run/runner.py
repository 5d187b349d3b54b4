"""`stratac run`: start `world` rank processes on this machine, run every schedule of a file on
the CPU build, check the results against torch and report nccl-tests style figures.

The runner compiles and builds first (so ranks find the kernels in the cache), names the
shared-memory segment, starts the ranks in their own process group, and enforces an overall
deadline. It watches all ranks at once: when one fails, the others get a few seconds to report
(they normally stop by themselves) and are then stopped. Whatever happens (a failure, the
deadline, SIGTERM or Ctrl-C to the runner), it stops every rank it started, reaps them and removes
the segment; a rank whose runner dies is killed too (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from stratac.codegen import abi
from stratac.codegen.pipeline import compile_schedules
from stratac.diagnostics import Codes, StrataError, error
from stratac.host import comm
from stratac.host.schedule import prove_worlds
from stratac.ir import passes
from stratac.lang.frontend import load_source
from stratac.tools.run.procs import Rank
from stratac.tools.run.procs import kill as kill_ranks
from stratac.targets import cpu as build
from stratac.tools.run.worker import RESULT_PREFIX


@dataclass(frozen=True)
class Case:
    dtype: str = "f32"
    count: int | None = None     # elements of the size symbol, or
    size: int | None = None      # bytes, nccl-tests' S
    op: str = "sum"              # for schedules with a redop parameter
    root: int = 0                # for schedules with rank parameters
    # MoE dispatch/combine (None: workload.MOE_DEFAULTS)
    tokens: int | None = None
    hidden: int | None = None
    topk: int | None = None
    experts: int | None = None
    routing: str = "uniform"
    max_recv: int | None = None   # rows of a bounded packed window (None: world x tokens x topk)
    capacity: int | None = None   # slots per (expert, source rank) of a slotted layout (None: tokens)
    params: dict[str, int] = field(default_factory=dict)   # divisor parameters by name (--param)


def entry_uses(cases: list[Case]) -> list[tuple[str, str]]:
    """The (dtype, op) pairs the cases launch, as stratac.targets.cpu.build_all takes them."""
    return sorted({(case.dtype, case.op) for case in cases})


@dataclass
class RunSpec:
    file: str | list[str]         # a .strata file, or several run in one job (each its own module)
    world: int
    cases: list[Case] = field(default_factory=lambda: [Case(size=1 << 20)])
    iters: int = 5
    warmup: int = 1
    timeout: float = 60.0
    check: bool = True
    seed: int = 0
    soc: str = passes.DEFAULT_SOC
    cores: int | None = None
    heap_bytes: int | None = None
    target: str = "cpu"          # "npu": CANN build, SHMEM heap on the NPUs (stratac.targets.npu, stratac.host.npu_comm)
    bench: dict | None = None    # `stratac bench`: peer measurements and gate (stratac.tools.bench.benchpeer)
    selected: bool = False       # run each contract's selecting entry point, not every schedule
    selection: str | None = None  # its table (stratac.host.select; None: this machine's default)


@dataclass
class RunOutcome:
    results: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    exit_code: int = 0


def spec_files(spec: RunSpec) -> list[str]:
    """The files a run loads, in order: each is compiled and loaded as its own module, so a kernel
    is the one its own file builds (one job for several files, without a concatenation whose line
    numbers would make other kernels)."""
    files = [spec.file] if isinstance(spec.file, (str, Path)) else list(spec.file)
    if not files:
        raise ValueError("RunSpec.file: no .strata file to run")
    return [str(f) for f in files]


def heap_bytes(spec: RunSpec, schedules) -> int:
    """Enough for every schedule's tensors (allocated one schedule at a time) plus the flags."""
    if spec.heap_bytes:
        return spec.heap_bytes
    from stratac.ir import DType
    from stratac.tools.run.workload import Workload
    need = 0
    for case in spec.cases:
        elem = DType.parse(case.dtype).nbytes
        for moe in moe_workloads(spec, case, schedules):   # a pair's tensors are live together
            total = 0
            for s in (x for x in (moe.dispatch, moe.combine) if x is not None):
                for p in s.params:
                    n = math.prod(moe.shape(s, p))
                    total += (max(n, 1) * (p.dtype.nbytes if p.dtype else elem) + 511) // 512 * 512
            need = max(need, total)
        for c in schedules:
            s = c.schedule
            if s.contract.kind.moe:
                continue
            n = case.count if case.count is not None else \
                Workload.count_for_bytes(s, spec.world, case.size, elem)
            wl = Workload(s, spec.world, n, params=tuple(sorted(case.params.items())), elem=elem)
            # tensors and scratch (s.params has both), each rounded to the allocator's 512 bytes
            need = max(need, sum((max(wl.numel(p), 1) * elem + 511) // 512 * 512 for p in s.params))
    return need + abi.sync_area_bytes(spec.world) + (1 << 20)


def moe_workloads(spec: RunSpec, case: Case, schedules) -> list:
    """The MoE workload of every dispatch/combine pair (and AllToAllV) of the file for a case."""
    from stratac.tools.run.workload import MoeWorkload, PairingError, moe_pairs
    try:
        pairs = [i for i in moe_pairs([c.schedule for c in schedules]) if isinstance(i, tuple)]
    except PairingError as exc:
        raise StrataError(error(Codes.BAD_CONTRACT, str(exc))) from None
    return [MoeWorkload.make(disp, comb, spec.world, case.tokens, case.hidden, case.topk, case.experts,
                             case.routing, case.max_recv, case.capacity) for disp, comb in pairs]


def _check_moe_case(spec: RunSpec, case: Case) -> None:
    from stratac.tools.run.workload import moe_options_problem
    problem = moe_options_problem(spec.world, case.topk, case.experts, case.routing)
    if problem:
        raise StrataError(error(Codes.BAD_WORLD, problem))


def run(spec: RunSpec, echo=print) -> RunOutcome:
    if spec.world < 1:
        raise StrataError(error(Codes.BAD_WORLD, f"--world must be at least 1, got {spec.world}"))
    for case in spec.cases:
        if not 0 <= case.root < spec.world:
            raise StrataError(error(Codes.BAD_WORLD, f"--root {case.root} is not a rank of a world of "
                                    f"{spec.world}"))
    for case in spec.cases:
        _check_moe_case(spec, case)
    if spec.target == "npu":
        from stratac.targets import npu
        npu.require_npu()   # names every missing piece (CANN, SHMEM, torch_npu, devices)
    files = spec_files(spec)
    opts = passes.Options(soc=spec.soc, cores=spec.cores)
    opts.check()
    # its proof kept as a verdict, which every rank's comm.load then reads (prove_worlds)
    compiled, where = [], {}
    for f in files:
        for c in compile_schedules(load_source(f), opts, [spec.world], prove_worlds):
            if c.schedule.name in where:   # the results name schedules: one name, one schedule
                raise StrataError(error(Codes.DUPLICATE_NAME, f"schedule {c.schedule.name} is defined in "
                                        f"both {where[c.schedule.name]} and {f}: the files of one run "
                                        "must name their schedules apart"))
            where[c.schedule.name] = f
            compiled.append(c)
    routed = [c.schedule.name for c in compiled if c.schedule.contract.kind.moe]
    from stratac.tools.run.workload import divisor_problem, layout_options_problem
    for case in spec.cases:
        problem = (layout_options_problem([c.schedule for c in compiled], case.max_recv, case.capacity)
                   or divisor_problem([c.schedule for c in compiled], spec.world, case.params,
                                      None if spec.bench is None else "bench"))
        if problem:
            raise StrataError(error(Codes.BAD_CONTRACT, f"{', '.join(files)}: {problem}; nothing was run"))
    for case in spec.cases:
        if routed and case.dtype in ("i32", "i8"):
            raise StrataError(error(Codes.BAD_TYPE, f"{routed[0]} moves float tokens: --dtype f32, f16 "
                                    "or bf16 (an int8 dispatch quantises tokens of that dtype itself)"))
        generic = [c.schedule.name for c in compiled if c.schedule.typevars]
        if generic and case.dtype == "i8":
            raise StrataError(error(Codes.BAD_TYPE, f"{generic[0]} is not built for i8: int8 is a payload "
                                    "to move (a quantised MoE dispatch's rows), not a type variable's type"))
    # warm the cache: the ranks then load without compiling (on the CPU model, the entry points
    # of the cases' element types and ops, each as a call builds it)
    if spec.target == "npu":
        for c in compiled:
            npu.build(c.output, spec.soc)
    else:
        uses = entry_uses(spec.cases)
        build.build_all([c.output for c in compiled], [uses] * len(compiled))
    heap = heap_bytes(spec, compiled)
    shm = os.statvfs("/dev/shm")
    free = shm.f_bavail * shm.f_frsize
    if spec.target == "cpu" and heap * spec.world > free:
        raise StrataError(error(Codes.BAD_WORLD, f"the symmetric heap needs {heap * spec.world} bytes of "
                                f"shared memory ({spec.world} ranks x {heap} bytes), but /dev/shm has "
                                f"{free} bytes free: use a smaller --size or --count"))
    segment = comm._segment_name()
    outcome = RunOutcome()
    with tempfile.TemporaryDirectory(prefix="stratac-run-") as tmp:
        procs: list[Rank] = []
        logs = []
        env = dict(os.environ, OMP_NUM_THREADS="1")
        # the deadline covers start-up, the timed iterations and the checks of every schedule
        limit = 60 + spec.timeout * (2 + len(compiled) * len(spec.cases))
        stopped: dict[int, tuple[float, str]] = {}
        try:
            with _terminate_as_exit():
                for r in range(spec.world):
                    wspec = {"files": [str(Path(f).resolve()) for f in files], "rank": r, "world": spec.world,
                             "store": str(Path(tmp) / "store"), "segment": segment, "heap_bytes": heap,
                             "timeout": spec.timeout, "soc": spec.soc, "cores": spec.cores,
                             "cases": [vars(c) for c in spec.cases],
                             "iters": spec.iters, "warmup": spec.warmup, "seed": spec.seed,
                             "bench": spec.bench, "target": spec.target,
                             "selected": spec.selected, "selection": spec.selection}
                    # output goes to files, not pipes: a rank never blocks on a full pipe nobody reads
                    out = open(Path(tmp) / f"rank{r}.out", "w+", encoding="utf-8", errors="replace")
                    err = open(Path(tmp) / f"rank{r}.err", "w+", encoding="utf-8", errors="replace")
                    logs.append((out, err))
                    procs.append(Rank(["-m", "stratac.tools.run.worker", json.dumps(wspec)],
                                      out, err, env))
                stopped = _supervise(procs, time.monotonic() + limit, limit)
        finally:
            kill_ranks(procs)
            comm.unlink_segment(segment)   # normally gone already: rank 0 removes it once all mapped
        ended = sorted(stopped, key=lambda r: (stopped[r][0], r))   # the first failure first
        for r, p in enumerate(procs):
            out, err = logs[r]
            out.seek(0)
            for line in out.read().splitlines():
                if line.startswith(RESULT_PREFIX):
                    outcome.results.append(json.loads(line[len(RESULT_PREFIX):]))
                elif line.strip():
                    echo(f"[rank {r}] {line}")
        for r in ended:
            p = procs[r]
            out, err = logs[r]
            err.seek(0)
            msg = err.read().strip().splitlines()
            detail = "\n".join(msg[-12:]) if msg else ""
            tail = f":\n{detail}" if detail else ""
            if r in stopped and stopped[r][1]:
                outcome.failures.append(f"rank {r}: {stopped[r][1]}; stopped" + tail)
            elif p.returncode is not None and p.returncode < 0:
                outcome.failures.append(f"rank {r} was killed by {_signame(-p.returncode)}" + tail)
            elif p.returncode != 0:
                outcome.failures.append(f"rank {r} exited with status {p.returncode}" + tail)
        for out, err in logs:
            out.close()
            err.close()
    wrong = [r for r in outcome.results if not r["ok"]]
    if outcome.failures:
        outcome.exit_code = 1
    elif spec.check and wrong:
        outcome.exit_code = 1
    return outcome


GRACE_S = 2.0   # how long the other ranks may take to report after one rank failed


def _supervise(procs, deadline: float, limit: float) -> dict[int, tuple[float, str]]:
    """Waits for every rank. Once one fails, the others get GRACE_S to report (they normally stop
    by themselves: the failing rank aborts the heap, a dead one is noticed within 50 ms) and are
    then stopped; at the overall deadline everything still running is stopped. Returns, for each
    rank that ended badly, when (for ordering: the first failure is the cause) and, if the runner
    stopped it, why."""
    ended: dict[int, tuple[float, str]] = {}
    done: set[int] = set()
    first_fail: tuple[float, int] | None = None
    while True:
        now = time.monotonic()
        running = []
        for r, p in enumerate(procs):
            if r in done:
                continue
            rc = p.poll()
            if rc is None:
                running.append(r)
                continue
            done.add(r)
            if rc != 0:
                ended[r] = (now, "")
                if first_fail is None:
                    first_fail = (now, r)
        if not running:
            return ended
        why = ""
        if now > deadline:
            why = f"still running at the run's deadline ({limit:.0f} s)"
        elif first_fail is not None and now > first_fail[0] + GRACE_S:
            why = f"still running {GRACE_S:.0f} s after rank {first_fail[1]} failed"
        if why:
            for r in running:
                ended[r] = (now, why)
            kill_ranks(procs)
            return ended
        time.sleep(0.02)


class _terminate_as_exit:
    """SIGTERM/SIGHUP to the runner unwind it like Ctrl-C, so that it stops the ranks it started."""

    def __enter__(self):
        import threading
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self.saved[sig] = signal.signal(sig, _raise_exit)
        return self

    def __exit__(self, *exc):
        for sig, old in self.saved.items():
            signal.signal(sig, old)


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n}"


def report(outcome: RunOutcome, check: bool) -> list[str]:
    """One line per schedule (rank 0's view; time is the slowest rank's)."""
    lines = []
    head = (f"{'schedule':<30} {'world':>5} {'size':>9} {'count':>10} {'type':>4} {'op':>4} {'time(us)':>10} "
            f"{'algbw':>7} {'busbw':>7} {'cores':>5} {'aiv bytes':>10} {'sdma bytes':>10} {'core max/mean':>13} "
            f"{'heap/rank':>10}  result")
    lines.append(head)
    for r in (r for r in outcome.results if r["rank"] == 0):
        t = r["time_s"]
        algbw = r["size"] / t / 1e9 if t > 0 else 0.0
        busbw = algbw * r["busbw_factor"]
        ctr = r["counters"]
        aiv = sum(c["mte_in"] + c["mte_out"] for c in ctr)
        sdma = sum(c["sdma"] for c in ctr)
        per_core = [c["mte_in"] + c["mte_out"] + c["sdma"] for c in ctr]
        mean = sum(per_core) / len(per_core) if per_core else 0
        balance = f"{max(per_core) / mean:.2f}" if mean else "-"
        result = "OK" if r["ranks_wrong"] == 0 else f"WRONG ({r['ranks_wrong']} ranks)"
        if not check:
            result = "unchecked"
        lines.append(f"{r['schedule']:<30} {r['world']:>5} {_fmt_bytes(r['size']):>9} {r['count']:>10} "
                     f"{r['dtype']:>4} {r.get('op') or '-':>4} {t * 1e6:>10.1f} {algbw:>7.2f} {busbw:>7.2f} {r['cores']:>5} {aiv:>10} {sdma:>10} "
                     f"{balance:>13} {_fmt_bytes(r['heap_bytes']):>10}  {result}")
    moe = [r for r in outcome.results if r["rank"] == 0 and r.get("moe")]
    for r in moe:
        m = r["moe"]
        if m.get("alltoallv"):
            lines.append(f"  AllToAllV {r['schedule']}: rows {m['tokens']}/rank of {m['hidden']} elements, "
                         f"destinations {m['routing']}; output {m['window_rows']} rows; size = received "
                         "bytes per rank (mean)")
        elif m["phase"] == "dispatch":
            cap = f", capacity {m['capacity']} slots per (expert, source)" if m["capacity"] else ""
            lines.append(f"  MoE {r['schedule']}: tokens {m['tokens']}/rank, hidden {m['hidden']}, topk "
                         f"{m['topk']}, experts {m['experts']}, routing {m['routing']}; window "
                         f"{m['window_rows']} rows{cap}; size = received bytes per rank (mean)")
    for r in (r for r in outcome.results if r["rank"] == 0 and r.get("picked")):
        lines.append(f"  {r['schedule']} at {_fmt_bytes(r['size'])}: picked {r['picked']}")
    for r in outcome.results:
        if not r["ok"] and r["why"]:
            lines.append(f"  {r['schedule']} rank {r['rank']}: {r['why']}")
    return lines
