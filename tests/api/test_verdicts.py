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
