"""The lockstep walk (stratac.ir.lockstep) builds the instances the per-rank walk builds, event for
event, and gives back to it every instance it would have to refuse or check more closely.

Every example, every corpus file, every line-deletion mutant of the examples
(tests/verify/test_mutations.py) and 200 schedules of the fuzzer (tests/fuzz_gen.py) are
instantiated both ways, with the samples the verifier derives,
and the two are compared: the same timelines, or the same diagnostics. The expressions are checked
on their own against the per-rank evaluation (instantiate.evaluate) on random trees, lane by lane,
including the values it refuses.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from stratac.diagnostics import Source, StrataError
from stratac.ir import instantiate as inst_mod
from stratac.ir import lockstep
from stratac.ir.expr import Bin, Const, Sel, Var
from stratac.ir.expr import BinKind as K
from stratac.lang import frontend
from stratac.verify.samples import default_samples

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.strata"))
CORPUS = sorted((HERE / "corpus").glob("*.strata"))
sys.path.insert(0, str(HERE))
import verifykit  # noqa: E402


def _canonical(timelines) -> list:
    """The timelines as plain values. Accesses of one move share an id (Access.instance) that
    only tells them apart from other moves' (races.py compares ids for equality): the walks number
    moves in different orders, so an id is replaced by its order of appearance in its event."""
    out = []
    for tl in timelines:
        for ev in tl:
            ids: dict[int, int] = {}
            out.append((
                ev.kind, ev.rank, ev.index, ev.span, ev.stage, ev.barrier, ev.members, ev.done,
                [(a.owner, a.buffer, a.lo, a.hi, a.write, ids.setdefault(a.instance, len(ids)),
                  a.span, a.accumulate) for a in ev.accesses],
                [(m.dst, m.srcs, m.op, m.span, m.accumulate) for m in ev.moves],
                list(ev.signals), list(ev.waits), list(ev.routes)))
    return out


def _built(s, world, sizes, lockstep_from, monkeypatch):
    monkeypatch.setattr(inst_mod, "LOCKSTEP_FROM", lockstep_from)
    try:
        return _canonical(inst_mod.instantiate(s, world, sizes).timelines), None
    except StrataError as exc:
        return None, [str(d) for d in exc.diagnostics]


def _compare(schedules, worlds, monkeypatch) -> tuple[int, int]:
    """(instances compared, instances the lockstep walk built); fails on the first difference."""
    taken = {"built": 0}
    walk = lockstep.timelines

    def counting(b):
        got = walk(b)
        taken["built"] += got is not None
        return got
    monkeypatch.setattr(lockstep, "timelines", counting)
    compared = 0
    for s, w, sizes in verifykit.sampled(schedules, worlds):
        per_rank = _built(s, w, sizes, 10**9, monkeypatch)
        together = _built(s, w, sizes, 1, monkeypatch)
        assert per_rank == together, f"{s.name} at world {w}, {sizes}: the walks differ"
        compared += 1
    return compared, taken["built"]


def test_examples_are_built_alike(monkeypatch):
    compared, built = _compare(verifykit.schedules(EXAMPLES), [1, 2, 3, 4, 5, 8], monkeypatch)
    # the routing constructs (MoE, AllToAllV) are the per-rank walk's; every other instance is
    # the lockstep walk's, so the comparison above compared something
    assert compared > 1000 and built > compared // 2, (compared, built)


def test_every_non_routing_example_is_taken_by_the_lockstep_walk():
    for s in verifykit.schedules(EXAMPLES):
        if s.contract.kind.moe or s.contract.kind.name == "ALLTOALLV":
            continue
        b = _builder(s, 5, default_samples(s, 5)[0])
        assert lockstep.timelines(b) is not None, s.name


def test_corpus_is_built_alike(monkeypatch):
    compared, built = _compare(verifykit.schedules(CORPUS), [1, 2, 3, 4, 5], monkeypatch)
    assert compared > 1000 and built > 0, (compared, built)


@pytest.mark.slow
def test_examples_are_built_alike_at_larger_worlds(monkeypatch):
    compared, _ = _compare(verifykit.schedules(EXAMPLES), [7, 9, 16, 17, 33], monkeypatch)
    assert compared > 500


def test_mutants_are_built_alike(monkeypatch):
    """Every line-deletion mutant of every example: the mutants the verifier rejects for what their
    regions, flags or loops evaluate to are exactly the instances the lockstep walk must give back."""
    compared, built = _compare(verifykit.schedules(verifykit.mutant_sources()), [2, 3, 4], monkeypatch)
    assert compared > 2000 and built > compared // 3, (compared, built)   # a third: MoE


def _builder(s, world, sizes):
    """The per-rank walk's builder of an instance, as instantiate sets it up."""
    base = {"world": world, **sizes}
    b = inst_mod._Builder(s, world, base,
                          {p.name: inst_mod.evaluate(p.size, base, p.span, "") for p in s.params},
                          {f.name: inst_mod.evaluate(f.size, base, f.span, "") for f in s.flags},
                          False)
    b.shapes = {p.name: tuple(inst_mod.evaluate(d, base, p.span, "") for d in p.dims) for p in s.params}
    b.flag_rounds = {f.name: inst_mod.evaluate(f.rounds, base, f.span, "") for f in s.flags}
    return b


