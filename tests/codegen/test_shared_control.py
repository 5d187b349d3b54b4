"""Control blocks whose loops the cores share (ir.control): which blocks are shared, and the kernel
text of each kind (a shared loop's trips go round the cores; everything else of a block, and every
block that is not shared, on core 0). The blocks run on the CPU build in
tests/e2e/test_shared_control_run.py; the model's charge is in tests/simulate/test_predict.py."""

import re

import pytest

from stratac import codegen
from stratac.diagnostics import Source
from stratac.ir import control, passes
from stratac.lang import frontend
from stratac.verify import verify_worlds

# a two-shot AllReduce, then the case's signals and waits, then a barrier (so that every body is a
# correct schedule, whatever its flags order)
HEAD = """schedule s(x: sym T[n]) implements allreduce(x, sum) {
  flag a[world]
  flag b[world]
  flag c[2 * world]
  part = split(x, world)
  on aiv: part[rank] = sum(part[rank]@p for p in ranks)
  on sdma: for p in peers: part[rank]@p = part[rank]
"""
HEAD_ROUNDS = HEAD.replace("flag a[world]", "flag a[world] rounds 2")

# (name, body, the shared loops' variables in program order, the statements guarded to run on
# core 0: a block that is not shared has one guard, a shared one a guard per signal or wait it does
# not share). Every body is a correct schedule.
CASES = [
    ("signals then waits", """
  for p in peers: signal a[rank]@p
  for p in peers: wait a[p]
""", ["p", "p"], 0),
    ("a single signal beside a loop", """
  signal b[rank]@((rank + 1) % world)
  for q in peers: signal a[rank]@q
  for q in peers: wait a[q]
  wait b[(rank + world - 1) % world]
""", ["q", "q"], 2),
    ("a loop in an if", """
  if world > 1 { for p in peers: signal a[rank]@p }
  if world > 1 { for p in peers: wait a[p] }
""", ["p", "p"], 0),
    ("a wait before a signal: core 0 in program order", """
  for p in peers: signal a[rank]@p
  for p in peers: wait a[p]
  for p in peers: signal b[rank]@p
  for p in peers: wait b[p]
""", [], 1),
    ("a loop that waits and signals", """
  for p in peers { signal a[rank]@p
    wait a[p] }
""", [], 1),
    ("signals without a loop", """
  signal a[rank]@((rank + 1) % world)
  wait a[(rank + world - 1) % world]
""", [], 1),
    ("blocks in a step loop with a stage; a block after it", """
  barrier
  for s in 0 .. 2 {
    on aiv: x[0:1] = x[0:1]
    for p in peers: signal c[s * world + rank]@p
    for p in peers: wait c[s * world + p]
  }
  signal b[rank]@((rank + 1) % world)
  wait b[(rank + world - 1) % world]
""", ["p", "p"], 1),
    ("a step loop of signals and waits alone is one loop that waits and signals", """
  for s in 0 .. 2 {
    for p in peers: signal c[s * world + rank]@p
    for p in peers: wait c[s * world + p]
  }
""", [], 1),
]


def _schedule(head: str, body: str):
    return passes.pipeline(frontend.schedules(Source("s.strata", head + body + "  barrier\n}\n"))[0],
                           passes.Options())


def _shared_loop_vars(s) -> list[str]:
    found = []

    def walk(ops):
        for op in ops:
            if isinstance(op, passes.ir.Loop):
                if id(op) in control.shared_loops(s):
                    found.append(op.var)
                walk(op.body)
            elif isinstance(op, passes.ir.If):
                walk(op.then)
                walk(op.orelse)

    walk(s.body)
    return found


@pytest.mark.parametrize("name,body,shared,guards", CASES, ids=[c[0] for c in CASES])
def test_which_loops_are_shared(name, body, shared, guards):
    s = _schedule(HEAD, body)
    assert all(r.ok for r in verify_worlds(s, [1, 2, 3, 4])), name
    assert _shared_loop_vars(s) == shared
    kernel = codegen.generate(s).files["kernel.cpp"]
    strided = re.findall(r"for \(int64_t (\w+)_ = [^;]*AscendC::GetBlockIdx\(\); [^;]*; \1_ \+= "
                         r"AscendC::GetBlockNum\(\)\)", kernel)
    assert strided == shared, kernel
    assert kernel.count("if (AscendC::GetBlockIdx() == 0) {") == guards, kernel


def test_a_flag_with_rounds_keeps_its_block_on_core_0():
    """The rounds of a slot must land in program order, which one core issuing them keeps."""
    body = """
  for p in peers: signal a[rank]@p round 0
  for p in peers: wait a[p] round 0
"""
    s = _schedule(HEAD_ROUNDS, body)
    assert _shared_loop_vars(s) == []
    assert _shared_loop_vars(_schedule(HEAD, body.replace(" round 0", ""))) == ["p", "p"]
