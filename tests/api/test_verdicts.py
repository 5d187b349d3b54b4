"""The proof of a call's instance, without ranks: the call's own instance is proven at its own
size, the relation a refused region breaks, and the verdict cache's trust (stratac.host.instance, stratac.targets.verdicts)."""

import json
import os
from pathlib import Path

import pytest
from call_schedules import BIG_ONLY, EVEN_ONLY, GRAB

from stratac.diagnostics import Source
from stratac.host import instance
from stratac.host.errors import StrataUsageError
from stratac.ir import passes
from stratac.lang import frontend
from stratac.targets import verdicts

AR = Path(__file__).resolve().parents[2] / "examples" / "allreduce_twoshot.strata"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def lowered(source: Source):
    return passes.pipeline(frontend.schedules(source)[0], passes.Options(cores=2))


def test_an_instance_is_proven_as_it_is_whatever_its_size():
    s = lowered(frontend.load_source(AR))
    assert instance.check(s, 8, {"n": 1000}).proof == {"sizes": {"n": 1000}, "routings": []}
    v = instance.check(s, 8, {"n": (1 << 23) + 3})
    assert v.proof == {"sizes": {"n": (1 << 23) + 3}, "routings": []} and not v.cached
    assert instance.check(s, 8, {"n": (1 << 23) + 3}).cached


def test_a_large_call_is_refused_on_what_its_own_instance_does():
    s = lowered(Source("even.strata", EVEN_ONLY))
    assert instance.check(s, 4, {"n": 1 << 22}).proof["sizes"] == {"n": 1 << 22}
    with pytest.raises(StrataUsageError) as exc:
        instance.check(s, 4, {"n": (1 << 22) + 1})
    assert str(exc.value).startswith(
        "even_only: this call's instance (world=4, n=4194305) is not proven, so it was refused "
        "before anything was written:\neven.strata:"), str(exc.value)
    assert "x@0[1048577] should be" in str(exc.value), str(exc.value)   # part 1's first element


CUT = """
schedule ag(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {
  let cut = (n if n < 5000 else n - 1)
  on sdma: out[rank * n:(rank + 1) * n] = x
  barrier
  on sdma: for p in peers: out[p * n:p * n + cut] = x[0:cut]@p
  barrier
}
"""


def test_a_large_call_is_proven_on_its_side_of_a_conditional_expression():
    """A schedule right only below n = 5000 (a conditional drops an element from there on): a
    large call is proven at its own size, on its side of the condition, and refused."""
    s = lowered(Source("cut.strata", CUT))
    assert instance.check(s, 2, {"n": 4999}).proof["sizes"] == {"n": 4999}
    for n in (5000, 1 << 24):
        with pytest.raises(StrataUsageError) as exc:
            instance.check(s, 2, {"n": n})
        assert "is not proven, so it was refused before anything was written" in str(exc.value)
        assert "out@0[" in str(exc.value) or "out@1[" in str(exc.value), str(exc.value)


def test_a_schedule_right_only_above_33_million_elements_is_proven_there_and_refused_below():
    """No smaller instance stands in for a large one: each is proven at its own size."""
    s = lowered(Source("big.strata", BIG_ONLY))
    assert instance.check(s, 2, {"n": 40_000_000}).proof["sizes"] == {"n": 40_000_000}
    with pytest.raises(StrataUsageError, match=r"^big_only: this call's instance \(world=2, n=1000\) "
                       r"is not proven"):
        instance.check(s, 2, {"n": 1000})
    g = lowered(Source("grab.strata", GRAB))
    assert instance.check(g, 2, {"n": 3_000_000, "m": 3_000_000, "root": 1}).proof["sizes"] == \
        {"n": 3_000_000, "m": 3_000_000, "root": 1}


def test_a_region_outside_its_tensor_names_the_parameter_and_the_relation():
    s = lowered(Source("grab.strata", GRAB))
    with pytest.raises(StrataUsageError, match=r"^grab: on rank 0, line 4 reads x\[0:m\]@root = x\[0:9\], "
                       r"but parameter x has 8 elements: the schedule was proven for calls where "
                       r"m <= n, and this call has m = 9, n = 8; nothing was written$"):
        instance.check(s, 2, {"n": 8, "m": 9, "root": 1})
    assert not (verdicts.cache_root() / "verdicts").exists() or \
        not list((verdicts.cache_root() / "verdicts").glob("*.json"))


