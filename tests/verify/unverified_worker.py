"""TEST HOOK: one rank of `stratac run` that loads its schedules WITHOUT stratac.verify.

`python unverified_worker.py SPEC` is stratac.tools.run.worker with two things taken away: comm.load
compiles without the verifier (the passes, code generation and build only, as
tests/faults/ranks.py's load_unverified_for_tests does) and a call skips the proof of its instance.
tests/verify/test_mutations.py starts it in place of the worker to show that the run's oracle (the
torch reference) reports a schedule the verifier rejects as WRONG or hung, so that a mutant it calls
OK has really been checked. Production code has no way to skip verification.
"""

from __future__ import annotations

import os
import sys

from stratac import codegen
from stratac.codegen.pipeline import Compiled
from stratac.ir import passes
from stratac.lang import frontend


def compile_unverified(source, options: passes.Options, worlds: list[int], prove=None) -> list[Compiled]:
    """compile_schedules' signature and output, without either verification (`prove` ignored)."""
    out = []
    for s in frontend.schedules(source):
        lowered = passes.pipeline(s, options)
        out.append(Compiled(lowered, codegen.generate(lowered), tuple(worlds)))
    return out


def main(spec_text: str) -> int:
    from stratac.host import comm, schedule
    from stratac.tools.run import worker
    comm.compile_source = compile_unverified
    schedule.Schedule._check_instance = lambda self, params, active=None: None
    return worker.main(spec_text)


if __name__ == "__main__":
    status = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)   # as the worker does: skip the interpreter's teardown of torch
