"""The tools around the compiler: run, bench, simulate, doctor.

In: command-line options (parsed by `options`) and .strata files. Out: checked runs on real rank
processes (`run`), nccl-tests style measurements against gloo and MPI (`bench`), predictions for
the real machine from an analytic model (`simulate`), and a report of what this machine can build
(`doctor`). The tools use the compiler and the host runtime; nothing below imports them.
"""