def test_a_verdict_is_believed_only_when_it_is_intact_own_and_about_this_instance():
    s = lowered(frontend.load_source(AR))
    proofs = []

    def prove():
        proofs.append(1)
        return {"sizes": {"n": 7}}

    assert not verdicts.verdict(s, 2, {"n": 7}, prove).cached
    assert verdicts.verdict(s, 2, {"n": 7}, prove).cached and len(proofs) == 1
    path = verdicts.verdict_path(s, 2, {"n": 7})
    # a consistent verdict, checksum and all, but about another instance: not this one's
    other = verdicts.verdict_path(s, 2, {"n": 8})
    verdicts.verdict(s, 2, {"n": 8}, prove)
    os.replace(other, path)
    assert not verdicts.verdict(s, 2, {"n": 7}, prove).cached and len(proofs) == 3
    assert json.loads(path.read_text())["fields"]["params"] == {"n": 7}
    os.chmod(path, 0o664)                       # writable by the group: anyone there could forge it
    assert not verdicts.verdict(s, 2, {"n": 7}, prove).cached and len(proofs) == 4
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(StrataUsageError):      # a refusal is not stored
        verdicts.verdict(s, 2, {"n": 5}, lambda: (_ for _ in ()).throw(StrataUsageError("no")))
    assert not verdicts.verdict_path(s, 2, {"n": 5}).exists()


DECODE = Path(__file__).resolve().parents[2] / "examples" / "moe_decode.strata"
# 10 tokens, topk 2, 4 experts at world 2: under the seed-0 sample routings a rank sends one expert
# up to 8 (uniform, sparse), 10 (single, empty) entries
DECODE_SIZES = {"tokens": 10, "hidden": 32, "topk": 2, "experts": 4}


def test_a_decode_capacity_the_routing_fills_exactly_is_proven_with_every_slot_in_use():
    """A call's capacity of 7, which its own routing may fill exactly, is below what every random
    sample routing needs (8): it is proven under routing.FULL, whose entries fill 7 slots of one
    expert after another (it used to be refused as unprovable, while 8 passed)."""
    s = lowered(frontend.load_source(DECODE))
    assert instance.check(s, 2, {**DECODE_SIZES, "capacity": 7}).proof["routings"] == ["full"]
    assert instance.check(s, 2, {**DECODE_SIZES, "capacity": 8}).proof["routings"] == [
        "uniform", "sparse", "full"]


def test_a_capacity_no_sample_routing_fits_names_the_least_provable_one():
    s = lowered(frontend.load_source(DECODE))
    with pytest.raises(StrataUsageError, match=r"^moe_decode_dispatch: this call's instance \(world=2, "
                       r"capacity=0, experts=4, hidden=32, tokens=10, topk=2\) cannot be proven: none of "
                       r"the verifier's sample routings fits its capacity \(0\); the least capacity the "
                       r"verifier can prove at these sizes is 1; nothing was written$"):
        instance.check(s, 2, {**DECODE_SIZES, "capacity": 0})


def test_a_files_proof_at_a_world_is_kept_and_a_failed_one_is_not(monkeypatch):
    """comm.load proves every schedule at its world once per IR, stratac and world: ranks that load
    a file at once read the one that proved it (stratac.host.schedule.prove_worlds)."""
    from stratac import verify
    from stratac.diagnostics import StrataError
    from stratac.host import schedule
    proofs = []
    real = verify.verify_worlds

    def counted(s, worlds, samples=None):
        proofs.append((s.name, tuple(worlds)))
        return real(s, worlds, samples)

    monkeypatch.setattr(verify, "verify_worlds", counted)
    src = frontend.load_source(AR)
    schedule.compile_source(src, passes.Options(cores=2), worlds=[3, 4])
    assert proofs == [("allreduce_twoshot", (3,)), ("allreduce_twoshot", (4,))]
    schedule.compile_source(src, passes.Options(cores=2), worlds=[4, 5])
    assert proofs[2:] == [("allreduce_twoshot", (5,))]            # world 4's verdict was read
    bad = Source("even.strata", EVEN_ONLY.replace("n % 2 == 0", "n % 2 == 1"))
    for _ in range(2):
        with pytest.raises(StrataError, match="does not implement"):
            schedule.compile_source(bad, passes.Options(cores=2), worlds=[2])
    assert [p for p in proofs if p[0] == "even_only"] == [("even_only", (2,))] * 2


