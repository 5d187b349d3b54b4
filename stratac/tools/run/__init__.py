"""`stratac run`: start W rank processes, run every schedule of a file, check the results.

In: a RunSpec (file, world, sizes or MoE options). Out: a RunOutcome with one result line per
schedule and rank. `runner` starts and watches the rank processes; `procs` forks them from a server
that imported torch once; `worker` is one rank (`python -m stratac.tools.run.worker SPEC`);
`workload` makes each contract's inputs and its torch reference.
"""
