"""Schedules the schedule fuzzer (tests/fuzz_schedules.py) found the pipeline disagreeing on,
minimised, kept as regressions. Each was a gap of issue 23 when the fuzzer found it (the comment
above each says which and how it showed); all are closed now. A gap still open would be a strict
xfail naming its issue, so that its fix makes it XPASS and fail the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fuzz_schedules as fs

from stratac import verify
from stratac.diagnostics import Codes, Source
from stratac.lang import frontend

# `for c in 0 .. 1 + n / 4096` over `split(part, 1 + n / 4096)`: check sampled n at 1, world + 3,
# world + 4 and 2 world + 5 only (now also where the trip count reaches 2 and 3: issue 23 item 5), so every sample has one chunk (c = 0) and a chunk index that is
# wrong only from c = 1 on was never executed. Each of these was verified at worlds 1-4 and is
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

# (The fuzzer's third form, each step sending the next chunk, `(c + 1) % (1 + n / 4096)`, is a
# permutation of the chunks: every chunk is still sent, so it is correct and is not listed; the
# verifier proves it at the trip counts 1, 2 and 3.)
WRONG_CHUNKS = {
    "every step sends chunk 0": CHUNKED.format(hi="1 + n / 4096", idx="c * 0"),
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
    # each step sending the next chunk still sends every chunk once: correct, and proven
    assert first_error(CHUNKED.format(hi="1 + n / 4096", idx="(c + 1) % (1 + n / 4096)")) is None


@pytest.mark.parametrize("why", sorted(WRONG_CHUNKS))
def test_a_wrong_chunk_from_the_second_on_is_rejected(why):
    d = first_error(WRONG_CHUNKS[why])
    assert d is not None and d.code == Codes.CONTRACT, d


# The ring AllGather with a barrier per step whose copy is asynchronous and awaited AFTER the
# step's barrier (the fuzzer's family `allgather`, mode ring_barrier, step_async
# barrier_then_await, and the barrier after the loop): at step s + 1 the next rank forwards the
# block this rank's step-s copy is still writing into it. Issue 23's first shape family ("a ring
# AllGather whose steps overlap"): the race check compares accesses only between the same two
# world barriers, so it was verified at worlds 1-4, and at world 4 it ran WRONG on the CPU build
# (`out[1] = -3.0 on rank 0, expected 3.0`; at world 3 it ran OK).
RING_AWAIT_AFTER_BARRIER = """\
schedule fz(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  blk = split(out, world)
  on sdma: blk[rank] = x
  barrier
  for s in 0 .. world - 1 {
    let b = (rank - s) % world
    on sdma async h: blk[b]@((rank + 1) % world) = blk[b]
    barrier
    await h
  }
  barrier
}
"""


def test_the_ring_with_the_await_before_the_barrier_is_verified():
    assert first_error(RING_AWAIT_AFTER_BARRIER.replace("    barrier\n    await h", "    await h\n    barrier")) is None


def test_an_async_step_awaited_after_the_barrier_is_a_race():
    d = first_error(RING_AWAIT_AFTER_BARRIER, worlds=(3, 4))
    assert d is not None and d.code == Codes.RACE, d


# The ring AllReduce (examples/allreduce_ring.strata) with its step loop's bound written
# `-1 & (2 * world - 2)` or `0 | (2 * world - 2)` (the fuzzer's equivalent rewrites of an
# expression, `~hi_e`; its long run found the second on the unchanged ring): verified (the value
# is 2 * world - 2), but the kernel prints `s_ < (-1) & (2 * world - 2)`, which C++ reads as
# `(s_ < -1) & ...`: the loop never runs and the last wait hangs (`flag got[1] ... never signalled`
# at world 2); and `s_ < 0 | (2 * world - 2)`, true for ever: the loop runs past its flags and the
# CPU model stops a signal outside the heap (`aclshmemx_signal_op: ... is not in this rank's heap
# instance`). Issue 23's second bug (loop-bound parentheses in the templates).
RING = (Path(__file__).resolve().parents[2] / "examples" / "allreduce_ring.strata").read_text(encoding="utf-8")
RING_MASKED_BOUND = {
    form: RING.replace("for s in 0 .. 2 * world - 2 {", f"for s in 0 .. {form} {{")
    for form in ("-1 & (2 * world - 2)", "0 | (2 * world - 2)")}


@pytest.fixture
def fuzz_cache(monkeypatch) -> Path:
    path = Path(os.environ.get("STRATAC_FUZZ_CACHE", Path.home() / ".cache" / "stratac-fuzz"))
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(path))
    return path


@pytest.mark.parametrize("form", sorted(RING_MASKED_BOUND))
def test_the_masked_bound_is_verified(form):
    assert form in RING_MASKED_BOUND[form]
    assert first_error(RING_MASKED_BOUND[form]) is None


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(RING_MASKED_BOUND))
def test_the_masked_bound_runs_ok(form, tmp_path, fuzz_cache):
    got = fs.run(RING_MASKED_BOUND[form], "ring-masked-bound", 2, True, tmp_path)
    assert got.kind == "OK", f"{got.kind}: {got.detail}"


@pytest.mark.slow
def test_the_ring_awaited_after_the_barrier_runs_ok_or_is_rejected(tmp_path, fuzz_cache):
    got = fs.run(RING_AWAIT_AFTER_BARRIER, "ring-await-after-barrier", 4, True, tmp_path)
    assert got.kind in ("OK", "REJECTED", "REFUSED"), f"{got.kind}: {got.detail}"
