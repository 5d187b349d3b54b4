"""Known gaps, pinned as strict xfails: each states what should happen. When a fix lands the test
XPASSes, which fails the run: then drop the xfail marker and, if it fits, add a corpus file."""

from __future__ import annotations

import pytest

from stratac import frontend, verify
from stratac.diagnostics import Codes, Source, StrataError


def errors(text: str, worlds=range(1, 9)):
    try:
        schedules = frontend.schedules(Source("gap.strata", text))
    except StrataError as exc:
        return exc.diagnostics
    out = []
    for s in schedules:
        bad = [r for r in verify.verify_worlds(s, list(worlds)) if not r.ok]
        if bad:
            out.extend(bad[0].diagnostics)
    return out


@pytest.mark.xfail(strict=True, reason="sema rejects a copy between two remote ranks only `on sdma`; "
                   "`on auto` sends copies of 256 KiB and more to SDMA at run time (Via::kAuto), "
                   "where one side must be local, so the same copy must be rejected there too (or "
                   "code generation must keep such copies on the vector cores)")
def test_auto_copy_between_two_remote_ranks_is_rejected():
    ds = errors("""schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  barrier
  on auto: for p in ranks: blk[p]@p = x@p
  barrier
}""")
    assert ds and ds[0].code == Codes.BAD_ENGINE and ds[0].span.line == 4


def test_the_same_copy_on_aiv_passes_sema():
    # the vector cores may copy between two remote ranks; this schedule is wrong only because
    # every rank writes every block p@p: a race, found by the verifier
    ds = errors("""schedule s(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  barrier
  on aiv: for p in ranks: blk[p]@p = x@p
  barrier
}""")
    assert {d.code for d in ds} == {Codes.RACE}


@pytest.mark.xfail(strict=True, reason="a split part index is not checked against the number of parts: "
                   "part k >= parts is an empty region at the end of the buffer whenever the buffer "
                   "has fewer elements than parts, which every default sample of a split into 100 "
                   "has, so the schedule verifies")
def test_split_part_index_beyond_the_parts_is_rejected():
    ds = errors("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  part = split(x, 100)
  barrier
  on aiv: part[100] = sum(part[100]@p for p in ranks)
  barrier
}""")
    assert ds and ds[0].code == Codes.SHAPE and ds[0].span.line == 4
