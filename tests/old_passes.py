"""Passes as they were before a bug was fixed, for tests that show the fix's guard catches the bug
(tests/verify/test_stamps.py, tests/codegen/test_pipeline.py, tests/cli/test_codes.py)."""

from __future__ import annotations

from dataclasses import replace

from stratac import ir


def epoch_pass_before_ifs(s: ir.Schedule) -> ir.Schedule:
    """The epoch pass before barriers under ifs were stamped: top-level barriers only, so a barrier
    under an if kept stamp 0 (the kernel's `epoch_ + 0`); the flags' stamps follow the barriers'."""
    seq, body = 0, []
    for op in s.body:
        if isinstance(op, ir.Barrier):
            seq += 1
            op = replace(op, seq=ir.Const(seq))
        body.append(op)
    flags = []
    for f in s.flags:
        seq += 1
        flags.append(replace(f, seq=seq))
    return replace(s, body=tuple(body), flags=tuple(flags), sync_ops=seq)