STATE = """
schedule state(x: sym T[n], out: sym T[m], root: rank) implements broadcast(x -> out, root) {
  var k = 0
  for s in 0 .. 3 {
    if rank > 0: set k = k + s
  }
  barrier
  on sdma: out[0:m] = x[k:k + m]@root
  barrier
}
"""


def test_the_walk_follows_loop_state_step_by_step():
    """Loop state (`set` in a step loop) is carried from step to step by the walk before a call:
    rank 0's k stays 0 and rank 1's reaches 0 + 1 + 2 = 3, so rank 1 reads past x. (The schedule
    is no broadcast: the walk refuses the region before the proof would.)"""
    s = lowered(Source("state.strata", STATE))
    with pytest.raises(StrataUsageError, match=r"^state: on rank 1, line 8 reads x\[k:k \+ m\]@root = "
                       r"x\[3:9\], but parameter x has 8 elements"):
        instance.check(s, 2, {"n": 8, "m": 6, "root": 0})


LAST = """
schedule last(x: sym T[n], op: redop) implements allreduce(x, op) {
  for p in peers {
    if rank == world - 1 {
      if p == 2: on aiv: x[0:n + p] = x[0:n + p]@p
    }
  }
}
"""
PEEK = """
schedule peek(x: sym T[n], op: redop) implements allreduce(x, op) {
  on aiv {
    for p in peers {
      if rank == world - 1: x[0:1] = x[p + 1:p + 2]@p
    }
  }
}
"""


@pytest.mark.parametrize("block", [1, 4096], ids=["rank-by-rank", "all-ranks-at-once"])
@pytest.mark.parametrize("source, message", [
    # around stages `for p in peers` is a step loop whose variable counts the steps, p standing
    # for (rank + p) % world: rank 8 reaches peer 2 at step 3
    (LAST, (r"^last: on rank 8, p = 3, line 5 writes x\[0:n \+ \(\(rank \+ p\) % world\)\] = "
            r"x\[0:10\], but parameter x has 8 elements")),
    # inside a stage it repeats the moves for every peer (an axis of the walk's arrays)
    (PEEK, (r"^peek: on rank 8, p = 7, line 5 reads x\[p \+ 1:p \+ 2\]@p = x\[8:9\], but "
            r"parameter x has 8 elements"))], ids=["step-loop", "in-stage"])
def test_the_walk_names_the_rank_and_loop_value_whatever_its_block_of_ranks(source, message, block,
                                                                            monkeypatch):
    """The walk before a call takes the ranks in blocks (the rank an axis of its arrays, as the
    loop variables are); a region outside its buffer on the last rank only, in one trip of a loop
    over the peers, is named with that rank and that trip whether the walk takes one rank at a
    time or all nine at once."""
    monkeypatch.setattr(instance, "RANK_BLOCK_ELEMENTS", block)
    s = lowered(Source("t.strata", source))
    with pytest.raises(StrataUsageError, match=message):
        instance.check(s, 9, {"n": 8})


def test_log2_is_floor_log2_over_int64():
    """The walk's log2 (of max(a, 1)) against Python's exact bit length, at every power of two,
    one either side of it, and int64's ends (a float log2 alone rounds 2^53 - 1 up)."""
    import numpy as np
    values = sorted({v for k in range(63) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1)
                     if 0 <= v < 1 << 63} | {(1 << 63) - 1, -7})
    got = instance._log2(np.array(values, dtype=np.int64)).tolist()
    assert got == [max(v, 1).bit_length() - 1 for v in values]


