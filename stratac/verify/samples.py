"""What the verifier checks: the instances of a schedule at one world size, and their inputs.

In: a schedule and a world size. Out: the samples to check (sizes and rank parameters; for MoE and
AllToAllV also a sample routing from `routing`), each kept while the provenance simulation stays
within budget; for an instantiated MoE sample, the routed inputs (every rank's expert ids, and a
combine's counts). Also how a diagnostic names the instance it is about (`context`).
"""

from __future__ import annotations

import numpy as np

from stratac import ir
from stratac.diagnostics import Codes, StrataError, error
from stratac.ir.instantiate import Instance
from stratac.verify import routing as routing_mod

# a default sample with more buffer elements over all ranks than this is dropped (the smaller
# ones are kept): the simulation's time and memory grow with the elements
SIM_ELEMENT_BUDGET = 4_000_000


class Sample(dict):
    """Sizes (and rank parameters) of one instance to check; a MoE sample also names a routing."""

    routing: str | None = None


MOE_SAMPLES = ((1, "uniform"), (5, "uniform"), (5, "single"), (5, "empty"), (5, "sparse"))


def moe_roles(s: ir.Schedule) -> dict[str, str]:
    """Which size symbol plays which MoE role (tokens, topk, hidden, experts, capacity), read off
    the contract's tensors: ids [tokens, topk], the tokens [tokens, hidden], counts [world, experts]."""
    c = s.contract
    dispatch = c.kind.dispatch
    tok = s.param(c.inputs[0] if dispatch else c.outputs[0])
    ids = s.param(c.inputs[1])
    counts = s.param(c.outputs[1] if dispatch else c.inputs[3])
    roles = {}
    for buf, names in ((ids, ("tokens", "topk")), (tok, ("tokens", "hidden")), (counts, (None, "experts"))):
        for d, role in zip(buf.dims, names):
            if role and isinstance(d, ir.Var):
                roles.setdefault(role, d.name)
    if c.capacity:
        roles["capacity"] = c.capacity
    return roles


def _moe_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Token counts 1 and 5 (rows of 3 elements, top-2, 2 experts per rank up to world 64 and one
    above, where every rank's world x experts count table dominates; capacity = tokens),
    under the routings of MOE_SAMPLES, each kept while the simulation stays within budget (every
    rank holds the world x experts count table, so large worlds keep only the one-token sample);
    other size symbols (such as a window's row count) get the bound world * tokens * topk."""
    roles = {v: k for k, v in moe_roles(s).items()}
    out = []
    for tokens, routing in MOE_SAMPLES:
        experts = 2 * world if world <= 64 else world
        value = {"tokens": tokens, "topk": 2, "hidden": 3, "experts": experts, "capacity": tokens}
        sample = Sample({sym: value.get(roles.get(sym, ""), world * tokens * 2) for sym in s.sizes})
        sample.update({x.name: 0 for x in s.rank_params})
        sample.routing = routing
        if _within_budget(s, world, sample) or not out:   # like default_samples: never none at all
            out.append(sample)
    return out


def default_samples(s: ir.Schedule, world: int) -> list[dict[str, int]]:
    """Sizes to check at a world size: one element, an odd size around the world size (so splits
    are uneven), and a larger odd size, each kept only while the simulation stays within budget;
    each with the first, the last and a middle rank as the value of every rank parameter."""
    if s.contract.kind.moe:
        return _moe_samples(s, world)
    candidates = [1, world + 3, 2 * world + 5]
    out: list[dict[str, int]] = []
    roots = list(dict.fromkeys([0, world - 1, world // 2]))
    for n in dict.fromkeys(candidates):
        for root in roots:
            sizes = {sym: n for sym in s.sizes}
            sizes.update({x.name: root for x in s.rank_params})
            if _within_budget(s, world, sizes) or not out:
                out.append(sizes)
            if not s.rank_params:
                break
        if not s.sizes:
            break
    return out


def _within_budget(s: ir.Schedule, world: int, sizes: dict[str, int]) -> bool:
    env = {"world": world, **sizes}
    try:
        total = sum(p.size.eval(env) for p in s.params) * world
    except ZeroDivisionError:
        total = 0  # instantiate reports it as a diagnostic, with the span of the size
    return total <= SIM_ELEMENT_BUDGET


def route_sample(inst: Instance, routing: str) -> None:
    """Expert ids for every rank from a sample routing; a combine also starts from the counts its
    dispatch left (its precondition)."""
    s, c = inst.schedule, inst.schedule.contract
    ids_name = c.inputs[1]
    T, K = (inst.buffer_shapes[ids_name] + (1,))[:2]
    counts = c.outputs[1] if c.kind.dispatch else c.inputs[3]
    E = inst.buffer_shapes[counts][-1]
    if c.kind is ir.ContractKind.ALLTOALLV and E != inst.world:
        raise StrataError(error(Codes.SHAPE, f"alltoallv's {counts} needs world x world counts (one column "
                                f"per destination rank), it has {E} columns ({context(inst)})",
                                s.param(counts).span))
    if K > E:
        raise StrataError(error(Codes.SHAPE, f"topk ({K}) exceeds the number of experts ({E}) "
                                f"({context(inst)})", s.param(ids_name).span))
    ids = [routing_mod.expert_ids(routing, r, T, K, E) for r in range(inst.world)]
    inst.routing = routing
    inst.data = {(r, ids_name): ids[r] for r in range(inst.world)}
    if c.kind is ir.ContractKind.MOE_COMBINE:
        matrix = np.stack([np.bincount(i[i >= 0], minlength=E)[:E] for i in ids]).reshape(-1)
        inst.data.update({(r, counts): matrix for r in range(inst.world)})


def context(inst: Instance) -> str:
    """The instance as diagnostics name it: world, sizes and routing."""
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(inst.sizes.items()))
    routing = f", routing={inst.routing}" if inst.routing else ""
    return f"world={inst.world}" + (f", {sizes}" if sizes else "") + routing
