"""Gaps of the front end and the verifier that were found and closed, kept as plain regression
tests (none is marked xfail: no gap is open). A gap found later goes here as a test of what should
happen, marked `pytest.mark.xfail(strict=True, reason=...)` while it is open, so that the fix makes
it XPASS and fail the run; then the marker is dropped (and, if it fits, a corpus file added)."""

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
