"""Predictions of collectives. In: a schedule, a Machine, a world, sizes S in bytes (nccl-tests'
convention) and the dtype, root and cores. Out: one Prediction per distinct count of the size
symbol, or for one count the time, its critical path and the template to reuse.
"""

from __future__ import annotations

from stratac import ir
from stratac.ir import passes
from stratac.tools.simulate.critical_path import call_time
from stratac.tools.simulate.machine import (
    Machine,
    SimulateError,
    check_cores,
    check_world,
)
from stratac.tools.simulate.results import Prediction
from stratac.tools.simulate.stage_cost import CATEGORIES, stage_cost
from stratac.tools.simulate.template import Template, lengths, template


def predict_count(s: ir.Schedule, m: Machine, world: int, count: int, dtype: str = "f32",
                  root: int = 0, cores: int | None = None, tpl: Template | None = None
                  ) -> tuple[float, dict, Template]:
    """Predicted microseconds of one call at this value of the size symbols, its critical path by
    category, and the template (pass it back for the next count of the same schedule and world).
    s must have been through passes.pipeline (the `on auto` threshold lives in the stage plans)."""
    cores = check_cores(m, cores)
    elem = elem_bytes(dtype)
    env = {**{n: count for n in s.sizes}, **{x.name: root for x in s.rank_params},
           **ir.elem_env(s, elem)}
    if tpl is None or tpl.size_dependent or tpl.world != world:
        tpl = template(s, world, env)
    lens = lengths(tpl, env)
    costs = {i: stage_cost(tpl, i, lens, elem, m, cores) for i in tpl.stages}
    us, path = call_time(tpl, costs, m, cores)
    return us, path, tpl


def elem_bytes(dtype: str) -> int:
    """Bytes of one element of `dtype` (MoE predictions share it); unknown: a SimulateError."""
    d = ir.DType.parse(dtype)
    if d is None:
        raise SimulateError(f"unknown dtype {dtype!r}; known: {', '.join(x.short for x in ir.DType)}")
    return d.nbytes


def predict(s: ir.Schedule, m: Machine, world: int, sizes: list[int], dtype: str = "f32",
            root: int = 0, cores: int | None = None) -> list[Prediction]:
    """One prediction per size S (bytes); a size below the smallest the schedule can take (one
    element per block) gives the same count as the previous one and is predicted once."""
    from stratac.tools.run.workload import Workload
    check_world(m, world)
    if s.rank_params and not 0 <= root < world:
        raise SimulateError(f"--root {root} is not a rank of a world of {world}")
    if dtype == "i8" and s.typevars:   # as `stratac run` refuses it (tools/run/runner.py)
        raise SimulateError(f"{s.name} is not built for i8: int8 is a payload to move (a quantised MoE "
                            "dispatch's rows), not a type variable's type")
    elem = elem_bytes(dtype)
    lowered = passes.pipeline(s, passes.Options())
    out: list[Prediction] = []
    tpl, seen = None, None
    for size in sizes:
        count = Workload.count_for_bytes(s, world, size, elem)
        if count == seen:
            continue
        seen = count
        wl = Workload(s, world, count, root=root)
        us, path, tpl = predict_count(lowered, m, world, count, dtype, root, cores, tpl)
        nbytes = wl.size_bytes(elem)
        algbw = nbytes / (us * 1e-6) / 1e9
        out.append(Prediction(s.name, s.contract.kind.value, world, nbytes, count, dtype, us, algbw,
                              algbw * wl.busbw_factor(), max(path, key=path.get),
                              {k: path.get(k, 0.0) for k in CATEGORIES}))
    return out
