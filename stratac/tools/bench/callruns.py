"""Rank processes that call a file's schedules through the public API, for the measuring tools
(`python -m stratac.tools.bench.callprofile` and `stratac bench --breakdown`).

In: a spec per rank (a JSON object: the file, rank, world, heap, ...). Out: what each rank printed
on its result lines, gathered by the parent. One process per rank started with `python -m MODULE
--rank-spec SPEC`, a FileStore for the bootstrap (Communicator.from_store, no process group), every
schedule loaded with comm.load; the launcher's cffi call timed from Python (LaunchTimer).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULT = "CALLRUN "   # a rank's result line: this prefix, then JSON


def warm_build(file: str, world: int, soc: str | None = None, dtype: str = "f32", op: str = "sum") -> None:
    """Builds every schedule of FILE for `world` before the ranks start, the entry points of
    `dtype` and `op` (they then load from the cache instead of compiling at once, each)."""
    from stratac.host import schedule
    from stratac.ir import passes
    from stratac.lang.frontend import load_source
    from stratac.targets import cpu as build
    opts = passes.Options() if soc is None else passes.Options(soc=soc)
    outputs = [c.output for c in schedule.compile_source(load_source(file), opts, worlds=[world])]
    build.build_all(outputs, [[(dtype, op)]] * len(outputs))


def run_ranks(module: str, specs: list[dict], timeout: float) -> tuple[list, int, list[str]]:
    """Starts one `python -m module --rank-spec SPEC` per spec (each spec has a "tmp" directory);
    returns the JSON values of every RESULT line (rank order), the OR of the exit statuses, and the
    last lines of each failed rank's stderr. A rank's output goes to files, not pipes: a rank that
    writes much while the parent waits for another must not block on a full pipe."""
    results, status, errors = [], 0, []
    with contextlib.ExitStack() as files:
        procs, outs = [], []
        for r, spec in enumerate(specs):
            out = files.enter_context(open(Path(spec["tmp"]) / f"rank{r}.out", "w+"))
            err = files.enter_context(open(Path(spec["tmp"]) / f"rank{r}.err", "w+"))
            outs.append((out, err))
            procs.append(subprocess.Popen([sys.executable, "-m", module, "--rank-spec", json.dumps(spec)],
                                          stdout=out, stderr=err, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1")))
        deadline = time.monotonic() + timeout
        for r, p in enumerate(procs):
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                p.wait()
                errors.append(f"rank {r}: no result within {timeout:g} s")
            status |= 1 if p.returncode else 0
            out, err = outs[r]
            out.seek(0)
            err.seek(0)
            if p.returncode:
                tail = "\n".join(err.read().strip().splitlines()[-8:])
                errors.append(f"rank {r} exited with status {p.returncode}" + (f":\n{tail}" if tail else ""))
            for line in out.read().splitlines():
                if line.startswith(RESULT):
                    results.append(json.loads(line[len(RESULT):]))
    return results, status, errors


def emit(value) -> None:
    """A rank's result line (read by run_ranks)."""
    print(RESULT + json.dumps(value), flush=True)


def open_comm(spec: dict, prefix: str):
    """The rank's communicator: bootstrapped over the spec's FileStore, its heap and timeout."""
    import torch
    import torch.distributed as dist

    from stratac.host.comm import Communicator
    torch.set_num_threads(1)
    store = dist.FileStore(spec["store"], spec["world"])
    return Communicator.from_store(spec["rank"], spec["world"], store, heap_bytes=spec["heap"],
                                   timeout=spec.get("timeout", 120.0), prefix=prefix)


def workload_args(comm, fn, world: int, size: int, dtype: str, op: str = "sum", root: int = 0):
    """The heap tensors and scalars of one call of schedule `fn` at S = size bytes (zeros): returns
    (count, args, tensors); free the tensors with free_tensors."""
    import torch

    from stratac.ir import DType
    from stratac.tools.run.workload import Workload
    s = fn.ir
    dt = DType.parse(dtype)
    count = Workload.count_for_bytes(s, world, size, dt.nbytes)
    wl = Workload(s, world, count, op=op, root=root)
    tensors = {p.name: comm.zeros(wl.numel(p), dtype=getattr(torch, dt.torch_name)) for p in s.tensors}
    return count, dict(tensors, **wl.scalars), tensors


def free_tensors(comm, fn, tensors: dict) -> None:
    for p in reversed(fn.ir.tensors):
        comm.free(tensors[p.name])
    fn.release_scratch()


def heap_bytes(file: str, world: int, sizes: list[int], dtype: str) -> int:
    """A heap that holds the largest call's tensors of every schedule of FILE, with room for the
    sync area and scratch."""
    from stratac.ir import DType
    from stratac.lang.frontend import load_source, schedules
    from stratac.tools.run.workload import Workload
    elem = DType.parse(dtype).nbytes
    most = 0
    for s in schedules(load_source(file)):   # the tensors' sizes only: no proof needed here
        for size in sizes:
            wl = Workload(s, world, Workload.count_for_bytes(s, world, size, elem))
            most = max(most, sum(wl.numel(p) for p in s.tensors) * elem)
    return max(64 << 20, 2 * most + (32 << 20))


class LaunchTimer:
    """Wraps a schedule's launchers (the generated strata_launch_*'s cffi calls): `times` gets
    (entered, returned) on time.monotonic (CLOCK_MONOTONIC, the CPU model's clock) per launch.
    The calls prepared before it are dropped, so that every later call takes a wrapped launcher."""

    def __init__(self, fn):
        self.fn = fn
        self.times: list[tuple[float, float]] = []

        def timing(dtype, op, _real=fn._launcher, _times=self.times):
            real = _real(dtype, op)

            def timed(*a):
                t0 = time.monotonic()
                rc = real(*a)
                _times.append((t0, time.monotonic()))
                return rc
            return timed

        self.before = fn.__dict__.get("_launcher")   # a wrapper already there, else the class's method
        fn._launcher = timing
        fn._calls.clear()

    def restore(self) -> None:
        if self.before is None:
            del self.fn._launcher
        else:
            self.fn._launcher = self.before
        self.fn._calls.clear()


def rank_tmp(spec: dict) -> Path:
    return Path(spec["tmp"])
