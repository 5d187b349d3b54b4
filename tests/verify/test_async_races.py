"""Asynchronous copies in the race check (issue 23): an `on sdma async h:` stage's accesses stay
open from the post to its `await`, across world barriers as across a team's.

The corpus (tests/verify/corpus/race_async_*.strata, good_async_*.strata) pins the four shapes
and their corrected forms by the primary span; here: that each diagnostic names both accesses and
the await with spans, that every masked variant of the MoE shape with two live ranks or more is
refused (and the corrected one proven for every mask), that a team barrier of every rank and a
world barrier give the same verdict, and that a race of two copies in flight across several
barriers is reported once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stratac import verify
from stratac.diagnostics import Codes, Source
from stratac.lang.frontend import load_source, schedules
from stratac.verify.samples import default_samples

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SHAPES = ["race_async_allreduce_out_of_place", "race_async_allgather_ring_overlap",
          "race_async_fetch_one_rank", "race_async_moe_counts"]


def _schedule(path: Path):
    (s,) = schedules(load_source(str(path)))
    return s


def _lines(path: Path, text: str) -> set[int]:
    return {i for i, line in enumerate(path.read_text().split("\n"), 1) if text in line.split("#")[0]}


def _first_failure(s, worlds):
    bad = [r for r in verify.verify_worlds(s, worlds) if not r.ok]
    assert bad, f"{s.name} verified at worlds {worlds}"
    return bad[0].diagnostics[0]


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_names_both_accesses_and_the_await(name):
    path = CORPUS / f"{name}.strata"
    d = _first_failure(_schedule(path), [1, 2, 3, 4])
    assert d.code == Codes.RACE, d.render()
    stages = _lines(path, "on ")                     # the lines of the stages
    awaits = _lines(path, "await h")
    assert d.span.line in stages, d.render()
    other = [n for n in d.notes if n.message.endswith(" it here")]
    assert len(other) == 1 and other[0].span is not None and other[0].span.line in stages, d.render()
    in_flight = [n for n in d.notes if "in flight until this await" in n.message]
    assert in_flight and all(n.span.line in awaits for n in in_flight), d.render()
    # one of the two is the asynchronous stage's access
    async_lines = _lines(path, "on sdma async")
    assert async_lines & {d.span.line, other[0].span.line}, d.render()


@pytest.mark.parametrize("name", SHAPES)
def test_the_await_before_the_barrier_verifies(name):
    good = CORPUS / f"good_{name.removeprefix('race_').removesuffix('_overlap')}.strata"
    bad_text = (CORPUS / f"{name}.strata").read_text()
    good_text = good.read_text()
    # the same schedule, the await moved above the barrier before it
    strip = lambda t: [l for l in t.split("\n") if l.strip() and not l.startswith("#")]   # noqa: E731
    clean = lambda ls: [l.split("  # expect-error")[0] for l in ls]                         # noqa: E731
    assert sorted(clean(strip(bad_text))) == sorted(strip(good_text))
    assert all(r.ok for r in verify.verify_worlds(_schedule(good), [1, 2, 3, 4]))


def test_masked_moe_variants_race_with_two_live_ranks():
    s = _schedule(CORPUS / "race_async_moe_counts.strata")
    good = _schedule(CORPUS / "good_async_moe_counts.strata")
    seen = 0
    for w in verify.MASK_WORLDS:
        for active in verify.masks(w):
            results = [verify.verify(s, w, sizes, getattr(sizes, "routing", None), active=active)
                       for sizes in default_samples(s, w)]
            bad = [r for r in results if not r.ok]
            if sum(active) >= 2:
                assert bad, (w, active)
                d = bad[0].diagnostics[0]
                assert d.code == Codes.RACE and "race on counts" in d.message, d.render()
                assert "active ranks" in d.message, d.message   # the mask is named
                seen += 1
            else:   # one live rank pushes its counts to no one
                assert not bad, (w, active, bad[0].diagnostics[0].render())
    assert seen == 3 + 6 + 4   # world 3: the pairs; world 4: the pairs and the triples
    assert all(r.ok for r in verify.verify_masks(good, list(verify.MASK_WORLDS)))


RING = """
schedule ring(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {{
  {team}
  blk = split(out, world)
  let next = (rank + 1) % world
  on aiv: blk[rank] = x
  {barrier}
  for s in 0 .. world - 1 {{
    let b = (rank - s) % world
    on sdma async h: blk[b]@next = blk[b]
    {first}
    {second}
  }}
  {barrier}
}}
"""


@pytest.mark.parametrize("order", ["barrier then await", "await then barrier"])
def test_a_team_barrier_of_every_rank_and_a_world_barrier_agree(order):
    """Before the fix a team's barrier kept the copy open (it starts no epoch) and a world barrier
    closed it: the same schedule was refused with one and proven with the other."""
    verdicts = []
    for team, barrier in [("", "barrier"), ("team all = block(world)", "barrier(all)")]:
        first, second = (barrier, "await h") if order.startswith("barrier") else ("await h", barrier)
        src = Source(f"ring-{barrier}.strata", RING.format(team=team, barrier=barrier, first=first,
                                                           second=second))
        (s,) = schedules(src)
        bad = [r for r in verify.verify_worlds(s, [1, 2, 3, 4]) if not r.ok]
        verdicts.append(bad[0].diagnostics[0].message if bad else None)
    assert verdicts[0] == verdicts[1]
    assert (verdicts[0] is None) == (order == "await then barrier"), verdicts


def test_two_copies_in_flight_across_barriers_race_once():
    """Two asynchronous copies into one buffer, both in flight across two barriers: one race, not
    one per epoch they share."""
    src = Source("twice.strata", """
schedule s(x: sym T[n], y: sym T[n]) implements allreduce(x, sum) {
  scratch t: T[n]
  on sdma async h1: t = x
  on sdma async h2: t = y
  barrier
  barrier
  await h1
  await h2
}
""")
    (s,) = schedules(src)
    r = verify.verify(s, 1, {"n": 4})
    races = [d for d in r.diagnostics if d.code == Codes.RACE]
    assert len(races) == 1 and len(r.diagnostics) == 1, [d.render() for d in r.diagnostics]
    assert races[0].span.line == 5 and races[0].notes[0].span.line == 4, races[0].render()
