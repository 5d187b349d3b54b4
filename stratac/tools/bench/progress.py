"""The progress bar of a sweep, on stderr, while the runner measures.

In: the gate the ranks (and the MPI job) mark after each case, and the sweep's cases. Out: one
line, redrawn twice a second: cases done (or measurements, with the MPI job's turns), the next
size or tokens and routing, the time so far.
"""

from __future__ import annotations

import sys
import threading
import time

from stratac.tools.bench import benchpeer
from stratac.tools.bench.report import fmt_bytes
from stratac.tools.run import runner


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
