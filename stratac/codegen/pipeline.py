"""The one compile pipeline: verify, run the passes, re-verify what the passes made, generate.

In: a .strata source (or the schedules the front end made of it), the pass options and the world
sizes to prove. Out: a `Compiled` per schedule: the IR after the passes, its generated files, and
the worlds it was proven for; or a StrataError with the first failing instance's diagnostics.
The IR after the passes is verified again (`verify.verify_lowered`) because it, not the source,
is what the kernel is generated from: a pass that breaks a barrier's stamp is then a diagnostic
here, not a hang on the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from stratac import ir, verify
from stratac.codegen.emit import Output, generate
from stratac.diagnostics import Diagnostic, Note, Source, StrataError
from stratac.ir import passes
from stratac.lang import frontend


@dataclass
class Compiled:
    schedule: ir.Schedule              # after the passes
    output: Output
    worlds: tuple[int, ...] = ()       # the world sizes it was verified for


def compile_schedules(program: Source | list[ir.Schedule], options: passes.Options,
                      worlds: list[int],
                      prove: Callable[[ir.Schedule, list[int]], list[verify.Result]] = verify.verify_worlds
                      ) -> list[Compiled]:
    """Every schedule of `program`, each verified at `worlds` before and after the passes. Nothing
    is generated unless every schedule verified. `prove`: verify.verify_worlds, or what stands for
    it (the host's, which keeps its verdicts: stratac.host.schedule.prove_worlds)."""
    schedules = frontend.schedules(program) if isinstance(program, Source) else program
    options.check()   # a wrong SoC or core count, before the verification's cost
    lowered = []
    for s in schedules:
        _proven(prove(s, worlds))
        after = passes.pipeline(s, options)
        _proven(verify.verify_lowered(after, s, worlds), after_passes=True)
        lowered.append(after)
    # a world a schedule's `requires` excludes is not proven: the call refuses it
    return [Compiled(s, generate(s), tuple(w for w in worlds if ir.unmet_requirement(s, w) is None))
            for s in lowered]


def _proven(results: list[verify.Result], after_passes: bool = False) -> None:
    bad = next((r for r in results if not r.ok), None)
    if bad is None:
        return
    diags = bad.diagnostics
    if after_passes:
        diags = [_blame_the_passes(d) for d in diags]
    raise StrataError(diags)


def _blame_the_passes(d: Diagnostic) -> Diagnostic:
    return replace(d, notes=d.notes + (Note(
        "the schedule verified, but the IR the passes made of it (what the kernel is generated "
        "from) does not: a bug of stratac's passes; please report it with this file"),))
