"""The verifier: is a schedule instance race-free, deadlock-free and the collective it claims?

In: the schedule IR and concrete worlds and sizes (instantiated by stratac.ir.instantiate); for
MoE and AllToAllV also sample routings (`routing`). Out: a `Result` per instance, with
diagnostics (races with both places, deadlocks with who waits for what, entry/exit, the contract).
It shares no code with codegen or the CPU model: it is the independent reference.
"""

from stratac.verify.check import (
                                  MOE_SAMPLES,
                                  Result,
                                  Sample,
                                  default_samples,
                                  moe_layout,
                                  moe_roles,
                                  verify,
                                  verify_worlds,
)