def test_the_walk_in_blocks_finds_what_the_walk_rank_by_rank_finds():
    """Every example and corpus schedule at worlds 3 and 5, at the verifier's first sizes and at
    sizes moved off them (which break the relations some regions were proven under): the walk
    taking all ranks at once passes or refuses exactly as the walk taking one rank at a time, with
    the same message (the lowest rank's first fault in program order)."""
    import random

    from stratac import ir, verify
    from stratac.diagnostics import StrataError
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "examples").glob("*.strata")) + \
        sorted((root / "tests" / "verify" / "corpus").glob("*.strata"))
    rng = random.Random(7)

    def walk(s, world, params, block):
        instance.RANK_BLOCK_ELEMENTS = block
        try:
            instance._Walk(s, world, params)
        except instance._Fault as exc:
            return str(exc)
        return None

    walks, faults = 0, 0
    keep = instance.RANK_BLOCK_ELEMENTS
    try:
        for f in files:
            try:
                scheds = frontend.schedules(frontend.path_or_text(str(f), str(f)))
            except StrataError:
                continue
            for s in scheds:
                try:
                    low = passes.pipeline(s, passes.Options(cores=2))
                except StrataError:
                    continue
                for world in (3, 5):
                    if ir.unmet_requirement(s, world) is not None:
                        continue
                    for sizes in verify.default_samples(s, world)[:2]:
                        base = dict(sizes)
                        for params in [base] + [{k: max(0, v + rng.choice((-3, -1, 1, 2, 5)))
                                                 if k in s.sizes else v for k, v in base.items()}
                                                for _ in range(2)]:
                            one = walk(low, world, params, 1)
                            assert walk(low, world, params, 4096) == one, (f.name, s.name, world, params)
                            walks += 1
                            faults += one is not None
    finally:
        instance.RANK_BLOCK_ELEMENTS = keep
    assert walks > 1000 and faults > 50, (walks, faults)


ARRAYS = Path(__file__).resolve().parents[1] / "verify" / "corpus"


@pytest.mark.parametrize("name, world, message", [
    ("set_past_the_end", 3, "on rank 2, line 7 sets last[2], outside last's 2 elements"),
    ("read_past_the_end", 2, "on rank 0, line 17 reads order[2], outside order's 2 elements"),
    ("too_large", 2, "line 21 declares array seen of 66 integers: an array holds 0 to 64"),
])
def test_the_check_before_a_call_refuses_an_array_index_or_size_outside_it(name, world, message):
    """The region walk (the rank and loop variables as numpy axes) follows arrays too: an index
    outside its array, read or set, or an array over the capacity, is refused before the proof,
    naming the rank and the line; the instances the verifier proves pass it."""
    ss = frontend.schedules(frontend.load_source(str(ARRAYS / "array_out_of_range.strata")))
    s = passes.pipeline(next(x for x in ss if x.name == name), passes.Options(cores=2))
    with pytest.raises(StrataUsageError, match="nothing was written") as exc:
        instance.check(s, world, {"n": 64})
    assert message in str(exc.value)
    for good in frontend.schedules(frontend.load_source(str(ARRAYS / "good_array_tables.strata"))):
        g = passes.pipeline(good, passes.Options(cores=2))
        for w in (1, 2, 4, 8):
            assert instance.check(g, w, {"n": 1000}).proof["sizes"] == {"n": 1000}


@pytest.mark.parametrize("text", [
    # an element read only where its guard holds: elsewhere its index is out of range
    "schedule ar(x: sym T[n], out: sym T[n]) implements allreduce(x -> out, sum) {\n"
    "  var t[2] = 0\n  var acc = 0\n  for s in 0 .. 3 {\n    set acc = acc + (t[s] if s < 2 else 0)\n  }\n"
    "  on aiv: out[acc:n] = sum(x[acc:n]@p for p in ranks)\n  barrier\n}\n",
    # an element of an array that holds none at this world, read only where it would hold some
    "schedule ar(x: sym T[n], out: sym T[n]) implements allreduce(x -> out, sum) {\n"
    "  var t[world - 4] = 0\n  let a = (t[rank] if world > 4 else 0)\n"
    "  on aiv: out[a:n] = sum(x[a:n]@p for p in ranks)\n  barrier\n}\n",
])
def test_the_check_before_a_call_reads_a_guarded_element_only_where_it_is_read(text):
    """The region walk evaluates both arms of a conditional over every place: an element outside
    its array where its arm is not taken is no fault (and no crash); the instance is proven."""
    s = lowered(Source("guarded.strata", text))
    assert instance.check(s, 4, {"n": 64}).proof["sizes"] == {"n": 64}