def test_an_error_is_the_per_rank_walks(monkeypatch):
    """A region that leaves its buffer on one rank only: the lockstep walk gives the instance back,
    and the diagnostic names that rank, as the per-rank walk always did."""
    text = ("schedule s(x: sym f32[n]) implements allreduce(x, sum) {\n"
            "  if rank == world - 1: on aiv: x[0:n + 1] = x[0:n + 1]@0\n"
            "}\n")
    s = frontend.schedules(Source("edge.strata", text))[0]
    assert lockstep.timelines(_builder(s, 4, {"n": 8})) is None
    monkeypatch.setattr(inst_mod, "LOCKSTEP_FROM", 1)
    with pytest.raises(StrataError) as exc:
        inst_mod.instantiate(s, 4, {"n": 8})
    assert "x[0:9] is outside x" in str(exc.value.diagnostics[0]) and "rank=3" in str(
        exc.value.diagnostics[0])


# ---- expressions ---------------------------------------------------------------------------------

KINDS = [k for k in K if k is not K.LOG2]
LEAVES = [Var("rank"), Var("world"), Var("n"), Const(0), Const(1), Const(2), Const(3), Const(-1),
          Const(62), Const(63), Const(1 << 40), Const(-(1 << 61))]


def _tree(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(LEAVES)
    r = rng.random()
    if r < 0.1:
        return Bin(K.LOG2, _tree(rng, depth - 1), Const(0))
    if r < 0.2:
        return Sel(_tree(rng, depth - 1), _tree(rng, depth - 1), _tree(rng, depth - 1))
    return Bin(rng.choice(KINDS), _tree(rng, depth - 1), _tree(rng, depth - 1))


@pytest.mark.parametrize("seed", range(8))
def test_expressions_agree_with_the_per_rank_evaluation(seed):
    """Random trees of every operator over rank (an array of lanes), world and n, with constants
    at the edges of the operators' rules: where every lane evaluates, the lockstep value is the
    per-rank value on each lane; where any lane is refused (or would leave int64), the lockstep
    evaluation gives up. And it never gives up on everything: most trees evaluate."""
    rng = random.Random(seed)
    world, n = 7, 5
    ranks = np.arange(world, dtype=np.int64)
    evaluated = 0
    for _ in range(400):
        e = _tree(rng, 4)
        per_rank = []
        for r in range(world):
            try:
                per_rank.append(inst_mod.evaluate(e, {"rank": r, "world": world, "n": n}, None, "e"))
            except StrataError:
                per_rank.append(None)
        try:
            got = lockstep._Values({"rank": ranks, "world": world, "n": n}, world)(e)
        except lockstep._Bail:
            continue
        assert None not in per_rank, f"{e}: evaluated where rank {per_rank.index(None)} is refused"
        lanes = [got] * world if type(got) is int else got.tolist()
        assert lanes == per_rank, str(e)
        evaluated += 1
    assert evaluated > 150, evaluated


def test_fuzzed_schedules_are_built_alike(monkeypatch):
    """200 schedules of the schedule fuzzer (tests/fuzz_gen.py: every family, each with
    hypothesis-drawn mistakes, derandomized), at worlds 1-5: xor, shift and log2 partners, teams,
    async stages, composition, rank parameters and vars in shapes the examples do not have."""
    import fuzz_gen
    from hypothesis import HealthCheck, Phase, given, settings
    texts: list[str] = []

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(fuzz_gen.schedules(None))
    def draw(spec):
        if spec.text not in texts:
            texts.append(spec.text)
    draw()
    schedules = verifykit.schedules(Source(f"fuzz{i}.strata", text) for i, text in enumerate(texts))
    compared, built = _compare(schedules, [1, 2, 3, 4, 5], monkeypatch)
    assert len(texts) > 150 and compared > 700 and built > compared // 3, (len(texts), compared, built)


def test_over_is_the_expression_at_each_value_or_nothing():
    """lockstep.over (simulate's runs read a copy's length at every value of its loop variable):
    each value as evaluated alone, an int broadcast to every value, and None where one value is
    refused (a division by zero) or a name is unknown."""
    n, p = Var("n"), Var("p")
    part = Bin(K.ADD, Bin(K.DIV, n, Const(4)), Bin(K.LT, p, Bin(K.MOD, n, Const(4))))   # split(n, 4)'s length
    got = lockstep.over(part, {"n": 10}, "p", np.arange(4))
    assert got.tolist() == [part.eval({"n": 10, "p": v}) for v in range(4)] == [3, 3, 2, 2]
    assert lockstep.over(n, {"n": 10}, "p", np.arange(3)).tolist() == [10, 10, 10]
    assert lockstep.over(Bin(K.DIV, n, p), {"n": 10}, "p", np.arange(3)) is None
    assert lockstep.over(Bin(K.ADD, Var("m"), p), {"n": 10}, "p", np.arange(3)) is None


def test_schedules_with_arrays_are_taken_by_the_lockstep_walk(monkeypatch):
    """An integer array is a matrix of a row per lane: tables filled under rank-dependent ifs and
    read as a copy's peer and under a move loop, built alike at worlds up to 9 and taken by the
    lockstep walk (an index outside its array is given back, test_corpus_is_built_alike)."""
    hd, *tables = verifykit.schedules([HERE / "corpus" / "good_array_tables.strata"])
    for s, worlds in ((hd, [2, 4, 8]), *((t, [2, 3, 4, 5, 6, 7, 8, 9]) for t in tables)):
        compared, built = _compare([s], worlds, monkeypatch)
        assert compared == built and compared >= 10, (s.name, compared, built)
