"""The records predictions hand to the reports. In: what predict, moe and driver compute. Out: a
Prediction per schedule and size (or token count), and a SimResult: the predictions of a file with
what they assumed (meta) and the schedules the model skipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Prediction:
    schedule: str
    kind: str
    world: int
    size: int          # nccl-tests' S, bytes
    count: int         # the value of the size symbol
    dtype: str
    time_us: float
    algbw: float       # GB/s
    busbw: float       # GB/s
    bound: str         # the category with the largest share of the critical path
    breakdown_us: dict
    ratio: float | None = None      # busbw / busbw of `ratio_to` at the same size
    ratio_to: str | None = None
    moe: dict | None = None         # MoE/AllToAllV: the routed workload (size = received bytes)


@dataclass
class SimResult:
    meta: dict
    predictions: list[Prediction]
    skipped: list[dict]
