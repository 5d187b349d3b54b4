"""The model's walk of the IR against stratac.ir.instantiate on every example, and every example
is one the model can predict."""

import pytest
from simkit import EXAMPLES, moe_env

from stratac import ir
from stratac.ir import instantiate
from stratac.lang import frontend
from stratac.tools.simulate.machine import SimulateError
from stratac.tools.simulate.template import lengths, not_modelled, template


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_template_matches_instantiate(path):
    for s in frontend.schedules(frontend.load_source(path)):
        worlds = [w for w in (1, 2, 3, 4, 5) if ir.unmet_requirement(s, w) is None]
        assert len(worlds) >= 3, (s.name, worlds)
        for world in worlds:
            _check_template(s, world)


def test_a_world_the_schedule_excludes_is_refused_with_its_constraint():
    s = frontend.schedules(frontend.load_source(EXAMPLES[0].parent / "allreduce_halving_doubling.strata"))[0]
    with pytest.raises(SimulateError, match="allreduce_halving_doubling does not support world 3: it requires "
                                            "world is pow2"):
        template(s, 3, {n: 7 for n in s.sizes})


def _check_template(s: ir.Schedule, world: int) -> None:
    """The model's walk of the IR gives the same moves and routing constructs, per rank and stage,
    as stratac.instantiate."""
    if s.contract.kind.moe:
        env = moe_env(s, world)
    else:
        env = {**{n: 7 for n in s.sizes}, **{x.name: world - 1 for x in s.rank_params}}
    inst = instantiate.instantiate(s, world, env)
    t = template(s, world, env)
    lens = lengths(t, env)
    want: dict[int, list] = {}
    want_routes: dict[int, list] = {}
    for r, events in enumerate(inst.timelines):
        kinds = []
        for ev in events:
            if ev.kind is instantiate.EventKind.STAGE:
                kinds.append(("stage", ev.stage.index))
                for mv in ev.moves:
                    kind = 1 if mv.accumulate else (0 if mv.op is None else 2)
                    want.setdefault(ev.stage.index, []).append(
                        (r, kind, mv.dst[0], tuple(x[0] for x in mv.srcs), mv.dst[3] - mv.dst[2]))
                for ri in ev.routes:
                    want_routes.setdefault(ev.stage.index, []).append(
                        (ri.rank, ri.kind, ri.experts, ri.tokens, ri.topk, ri.hidden))
            elif ev.kind is instantiate.EventKind.BARRIER:
                kinds.append(("barrier", ev.barrier))
            elif ev.kind is instantiate.EventKind.SIGNAL:
                kinds.append(("signal", [(o, f, slot) for o, f, slot, _ in ev.signals]))
            elif ev.kind is instantiate.EventKind.WAIT:
                kinds.append(("wait", [(f, slot) for f, slot, _ in ev.waits]))
            elif ev.kind is instantiate.EventKind.AWAIT:
                kinds.append(("await", None))
        assert t.timelines[r] == kinds, (world, r)
    for index, moves in want.items():
        assert t.moves(index, lens) == moves, (world, index)
    for index in t.stages:
        got = [(r, k, sh["experts"], sh.get("tokens", 0), sh.get("topk", 0), sh.get("hidden", 0))
               for r, k, sh in t.routes(index)]
        assert got == want_routes.get(index, []), (world, index)


def test_every_example_is_modelled():
    for path in EXAMPLES:
        for s in frontend.schedules(frontend.load_source(path)):
            assert not_modelled(s) is None, s.name
