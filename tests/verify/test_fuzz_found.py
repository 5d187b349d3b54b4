"""Schedules the schedule fuzzer (tests/fuzz_schedules.py) found the pipeline disagreeing on,
minimised. A gap still open is a strict xfail naming issue 23, so that its fix makes it XPASS and
fail the run; then the marker is dropped and the schedule moves to tests/verify/corpus/.
"""

from __future__ import annotations

import pytest

from stratac import verify
from stratac.diagnostics import Codes, Source
from stratac.lang import frontend

# `for c in 0 .. 1 + n / 4096` over `split(part, 1 + n / 4096)`: check samples n at 1, world + 3,
# world + 4 and 2 world + 5 only, so every sample has one chunk (c = 0) and a chunk index that is
# wrong only from c = 1 on is never executed. Each of these is verified at worlds 1-4 and is
# wrong: at world 2 with n = 4099 (two chunks) the call's own proof refuses it (E0305, "1024
# elements are wrong"), and built without the verifier (tests/verify/unverified_worker.py) it runs
# WRONG against torch (`x[3075] = 0 on rank 0, expected 6`). The fuzzer's family `chunked`.
CHUNKED = """\
schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {{
  part = split(x, world)
  chunk = split(part, 1 + n / 4096)
  barrier
  for c in 0 .. 1 + n / 4096 {{
    on aiv: chunk[rank][c] = op(chunk[rank][c]@p for p in ranks)
  }}
  barrier
  for c in 0 .. {hi} {{
    on sdma: for p in peers: chunk[rank][{idx}]@p = chunk[rank][{idx}]
  }}
  barrier
}}
"""

WRONG_CHUNKS = {
    "every step sends chunk 0": CHUNKED.format(hi="1 + n / 4096", idx="c * 0"),
    "every step sends the next chunk": CHUNKED.format(hi="1 + n / 4096", idx="(c + 1) % (1 + n / 4096)"),
    "half the steps": CHUNKED.format(hi="1 + n / 8192", idx="c"),
}


def first_error(text: str, worlds=(1, 2, 3, 4)):
    for s in frontend.schedules(Source("fuzz.strata", text)):
        for r in verify.verify_worlds(s, list(worlds)):
            if not r.ok:
                return r.diagnostics[0]
    return None


def test_the_chunked_schedule_itself_is_verified():
    """The right form of the family verifies (so the cases below differ from it by their mistake)."""
    assert first_error(CHUNKED.format(hi="1 + n / 4096", idx="c")) is None


@pytest.mark.xfail(strict=True, reason="issue 23 item 5: a step-loop bound that depends on a size is "
                   "sampled with one chunk only (fixed by another part of the issue)")
@pytest.mark.parametrize("why", sorted(WRONG_CHUNKS))
def test_a_wrong_chunk_from_the_second_on_is_rejected(why):
    d = first_error(WRONG_CHUNKS[why])
    assert d is not None and d.code == Codes.CONTRACT, d
