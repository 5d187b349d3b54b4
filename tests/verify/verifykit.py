"""What several verifier tests share: the schedules of a set of files, the instances the verifier
samples for them, and the line-deletion mutants of the examples (tests/verify/test_mutations.py,
loaded once as a module)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

from stratac import ir
from stratac.diagnostics import Source, StrataError
from stratac.lang import frontend
from stratac.verify.samples import default_samples

HERE = Path(__file__).resolve().parent


def schedules(sources) -> list[ir.Schedule]:
    """Every schedule of `sources` (paths or Sources); a file the front end refuses gives none."""
    out = []
    for src in sources:
        try:
            out += frontend.schedules(src if isinstance(src, Source) else frontend.load_source(str(src)))
        except StrataError:
            pass
    return out


def sampled(schedules: list[ir.Schedule], worlds: list[int]):
    """(schedule, world, sizes) of every instance the verifier samples; a world whose samples are
    refused gives none."""
    for s in schedules:
        for w in worlds:
            try:
                samples = default_samples(s, w)
            except StrataError:
                continue
            for sizes in samples:
                yield s, w, sizes


@functools.cache
def mutations():
    """tests/verify/test_mutations.py as a module (its mutants, its unverified-run helpers)."""
    spec = importlib.util.spec_from_file_location("_verifykit_mutations", HERE / "test_mutations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod    # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def mutant_sources() -> list[Source]:
    """Every line-deletion mutant of every example, named after the line it lacks."""
    m = mutations()
    return [Source(f"{p.stem}-without-{mut.line}.strata", mut.source)
            for p in m.EXAMPLES for mut in m.mutants(p)]
