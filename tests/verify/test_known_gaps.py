"""Known gaps of the front end and the verifier, pinned as strict xfails that state what should
happen. When a fix lands the test XPASSes, which fails the run: then drop the marker (the test stays
as a regression test) and, if it fits, add a corpus file. No gap is open at the moment."""

from __future__ import annotations

from stratac import verify
from stratac.diagnostics import Codes, Source, StrataError
from stratac.lang import frontend


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


def test_split_part_index_beyond_the_parts_is_rejected():
    ds = errors("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  part = split(x, 100)
  barrier
  on aiv: part[100] = sum(part[100]@p for p in ranks)
  barrier
}""")
    assert ds and ds[0].code == Codes.SHAPE and ds[0].span.line == 4
