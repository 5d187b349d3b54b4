"""`stratac bench`: sweep sizes (or MoE token counts) for every schedule of a file, beside gloo and
MPI, in nccl-tests' conventions (docs/bench.md).

In: a BenchSpec. Out: tables, JSON, plots and traces of time, algbw and busbw per size, with copies
per engine and core balance. `benchpeer` measures the peers (gloo inside the rank processes, MPI
as its own mpirun job) and takes turns with stratac through a gate.
"""
