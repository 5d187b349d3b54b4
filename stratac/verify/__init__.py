"""The verifier: is a schedule instance race-free, deadlock-free and the collective it claims?

In: the schedule IR and concrete worlds and sizes (instantiated by stratac.ir.instantiate); for
MoE and AllToAllV also sample routings (`routing`). Out: a `Result` per instance, with
diagnostics (races with both places, deadlocks with who waits for what, entry/exit, the contract).
It shares no code with codegen or the CPU model: it is the independent reference.

Modules, in the order an instance goes through them: `samples` (which instances, their routed
inputs), `timeline` (happens-before by vector clocks, deadlocks; it drives `provenance`, the
simulated memory), `races` (races, entry and exit), `contract` (the expected results), and `check`
(the driver: `verify`, `verify_worlds`, and `verify_lowered` for the IR after the passes).
"""

from stratac.verify.check import (
           MASK_WORLDS,
           Result,
           default_jobs,
           masks,
           verify,
           verify_lowered,
           verify_masks,
           verify_worlds,
)
from stratac.verify.contract import moe_layout
from stratac.verify.samples import MOE_SAMPLES, Sample, default_samples, moe_roles

__all__ = ["MASK_WORLDS", "MOE_SAMPLES", "Result", "Sample", "default_jobs", "default_samples", "masks", "moe_layout",
           "moe_roles", "verify", "verify_lowered", "verify_masks", "verify_worlds"]
