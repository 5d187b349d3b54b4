"""Every schedule of a file. In: a .strata file, a Machine, a world, sizes (collectives) or token
counts and a MoeSpec (MoE and AllToAllV). Out: a SimResult: the predictions, each with its ratio to
the file's first schedule of the same contract, what they assumed, and the schedules the model
cannot predict.
"""

from __future__ import annotations

from stratac import ir
from stratac.tools.options import parse_counts, parse_sizes
from stratac.tools.simulate.machine import (
    Machine,
    SimulateError,
    check_cores,
    check_world,
)
from stratac.tools.simulate.moe import (
    MOE_DTYPE,
    MOE_EXPERTS_PER_RANK,
    MOE_TOKENS,
    MoeSpec,
    predict_moe,
)
from stratac.tools.simulate.predict import predict
from stratac.tools.simulate.results import SimResult
from stratac.tools.simulate.stage_cost import SCALAR_CALL_US, SCALAR_ELEMENT_US
from stratac.tools.simulate.template import not_modelled
from stratac.verify.check import no_cycle_collection

DEFAULT_SIZES = "8:256M"    # S of collectives, bytes


def simulate_file(file: str, machine: Machine, world: int, sizes: list[int] | None = None,
                  dtype: str | None = None, root: int = 0, cores: int | None = None,
                  tokens: list[int] | None = None, moe: MoeSpec | None = None) -> SimResult:
    """Every schedule of the file: collectives over `sizes` (bytes, default 8:256M), MoE and
    AllToAllV schedules over `tokens` per rank (default MOE_TOKENS) with `moe`. dtype None: f32 for
    collectives, bf16 for MoE."""
    from stratac.lang.frontend import load_source, schedules
    scheds = schedules(load_source(file))
    if not scheds:
        raise SimulateError(f"{file} holds no schedule")
    check_world(machine, world)
    routed = [s for s in scheds if s.contract.kind.moe]
    plain = [s for s in scheds if not s.contract.kind.moe]
    if tokens is not None or moe is not None:
        if not routed:
            raise SimulateError("--tokens, --hidden, --topk, --experts, --max-recv, --capacity, --routing and "
                                "--seed "
                                f"apply to MoE and AllToAllV schedules; {file} has none (use --sizes)")
    if sizes is not None and not plain:
        raise SimulateError(f"--sizes applies to collectives; every schedule of {file} is routed (MoE "
                            "or AllToAllV): sweep --tokens instead")
    if sizes is None:
        sizes = parse_sizes(DEFAULT_SIZES)
    tokens = tokens if tokens is not None else parse_counts(MOE_TOKENS)
    moe = moe if moe is not None else MoeSpec()
    preds, skipped, cache = [], [], {}
    excluded = []
    with no_cycle_collection():   # millions of small acyclic objects at large worlds
        for s in scheds:
            why = not_modelled(s)
            if why:
                skipped.append({"schedule": s.name, "why": f"not modelled: {why}"})
                continue
            unmet = ir.unmet_requirement(s, world)
            if unmet is not None:   # e.g. halving-doubling at world 384 next to the ring: skip it, say why
                why = f"does not support world {world}: it {unmet}"
                skipped.append({"schedule": s.name, "why": why})
                excluded.append(f"{s.name} {why}")
                continue
            if s.contract.kind.moe:
                preds.extend(predict_moe(s, machine, world, tokens, moe, dtype or MOE_DTYPE, cores, cache))
            else:
                preds.extend(predict(s, machine, world, sizes, dtype or "f32", root, cores))
    if excluded and len(excluded) == len(scheds):
        raise SimulateError("; ".join(excluded))
    first: dict[str, str] = {}
    for p in preds:
        first.setdefault(p.kind, p.schedule)
    at = lambda p: (p.schedule, p.count if p.moe else p.size)   # MoE: the same tokens
    ref = {at(p): p for p in preds}
    several = {k for k in first if len({p.schedule for p in preds if p.kind == k}) > 1}
    for p in preds:
        if p.kind in several:
            q = ref.get((first[p.kind], at(p)[1]))
            if q is not None:
                p.ratio, p.ratio_to = p.busbw / q.busbw, q.schedule
    dtypes = sorted({p.dtype for p in preds}, key=[d.short for d in ir.DType].index)
    meta = {"what": "model predictions, not measurements", "file": file, "machine_file": machine.path,
            "machine": machine.name, "world": world, "dtype": "/".join(dtypes) or (dtype or "f32"),
            "root": root, "cores": check_cores(machine, cores), "figures": machine.figures()}
    if routed:
        meta["moe"] = {"tokens": tokens, "hidden": moe.hidden, "topk": moe.topk,
                       "experts": moe.experts if moe.experts is not None else MOE_EXPERTS_PER_RANK * world,
                       "routing": moe.routing, "seed": moe.seed, "max_recv": moe.max_recv,
                       "capacity": moe.capacity,
                       "assumptions": {"scalar_call_us": SCALAR_CALL_US,
                                       "scalar_element_us": SCALAR_ELEMENT_US}}
    return SimResult(meta, preds, skipped)

