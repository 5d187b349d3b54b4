"""`stratac bench`: sweep sizes (or MoE token counts) for every schedule of a file, beside gloo and
MPI, in nccl-tests' conventions (docs/bench.md).

In: a BenchSpec. Out: tables, JSON, plots and traces of time, algbw and busbw per size, with copies
per engine and core balance.

The modules, in the order of the data flow (each imports only modules before it): benchspec (the
spec, the result, the errors), machine (copy ceiling, memory available), benchpeer (gloo inside the
ranks, the MPI job, the gate), backendpeer (--vs backend: dist.* over the torch.distributed backend
stratac against its direct call, inside the ranks, whose worker imports it), mpi
(MPI setup and the mpirun job, from the bench's side), report (tables and JSON), plot, trace, progress (the bar), moe (the MoE sweep), sweep (the entry point,
sweep.run, and the sweep of sizes). The CLI calls sweep.run, then report, plot.

Nothing is imported here: the ranks and the MPI job import benchpeer, and importing this package
must not bring the driver (and the runner it imports) into them.
"""
