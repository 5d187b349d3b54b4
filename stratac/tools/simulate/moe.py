"""Predictions of MoE dispatch/combine and AllToAllV schedules. In: a schedule, a Machine, a world,
token counts per rank and a MoeSpec (hidden, topk, experts, routing, seed). Out: one Prediction per
token count, costed on a sample routing; also the token-count syntax of --tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratac import ir
from stratac.ir import passes
from stratac.tools.simulate.critical_path import call_time
from stratac.tools.simulate.machine import (
    Machine,
    SimulateError,
    check_cores,
    check_world,
)
from stratac.tools.simulate.predict import elem_bytes
from stratac.tools.simulate.results import Prediction
from stratac.tools.simulate.sample_routing import Routed
from stratac.tools.simulate.stage_cost import CATEGORIES, stage_cost
from stratac.tools.simulate.template import lengths, template

# MoE defaults, DeepSeek-V3-like (arXiv 2412.19437: hidden 7168, 8 routed experts per token out of
# 256); 8 experts per rank is DeepSeek-V3's 256 at world 32. Tokens per rank: 16 (decode batches)
# to 4096 (a prefill chunk, DeepEP's normal-kernel benchmark).
MOE_TOKENS = "16:4096"
MOE_HIDDEN = 7168
MOE_TOPK = 8
MOE_EXPERTS_PER_RANK = 8
MOE_DTYPE = "bf16"


@dataclass(frozen=True)
class MoeSpec:
    """The routed workload of MoE and AllToAllV schedules (tokens are swept separately)."""

    hidden: int = MOE_HIDDEN
    topk: int = MOE_TOPK
    experts: int | None = None      # over the whole world; None: MOE_EXPERTS_PER_RANK per rank
    routing: str = "uniform"
    seed: int = 0
    # rows of a bounded packed window (per_expert(R): of an expert's region); None: any routing fits
    max_recv: int | None = None
    capacity: int | None = None     # slots per (expert, source rank) of a slotted layout; None: tokens

    def resolved(self, s: ir.Schedule, world: int) -> tuple[int, int]:
        """(topk, experts) for this schedule: AllToAllV routes each row to one rank (topk 1, one
        "expert" per rank)."""
        if s.contract.kind is ir.ContractKind.ALLTOALLV:
            return 1, world
        return self.topk, self.experts if self.experts is not None else MOE_EXPERTS_PER_RANK * world

    def check(self, s: ir.Schedule, world: int) -> None:
        from stratac.host.schedule import ROUTE_MAX_EXPERTS, ROUTE_MAX_TOPK
        from stratac.verify.routing import ROUTINGS
        if self.routing not in ROUTINGS:
            raise SimulateError(f"unknown routing {self.routing!r}; known: {', '.join(ROUTINGS)}")
        if self.hidden < 1 or self.topk < 1:
            raise SimulateError(f"--hidden and --topk must be at least 1, got {self.hidden} and {self.topk}")
        if self.max_recv is not None:
            from stratac.verify import moe_roles
            if self.max_recv < 1:
                raise SimulateError(f"--max-recv must be at least 1, got {self.max_recv}")
            if "bound" not in moe_roles(s):
                raise SimulateError(f"--max-recv applies to a bounded window (rows a size of their own, e.g. "
                                    f"examples/moe_prefill_bounded.strata); {s.name}'s window has none")
        if self.capacity is not None:
            if self.capacity < 1:
                raise SimulateError(f"--capacity must be at least 1, got {self.capacity}")
            if s.contract.capacity is None:
                raise SimulateError(f"--capacity applies to a slotted layout (a contract with a capacity, "
                                    f"e.g. examples/moe_decode.strata); {s.name}'s window has none")
        if s.contract.kind is ir.ContractKind.ALLTOALLV:
            return                  # one destination rank per row: --topk and --experts do not apply
        experts = self.experts if self.experts is not None else MOE_EXPERTS_PER_RANK * world
        if experts < 1 or experts % world:
            raise SimulateError(f"--experts {experts} is not a positive multiple of the world size "
                                f"({world}): every rank owns experts / world experts")
        if experts > ROUTE_MAX_EXPERTS:
            raise SimulateError(f"--experts {experts}: the kernels count at most {ROUTE_MAX_EXPERTS} "
                                "experts (per-core counters in UB)")
        if self.topk > experts or self.topk > ROUTE_MAX_TOPK:
            raise SimulateError(f"--topk {self.topk} must be at most the number of experts ({experts}) "
                                f"and at most {ROUTE_MAX_TOPK}")


def heap_bytes(s: ir.Schedule, world: int, env: dict, elem: int) -> int:
    """Bytes of every buffer of the schedule (scratch too) on one rank."""
    full = {"world": world, **env}
    return sum(p.size.eval(full) * (p.dtype.nbytes if p.dtype is not None else elem) for p in s.params)


def predict_moe(s: ir.Schedule, m: Machine, world: int, tokens: list[int], moe: MoeSpec = MoeSpec(),
                dtype: str = MOE_DTYPE, cores: int | None = None, cache: dict | None = None,
                options: passes.Options | None = None) -> list[Prediction]:
    """One prediction per token count of a MoE dispatch/combine or AllToAllV schedule, on the
    sample routing moe.routing (the same ids for every schedule at a token count: pass one `cache`
    dict to share them). size = the bytes a rank receives in dispatch (combine: reads back), the
    mean over ranks (DeepEP's count); busbw = algbw = size / time (no bus factor). options: the
    passes' (default passes.Options(); join_places=False predicts the places not joined)."""
    from stratac.tools.run.workload import MoeWorkload
    check_world(m, world)
    moe.check(s, world)
    if dtype in ("i32", "i8"):   # as `stratac run` refuses them (tools/run/runner.py)
        raise SimulateError(f"{s.name} moves float tokens: --dtype f32, f16 or bf16 (an int8 dispatch "
                            "quantises tokens of that dtype itself)")
    elem, C = elem_bytes(dtype), check_cores(m, cores)
    c = s.contract
    payload = s.param(c.inputs[0] if c.kind.dispatch else c.outputs[0]).dtype
    if payload is not None:   # tokens of a fixed type (an int8 dispatch): its own, whatever --dtype says
        elem, dtype = payload.nbytes, payload.short

    lowered = passes.pipeline(s, options or passes.Options())
    topk, experts = moe.resolved(s, world)
    cache = {} if cache is None else cache
    out = []
    for T in tokens:
        key = (moe.routing, moe.seed, world, T, topk, experts)
        routed = cache.get(key)
        if routed is None:
            routed = cache[key] = Routed.sample(moe.routing, world, T, topk, experts, moe.seed)
        wl = MoeWorkload(s, None, world, T, moe.hidden, topk, experts, moe.routing, moe.max_recv,
                         moe.capacity)
        if moe.capacity is not None:
            from stratac.verify.routing import expert_ids
            for r in range(world):
                ids = expert_ids(moe.routing, r, T, topk, experts, moe.seed)
                per = np.bincount(ids[ids >= 0], minlength=experts)
                if per.size and int(per.max()) > moe.capacity:
                    raise SimulateError(f"{s.name}, {T} tokens: the sample routing ({moe.routing}, seed "
                                        f"{moe.seed}) sends {int(per.max())} tokens of rank {r} to expert "
                                        f"{int(per.argmax())}, more than --capacity {moe.capacity}: that "
                                        "call would be refused")
        # the bound: a rank's rows, or (per_expert(R)) an expert's
        per, who = (routed.per_expert, "expert") if c.region else (routed.received, "rank")
        if moe.max_recv is not None and per.size and int(per.max()) > moe.max_recv:
            raise SimulateError(f"{s.name}, {T} tokens: the sample routing ({moe.routing}, seed {moe.seed}) "
                                f"sends {int(per.max())} rows to {who} {int(per.argmax())}, more than "
                                f"--max-recv {moe.max_recv}: that call would be refused")
        env = wl.sizes(s)
        tpl = template(lowered, world, env)
        lens = lengths(tpl, env)
        costs = {i: stage_cost(tpl, i, lens, elem, m, C, routed) for i in tpl.stages}
        us, path = call_time(tpl, costs, m, C)
        us = float(us)
        rows = float(routed.received.mean())
        # bytes per received row: the tokens', plus the rows that travel with them (their scales)
        side = sum(s.param(w).dims[1].eval({"world": world, **env}) * s.param(w).dtype.nbytes
                   for _, w in c.side if s.param(w).dtype is not None)
        size = int(round(rows * (moe.hidden * elem + side)))
        algbw = size / (us * 1e-6) / 1e9
        info = {"tokens": T, "hidden": moe.hidden, "topk": topk, "experts": experts,
                "routing": moe.routing, "seed": moe.seed, "received_rows": rows,
                "received_rows_max": int(routed.received.max()),
                "heap_bytes": heap_bytes(s, world, env, elem), "max_recv": moe.max_recv}
        out.append(Prediction(s.name, s.contract.kind.value, world, size, T, dtype, us, algbw, algbw,
                              max(path, key=path.get), {k: float(path.get(k, 0.0)) for k in CATEGORIES},
                              moe=info))
    return out
