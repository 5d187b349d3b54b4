"""`stratac simulate`: predicted time and busbw of a schedule on the real machine, from an analytic
model of a machine description (machines/*.toml), every value with its public source or marked as
an assumption. In: a .strata file, a machine, a world and sizes (or MoE options). Out: MODEL
PREDICTIONS, never measurements (docs/bench.md).
"""
