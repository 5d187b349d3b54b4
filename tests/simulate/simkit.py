"""What the tests of `stratac simulate` share: the repository, a tiny machine whose figures make
the hand arithmetic short, and schedules from text or from the examples."""

from pathlib import Path

from stratac import ir
from stratac.ir import passes
from stratac.lang import frontend
from stratac.tools.run.workload import MoeWorkload
from stratac.tools.simulate.sample_routing import Routed
from stratac.tools.simulate.stage_cost import SCALAR_CALL_US, SCALAR_ELEMENT_US, stage_cost
from stratac.tools.simulate.template import lengths, template

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.strata"))
# a schedule with `requires world is pow2` (line 12)
REQUIRES = ROOT / "tests" / "e2e" / "requires_pow2.strata"

# A machine whose figures make the hand arithmetic short: bandwidths in GB/s = 1e3 bytes per us.
TINY = """
[machine]
name = "tiny"
npus = 4
dies_per_npu = 1
[rank]
vector_cores = 1
ub_bytes_per_core = 196608
hbm_gbps = 1000.0
fabric_gbps = 0.5
fabric_latency_us = 3.0
[core]
gm_to_ub_gbps = 2.0
ub_to_gm_gbps = 4.0
vector_gbps = 8.0
[sdma]
queues = 1
queue_gbps = 0.5
post_us = 5.0
sqe_bytes = 1048576
sqe_issue_us = 2.0
[sync]
launch_us = 10.0
sync_all_us = 1.0
flag_issue_us = 0.5
"""


def schedule(tmp_path, text: str, name: str = "s.strata") -> ir.Schedule:
    """The first schedule of `text`, after the passes."""
    path = tmp_path / name
    path.write_text(text)
    return passes.pipeline(frontend.schedules(frontend.load_source(path))[0], passes.Options())


def example(name: str) -> ir.Schedule:
    return frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))[0]


def moe_env(s: ir.Schedule, world: int, tokens: int = 5, hidden: int = 3, topk: int = 2,
            experts: int | None = None) -> dict:
    """The sizes of a MoE or AllToAllV schedule (AllToAllV: topk 1, one "expert" per rank)."""
    if s.contract.kind is ir.ContractKind.ALLTOALLV:
        topk, experts = 1, world
    return MoeWorkload(s, None, world, tokens, hidden, topk, experts or 2 * world).sizes(s)


# ---- schedules and helpers shared by several test files of this folder ----

# out-of-place push AllGather on each engine: rank r copies x into block r of every rank's out
PUSH = """
schedule push_{engine}(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {{
  blk = split(out, world)
  barrier
  on {engine}: for p in ranks: blk[rank]@p = x
  barrier
}}
"""

# prefill dispatch with place on `{engine}`, and its combine
MOE = """
schedule d(x: sym T[tokens, hidden], ids: i32[tokens, topk], counts: sym i32[world, experts],
           win: sym T[world * tokens * topk, hidden]) implements moe_dispatch(x, ids -> win, counts) {{
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv: mine[rank] = histogram(ids)
  barrier
  on sdma: for p in peers: mine[rank]@p = mine[rank]
  barrier
  on aiv: offs = exscan(counts)
  on {engine}: win = place(x, ids, offs)
  barrier
}}
"""
C0, E1 = SCALAR_CALL_US, SCALAR_ELEMENT_US


def _moe_cost(s: ir.Schedule, m, world: int, tokens: int, routing: str, stage: int, cores: int = 1,
              hidden: int = 256, elem: int = 2):
    """The StageCost of stage `stage` (numbered from 1) of s at these sizes (topk 1, one expert per
    rank)."""
    env = moe_env(s, world, tokens, hidden, 1, world)
    t = template(s, world, env)
    routed = Routed.sample(routing, world, tokens, 1, world)
    return stage_cost(t, stage, lengths(t, env), elem, m, cores, routed)
