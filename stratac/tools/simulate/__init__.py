"""`stratac simulate`: predicted time and busbw of a schedule on the real machine, from an analytic
model of a machine description (machines/*.toml), every value with its public source or marked as
an assumption. In: a .strata file, a machine, a world and sizes (or MoE options). Out: MODEL
PREDICTIONS, never measurements (docs/bench.md).

The modules, in the order of the data flow (each imports only modules before it):
machine (the machine file), template (the walk of the IR), sample_routing (MoE/AllToAllV ids),
stage_cost (one stage on every rank), critical_path (one call), results (the records),
predict (collectives), moe (MoE and AllToAllV), driver (every schedule of a file), report (table
and JSON), command (`stratac simulate`, registered by stratac/cli.py).

Not modelled: contention inside the UB switches (the fabric is taken as non-blocking), the faster
link between the two dies of one package, L2 cache hits, the tail of a double-buffered tile queue.
"""
