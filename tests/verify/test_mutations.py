"""The line-deletion mutation test over every example (issue 10): no mutant is verified and then
runs WRONG.

A mutant is an example with ONE line of a schedule body deleted: every line between a schedule's
opening `{` and its closing `}` except blank lines, comments and lines of braces only. The grammar
ignores newlines, so a line is a unit of text, not of syntax: deleting the line that opens a block
(`on aiv {`) or one line of a statement written over several lines leaves a fragment, and a syntax
error is a fine "rejected". Each mutant is classified, per world size W, as
  * rejected: by the front end (any world) or by stratac.verify.verify_worlds at W with the samples
    it derives from the schedule, the way tests/verify/test_corpus.py drives them; or
  * accepted at W: then `stratac run` (stratac.tools.run.runner, rank processes of the CPU build,
    every result against the torch reference) must call it OK at W, or refuse the call before
    anything is written (the proof of the call's instance), or reject it while compiling (the IR
    after the passes). WRONG, a hang or a crashed rank fails the test, naming the file, the deleted
    line and the world.
The verdicts are taken at worlds 1-4, the runs at worlds 2, 3 and 4. STRATAC_MUTATION_WORLDS (`1-8`)
runs other worlds; world 1 is not run by default because it accepts 61 mutants (every deleted line
about peers or synchronisation: at world 1 there are none), a build each, about 3 minutes (all ran
OK when this test was written). The mutants accepted at worlds 2-4 must be exactly the ones listed
in EQUIVALENT, each with the reason it is equivalent: a new one, even one that runs OK, is either a
weaker verifier or a difference the run's inputs miss, and someone must say which.

test_the_oracle_says_wrong shows the runs can fail: mutants the verifier rejects, built and run
without it (tests/verify/unverified_worker.py), are called WRONG or hung by the same classifier.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from stratac import ir, verify
from stratac.diagnostics import Severity, Source, StrataError
from stratac.lang import frontend
from stratac.tools.run import runner

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.strata"))
VERIFY_WORLDS = [1, 2, 3, 4]


def _worlds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


RUN_WORLDS = _worlds(os.environ.get("STRATAC_MUTATION_WORLDS", "2-4"))
# A verifier that stopped rejecting would otherwise turn CI into hours of builds and runs: past this
# many accepted mutants at one world the test fails at once, naming them (not when asked for worlds;
# 44 at world 2 with the FIFO and PAT ReduceScatters, the PAT AllGather and the unequal groups,
# every one in EQUIVALENT).
# Asked for worlds, every accepted mutant runs at every one of them that accepts it (_runs_at).
EVERY_WORLD = "STRATAC_MUTATION_WORLDS" in os.environ
MAX_RUNS_PER_WORLD = None if EVERY_WORLD else 50

# (file, the deleted line's text, which occurrence of that text among the file's mutated lines)
# -> (the worlds of VERIFY_WORLDS above 1 at which the verifier accepts the mutant, why the
# mutant computes the same thing there). World 1 is left out: there every peer loop is empty
# and every barrier meets only itself, so any deleted line about peers or synchronisation is
# equivalent.
# the reasons shared by several lines of the two-level AllReduce (allreduce_hierarchical and its
# composed twin): a team of one rank has no peer, so a line about its peers orders nothing there
NODE_OF_ONE = (
    (3,),
    "at world 3 the nodes have one rank each (T = 1): the node's reduce is a copy of the rank's "
    "own part onto itself, its all-gather and barriers have no peer; from world 6 on (nodes of "
    "2) the mutant is rejected (tests/verify/corpus/good_team_two_level.strata has both levels "
    "from world 4)")
# allreduce_double_tree.strata's second child (label 2 l + 2)
ONE_CHILD = (
    (2,),
    "at world 2 each tree is a root and one child, so no rank has a second child and the lines for "
    "it never run; from world 3 on the root of each tree has two, and the mutant is rejected")
# allreduce_halving_doubling.strata's folding of the ranks beyond a power of two
NO_FOLD = (
    (2, 4),
    "at a power-of-two world no rank is beyond the power of two (E = 0), so the fold into a "
    "neighbour and the copy back never run; at world 3 (E = 1) the mutant is rejected")
LANE_OF_ONE = (
    (2, 4),
    "at worlds 2 and 4 the world is one node (T = world), so a lane has one rank: the lane's "
    "reduce copies the chunk onto itself, its all-gather and barriers have no peer; at world 3 "
    "(lanes of 3) the mutant is rejected")
NODE_OF_ONE_COMPOSED = (
    (3,),
    "at world 3 the nodes have one rank each (T = 1): the node's reduce is a copy of the rank's "
    "own part onto itself, its all-gather and barriers have no peer (the ring over the lane does "
    "the work); from world 6 on (nodes of 2) the mutant is rejected (the same lines of "
    "allreduce_hierarchical.strata above)")

EQUIVALENT = {
    ("allgather_bruck.strata", "if k > 0: wait got[k - 1]             # rank + d / 2's blocks have landed",
     1): (
        (2,),
        "at world 2 there is one step (S = 1), so no rank forwards a block and the wait for the "
        "step before never runs; from world 3 on the mutant is rejected"),
    **{("allgather_bruck.strata", line, 1): (
        (2, 3),
        "at worlds 2 and 3 every step sends one block (c = min(2^k, world - 2^k) = 1), which never "
        "passes the end of out, so the arm of the two copies never runs; from world 4 on rank 3's "
        "second step wraps and the mutant is rejected") for line in (
            "out[rank * n:world * n]@to = out[rank * n:world * n]",
            "out[0:(e - world) * n]@to = out[0:(e - world) * n]")},
    ("alltoall_pairwise.strata", "if i + 1 < world: signal ready[i + 1]@((rank - i - 1) % world)", 1): (
        (2,),
        "at world 2 there is one step (i = 1), so no next writer is ever let go; from world 3 on "
        "the mutant is rejected (a deadlock)"),
    **{("allreduce_nhr.strata", "if s > 0: wait got[s - 1]", nth): (
        (2,),
        "at world 2 the reduce-scatter has one step (S = 1), so the wait for the step before it "
        "never runs; from world 3 on the mutant is rejected (a race)") for nth in (1, 2)},
    ("allreduce_nhr.strata", "set r = (r << 1) | ((base >> b) & 1)", 1): (
        (3,),
        "at world 3 no step's blocks are a whole class (3 is odd), so the run and its bit reversal "
        "never run; at worlds 2 and 4 the mutant is rejected, and at 6"),
    ("allreduce_nhr.strata",
     "if u < S { on aiv: x[lo:hi]@to op= x[lo:hi] } else { on sdma: x[lo:hi]@to = x[lo:hi] }", 1): (
        (3,),
        "at world 3 no step's blocks are a whole class (3 is odd), so the run's copy never runs; "
        "at worlds 2 and 4 the mutant is rejected, and at 6"),
    ("allreduce_nhr.strata",
     "if u < S { on aiv: part[p]@to op= part[p] } else { on sdma: part[p]@to = part[p] }", 1): (
        (2, 4),
        "at a power-of-two world every step's blocks are a whole class, so the block-by-block copy "
        "never runs; at world 3 the mutant is rejected"),
    **{("allreduce_nhr.strata", line, 1): (
        (2, 3, 4),
        f"the renumbering only has to agree with the runs' bit reversal: at worlds 2 and 4 no block "
        f"goes one by one, and at world 3 every step does (no unshuffle at all: step 0 moves one "
        f"block), so any one-to-one map is as good; from world {first} on the map without it "
        f"disagrees with the runs and the mutant is rejected") for line, first in (
        ("set p = st + (o / 2 if o % 2 == 0 else (min(st + g, world) - st + 1) / 2 + o / 2)", 6),
        ("set more = (0 if g % 2 + world % g % 2 > 0 else more)", 28),
        ("set g = g / 2", 10))},
    ("allreduce_groups.strata", "requires world >= 2", 1): (
        (2, 3, 4),
        "the requirement only excludes world 1, where the mutant is rejected (E0201: a group of 0 "
        "ranks)"),
    **{("allreduce_groups.strata", line, 1): (
        (2,),
        "at world 2 each group is one rank: a barrier of the group meets nobody else, and the "
        "group has no peer to read a range from") for line in (
        "x[q * k * n / C:(q + 1) * k * n / C] = x[q * k * n / C:(q + 1) * k * n / C]@p",
        "barrier(g)                             # my group has read my x: I may return")},
    ("allgather_ring_pipelined.strata",
     "if s > 0: wait got[(s - 1) * 2]         # chunk 0 of block b came from the previous rank", 1): (
        (2,),
        "at world 2 the ring has one step (s = 0), so the wait for the previous step never runs"),
    ("allgather_ring_pipelined.strata",
     "if s > 0: wait got[(s - 1) * 2 + 1]     # chunk 1 lands while chunk 0 is in flight", 1): (
        (2,),
        "at world 2 the ring has one step (s = 0), so the wait for the previous step never runs"),
    ("alltoall_bruck.strata",
     "else { rcv[(2 * j + 1) * d * n:world * n]@((rank + d) % world) = tmp[(2 * j + 1) * d * n:world * n] }",
     1): (
        (2, 4),
        "at a power-of-two world every run of 2^k blocks ends inside the world, so the cut-off arm "
        "never runs"),
    ("alltoall_bruck.strata", "else { tmp[(2 * j + 1) * d * n:world * n] = rcv[(2 * j + 1) * d * n:world * n] }", 1): (
        (2, 4),
        "at a power-of-two world every run of 2^k blocks ends inside the world, so the cut-off arm "
        "never runs"),
    ("alltoall_bruck.strata", "if k > 0: wait ok[k]                    # rank + d copied round k - 1 out of its rcv",
     1): (
        (2, 3),
        "at world 2 there is one round (k = 0), so the credit is never waited for; at world 3 round "
        "1 writes block 2 of rcv, which round 0 (blocks 1 and 3..) never wrote, so no write waits "
        "for a read; from world 4 on round 1's run (blocks 2-3) overlaps round 0's block 3 and the "
        "mutant is rejected (a race)"),
    ("alltoall_pairwise.strata", "if i > 1: wait ready[i]                   # p's block of step i - 1 has landed",
     1): (
        (2, 3, 4),
        "ready paces the writers of a rank's output, one at a time (no incast): a property of "
        "speed, not of the result. Without the wait every rank writes its blocks without pause; "
        "the blocks are disjoint and every peer has entered (the call's agreement), so the result "
        "is the same at every world; what is lost is the pacing the algorithm is for"),
    ("alltoall_bruck.strata", "if k + 1 < L: signal ok[k + 1]@((rank - 2 * d) % world)", 1): (
        (2,),
        "at world 2 there is one round (L = 1), so the next round's handshake is never signalled"),
    **{("allreduce_halving_doubling.strata", line, 1): NO_FOLD for line in (
        "on aiv: x@(rank - 1) op= x                  # fold my contribution into it",
        "signal got[2 * L]@(rank - 1)",
        "wait got[2 * L + 1]                         # the result landed in my x",
        "if rank < 2 * E: wait got[2 * L]            # my right neighbour's contribution has landed",
        "on sdma: x@(rank + 1) = x",
        "signal got[2 * L + 1]@(rank + 1)")},
    **{("allreduce_double_tree.strata", line, nth): ONE_CHILD for line, nth in (
        ("if 2 * l + 2 < world: wait up[2 * t + 1]", 1),
        ("on sdma: half[t]@c = half[t]", 2),
        ("signal down[t]@c", 2))},
    ("allreduce_halving_doubling.strata", "if k > 0: wait got[k - 1]", 1): (
        (2, 3),
        "at worlds 2 and 3 the power-of-two part has 2 ranks, so the reduce-scatter has one step "
        "(k = 0) and the wait for the step before it never runs; from world 4 on the mutant is "
        "rejected (a race)"),
    **{(name, "if s > 0: wait got[s - 1]                # the previous rank's step s - 1 is in my "
               "block c", 1): (
        (2,),
        "at world 2 the ring has one step (s = 0), so the wait for the step before it never runs; "
        "from world 3 on the mutant is rejected (a race)")
       for name in ("reducescatter_ring.strata", "reducescatter_ring_in_place.strata")},
    ("allreduce_reduce_on_write.strata", "barrier", 1): (
        (2, 3, 4),
        "the first barrier orders nothing: the seed after it (os[rank] = xs[rank]) touches only the "
        "rank's own x and out, valid from entry; the second barrier, now the first, is the one "
        "that keeps the peers' accumulates out of my out until I have entered and seeded it; and "
        "the previous call's writes into my out (the peers' pushes of their slices) all landed "
        "before its last barrier"),
    ("allreduce_hierarchical.strata",
     'on aiv: part[me] = op(part[me]@p for p in node.ranks)', 1): NODE_OF_ONE,
    ("allreduce_hierarchical.strata",
     'barrier(lane)                                 # my lane has reduced its parts', 1): LANE_OF_ONE,
    ("allreduce_hierarchical.strata",
     'on aiv: chunk[me][lane.rank] = op(chunk[me][lane.rank]@p for p in lane.ranks)', 1): LANE_OF_ONE,
    ("allreduce_hierarchical.strata",
     'on sdma: for p in lane.peers: chunk[me][lane.rank]@p = chunk[me][lane.rank]', 1): LANE_OF_ONE,
    ("allreduce_hierarchical.strata",
     'barrier(lane)                                 # my part me is complete', 1): LANE_OF_ONE,
    ("allreduce_hierarchical.strata",
     'on sdma: for p in node.peers: part[me]@p = part[me]', 1): NODE_OF_ONE,
    ("allreduce_hierarchical.strata",
     "barrier(node)                                 # my node's writes into me have landed", 1): NODE_OF_ONE,
    ("allreduce_hierarchical_composed.strata",
     "barrier(lane)                                 # my lane's parts me are reduced over their nodes", 1): (
        (2, 4),
        "at worlds 2 and 4 the world is one node (T = world), so a lane has one rank and the ring "
        "over it writes no peer: nothing needs the lane's parts reduced first; at world 3 (lanes "
        "of 3) the mutant is rejected (a race with the node's reduce)"),
    ("allreduce_hierarchical_composed.strata",
     'on aiv: part[me] = op(part[me]@p for p in node.ranks)', 1): NODE_OF_ONE_COMPOSED,
    ("allreduce_hierarchical_composed.strata",
     'on sdma: for p in node.peers: part[me]@p = part[me]', 1): NODE_OF_ONE_COMPOSED,
    ("allreduce_hierarchical_composed.strata",
     "barrier(node)                                 # my node's writes into me have landed", 1):
        NODE_OF_ONE_COMPOSED,
    ("allreduce_hierarchical_composed.strata",
     'call allreduce_ring(part[me], op) on lane     # part me, all-reduced over my lane', 1): (
        (2, 4),
        "at worlds 2 and 4 the world is one node (T = world), so a lane has one rank: the ring over "
        "it has no step (2 * 1 - 2 = 0) and no peer, so the call does nothing; at world 3 (lanes "
        "of 3) the mutant is rejected"),
    ("broadcast.strata", "barrier", 1): (
        (2,),
        "at world 2 the all-gather step sends nothing from the non-root rank (its only peer is the "
        "root, which `if p != root` skips), so nobody forwards a slice it received in the scatter "
        "and the middle barrier orders nothing; at world 3 the non-roots forward, and the mutant "
        "is rejected (E0301)"),
    ("reducescatter_ring_fifo.strata",
     "if s >= 2: wait free[s % 2] round (s - 2) / 2    # the credit: my write of step s - 2 was read",
     1): (
        (2, 3),
        "below world 4 the ring has at most two steps, so no FIFO slot is written twice and no "
        "credit is needed; at world 4 the mutant is rejected (E0301, the reuse without a credit)"),
    ("reducescatter_ring_fifo.strata",
     "signal free[(s - 1) % 2]@prev round (s - 1) / 2", 1): (
        (2, 3),
        "below world 4 nobody waits for a credit (no slot is written twice); at world 4 the mutant "
        "is rejected (E0302: the previous rank waits for a credit that never comes)"),
    ("reducescatter_ring_fifo.strata",
     "wait full[(s - 1) % 2] round (s - 1) / 2       # the previous rank's step s - 1 landed", 1): (
        (2,),
        "at world 2 the ring has one step (s = 0), which sends its own block: the arm that waits "
        "for the previous rank's partial sum never runs"),
    ("reducescatter_ring_fifo.strata",
     "on aiv: slot[s % 2]@next = op(slot[(s - 1) % 2], xb[c])", 1): (
        (2,),
        "at world 2 the ring has one step (s = 0), which sends its own block: the arm that adds "
        "to the previous rank's partial sum never runs"),
    ("reducescatter_ring_fifo.strata", "on aiv: out = x", 1): (
        (2, 3, 4),
        "the copy is world 1's whole schedule (the else arm of `if world > 1`), rejected there (E0305)"),
    # reducescatter_pat.strata: below world 5 its trees have at most two levels and each dim at
    # most two messages (F = 2 slots), so the lines for deeper trees and reused slots never run
    ("reducescatter_pat.strata", "on aiv: out = x", 1): (
        (2, 3, 4),
        "the copy is world 1's whole schedule (`if world == 1`), rejected there (E0305)"),
    ("reducescatter_pat.strata", "if c >= F: wait free[c % F] round c / F - 1", 1): (
        (2, 3, 4),
        "below world 6 dim 0 carries at most two leaf messages, one per slot, so no slot is "
        "written twice; up to world 8 the previous write's reader has always read it by then "
        "through the other flags; at world 9 the mutant is rejected (E0301, the credit named)"),
    ("reducescatter_pat.strata", "set sent[0] = c + 1", 1): (
        (2, 3),
        "at worlds 2 and 3 dim 0 carries one leaf message, so its counter is never read again; "
        "at world 4 two messages share slot 0 and the mutant is rejected"),
    ("reducescatter_pat.strata", "on aiv: out op= slot[k * F + i % F]", 1): (
        (2,),
        "at world 2 my own block has one child (s = 1), whose part is the first (`k == L - 1`): "
        "the accumulate of later parts never runs; at world 3 the mutant is rejected"),
    ("reducescatter_pat.strata", "if c >= F: wait free[j * F + c % F] round c / F - 1", 1): (
        (2, 3, 4),
        "below world 11 no dim above 0 carries more than F = 2 messages, so no slot of it is "
        "written twice; up to world 20 the reader's credit is implied by the flags of the trees; "
        "at world 21 the mutant is rejected (E0301)"),
    ("reducescatter_pat.strata",
     "on aiv: slot[j * F + c % F]@p = op(slot[k * F + i % F], xb[(rank + t) % world])", 1): (
        (2, 3),
        "at world 2 no message has a parent; at world 3 the one message of dim 1 (t = 2) has its "
        "child at s = 3 >= world, so it starts from my block alone (the sdma arm); at world 4 the "
        "mutant is rejected"),
    ("reducescatter_pat.strata", "on sdma: slot[j * F + c % F]@p = xb[(rank + t) % world]", 1): (
        (2, 4),
        "at worlds 2 and 4 every message's first child exists (no s >= world with t < world), so "
        "the arm that starts a message from my block alone never runs; at world 3 the mutant is "
        "rejected"),
    ("reducescatter_pat.strata", "if s < world: on aiv: slot[j * F + c % F]@p op= slot[k * F + i % F]", 1): (
        (2, 3, 4),
        "below world 6 no message has a second child below the world (dim 1's one child is its "
        "first part, `k == j - 1`; dim 2's second, s = 5, is not below world 5): the accumulate "
        "of later parts never runs; at world 6 the mutant is rejected"),
    ("reducescatter_pat.strata", "signal full[j * F + c % F]@p round c / F", 1): (
        (2,),
        "at world 2 the only message is a leaf's; at world 3 the mutant is rejected (E0302)"),
    ("reducescatter_pat.strata", "set sent[j] = c + 1", 1): (
        (2, 3, 4),
        "below world 7 each dim above 0 carries at most one message, so its counter is never read "
        "again; at world 7 the mutant is rejected"),
    ("reducescatter_pat.strata", "signal free[k * F + i % F]@((rank - (1 << k)) % world) round i / F",
     1): (
        (2, 3, 4),
        "below world 6 nobody waits for a credit (no slot is written twice); at world 6 the "
        "mutant is rejected (E0302: the sender waits for a credit that never comes)"),
    ("reducescatter_pat.strata", "} else {", 2): (
        (2,),
        "the `} else {` between a message's first part with a sender and without one: at world 2 "
        "no message has a parent (t = 0 only), so neither arm runs; at world 3 the mutant is "
        "rejected"),
    ("reducescatter_pat.strata", "} else {", 3): (
        (2, 3),
        "the `} else {` before a message's later parts: at world 2 no message has a parent, and at "
        "world 3 the one message of dim 1 has its only child at s = 3 >= world, so the later part "
        "merged into the first-part arm never runs; at world 4 the mutant is rejected"),
    ("reducescatter_pat.strata", "set rcvd[k] = i + 1", 1): (
        (2, 3),
        "at worlds 2 and 3 each dim brings me one message, so its counter is never read again; at "
        "world 4 the mutant is rejected"),
    # allgather_pat.strata: at world 2 one sub-step (s = 1), at world 3 two (s = 2, 1) whose blocks
    # are the sender's own (t = 0); below world 6 no dim carries more than two messages (F = 2)
    ("allgather_pat.strata", "set s = 0                                   # s = order(P, u)", 1): (
        (2,),
        "at world 2 the one sub-step's s starts from the var's 0 anyway; at world 3 the second "
        "starts from the first's and the mutant is rejected (E0305)"),
    ("allgather_pat.strata", "set w = w - 1", 1): (
        (2, 3),
        "at world 2 the order has one level; at world 3 (P = 4) the order becomes 3, 2, 1, and "
        "s = 3 >= world is skipped, so the sub-steps run 2, 1 as they should; at world 4 s = 3 "
        "comes before s = 2 and the mutant is rejected (E0305)"),
    ("allgather_pat.strata", "} else {", 1): (
        (2,),
        "the order's `} else {`: at world 2 the one level takes u = 1 <= h = 1, the arm that "
        "stays, and s = 1; at world 3 the mutant is rejected"),
    ("allgather_pat.strata", "set w = w - h", 1): (
        (2,),
        "at world 2 the one sub-step takes the other arm (u = 1 <= h = 1); at world 3 the mutant "
        "is rejected"),
    ("allgather_pat.strata", "if c >= F: wait free[k * F + c % F] round c / F - 1", 1): (
        (2, 3, 4),
        "below world 6 dim 0 carries at most two messages (s = 1, 3), one per slot, so no slot is "
        "written twice; at world 6 the mutant is rejected (E0301, a reuse without a credit)"),
    ("allgather_pat.strata", "} else {", 2): (
        (2, 3),
        "the `} else {` of the block sent: at worlds 2 and 3 every sub-step sends the sender's "
        "own block (t = 0), and the arm merged into it sends ob[rank], the copy of x; at world 4 "
        "s = 3 forwards block rank + 2, which the mutant never sends (E0305)"),
    ("allgather_pat.strata", "on sdma: slot[k * F + c % F]@to = ob[(rank + t) % world]", 1): (
        (2, 3),
        "at worlds 2 and 3 every sub-step sends the sender's own block (t = 0): no block is "
        "forwarded; at world 4 the mutant is rejected"),
    ("allgather_pat.strata", "signal free[k * F + c % F]@((rank + (1 << k)) % world) round c / F", 1): (
        (2, 3, 4),
        "the credit: below world 6 no slot is written twice, so no rank waits for one; at world 6 "
        "the wait for it never ends and the mutant is rejected (E0302)"),
    ("allgather_pat.strata", "set m[k] = c + 1", 1): (
        (2, 3),
        "at worlds 2 and 3 each dim carries one message, so its counter is never read again; at "
        "world 4 dim 0 carries two and the mutant is rejected (E0306)"),
    # broadcast_hierarchical_composed.strata: nodes of T = min(lowest set bit of world, 8) ranks,
    # so at world 3 each node is one rank and the lane is the world, at 2 and 4 one node is the world
    ("broadcast_hierarchical_composed.strata", "on sdma: part[me] = part[me]@root", 1): (
        (3,),
        "at world 3 the root's node is the root alone, so no rank takes the scatter's arm; at "
        "worlds 2 and 4 the mutant is rejected"),
    ("broadcast_hierarchical_composed.strata", "call broadcast_tree(part[me], (root / T)) on lane", 1): (
        (2, 4),
        "at worlds 2 and 4 one node holds every rank and each lane one rank, so the tree across "
        "the nodes moves nothing; at world 3 the mutant is rejected"),
    ("broadcast_hierarchical_composed.strata", "on sdma: for p in node.peers: part[me]@p = part[me]", 1): (
        (3,),
        "at world 3 each node is one rank, with no peers to gather from"),
    ("broadcast_hierarchical_composed.strata", "barrier(node)", 1): (
        (3,),
        "at world 3 each node is one rank: its barrier waits for no one"),
}


# ---- mutants ------------------------------------------------------------------------------------

def mutated_lines(text: str) -> list[int]:
    """The 1-based numbers of the lines a mutant may delete: inside a schedule's body (after the
    line holding its opening `{`, before the line that closes it), not blank, not only a comment,
    not only braces."""
    out: list[int] = []
    depth = 0   # of braces at the start of the line: a header (no braces in it) is at depth 0
    for no, line in enumerate(text.split("\n"), start=1):
        code = line.split("#", 1)[0]
        if depth > 0 and code.strip().strip("{}").strip():
            out.append(no)
        depth += code.count("{") - code.count("}")
    return out


@dataclass(frozen=True)
class Mutant:
    path: Path
    line: int         # the deleted line, 1-based, in the example
    text: str         # the deleted line, stripped
    nth: int          # which occurrence of `text` among the file's mutated lines (1-based)
    source: str       # the example without that line

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.path.name, self.text, self.nth)

    def __str__(self) -> str:
        return f"{self.path.name}:{self.line} deleted (`{self.text}`)"


def mutants(path: Path) -> list[Mutant]:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    seen: Counter[str] = Counter()
    out = []
    for no in mutated_lines(text):
        stripped = lines[no - 1].strip()
        seen[stripped] += 1
        out.append(Mutant(path, no, stripped, seen[stripped], "\n".join(lines[:no - 1] + lines[no:])))
    return out


# ---- verdicts -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    accepted: bool
    by: str = ""      # "front end" or "verifier"
    code: str = ""    # the first error's code

    def __str__(self) -> str:
        return "accepted" if self.accepted else f"{self.by} {self.code}"


def _first_error(diags) -> str:
    errors = [d for d in diags if d.severity is Severity.ERROR]
    assert errors, "a rejection without an error diagnostic"
    return errors[0].code


@cache
def verdicts(m: Mutant) -> dict[int, Verdict]:
    """The mutant's verdict at every world of VERIFY_WORLDS and RUN_WORLDS. Anything but a
    StrataError from the front end or the verifier propagates: a crash is a bug too."""
    worlds = sorted(set(VERIFY_WORLDS) | set(RUN_WORLDS))
    try:
        scheds = frontend.schedules(Source(f"{m.path.stem}-without-{m.line}.strata", m.source))
    except StrataError as exc:
        v = Verdict(False, "front end", _first_error(exc.diagnostics))
        return {w: v for w in worlds}
    out = {}
    for w in worlds:
        out[w] = Verdict(True)
        for s in scheds:
            results = verify.verify_worlds(s, [w])
            if any(r.skipped for r in results):   # nothing is proven there: a call is refused
                out[w] = Verdict(False, "requires", results[0].skipped)
                break
            bad = [r for r in results if not r.ok]
            if bad:
                out[w] = Verdict(False, "verifier", _first_error(bad[0].diagnostics))
                break
    return out


def _all_mutants() -> list[Mutant]:
    return [m for p in EXAMPLES for m in mutants(p)]


# ---- runs ---------------------------------------------------------------------------------------

def collective_cases(world: int) -> list[runner.Case]:
    """One element (fewer than ranks), an uneven split and one above the UB tile; roots at both
    ends and in the middle; sum and max; integers exact under any order of the additions."""
    return [runner.Case("f32", count=1, op="sum", root=world - 1),
            runner.Case("bf16", count=1001, op="max", root=0),
            runner.Case("i32", count=4099, op="sum", root=world // 2)]


# every routing, one token, rows that are not a multiple of 32 bytes (tests/e2e/test_moe.py's)
MOE_CASES = [
    runner.Case("f32", tokens=37, hidden=33, topk=2, routing="uniform"),
    runner.Case("bf16", tokens=37, hidden=33, topk=3, routing="skewed"),
    runner.Case("f16", tokens=37, hidden=65, topk=2, routing="single"),
    runner.Case("bf16", tokens=1, hidden=33, topk=2, routing="empty"),
    runner.Case("f32", tokens=29, hidden=7, topk=4, routing="sparse"),
]
# the int8 dispatches' windows take rows of whole 32-byte blocks only (a call refuses hidden 33)
INT8_CASES = [
    runner.Case("bf16", tokens=37, hidden=96, topk=3, routing="skewed"),
    runner.Case("f32", tokens=29, hidden=32, topk=4, routing="sparse"),
    runner.Case("bf16", tokens=1, hidden=64, topk=2, routing="empty"),
]

FINE = ("OK", "REFUSED", "REJECTED")   # a run outcome of an accepted mutant that is no bug


@dataclass(frozen=True)
class Outcome:
    kind: str         # OK, REFUSED (at the call), REJECTED (compiling), WRONG, HANG, FAILED
    detail: str = ""


def _mutant_path(name: str, world: int, tmp: Path) -> Path:
    return tmp / f"{name}-w{world}.strata"


def build_mutants(sources: list[tuple[str, str]], world: int, tmp: Path) -> None:
    """Builds the kernels of every (source, name) as run_mutant's run will (same file, options,
    world), one g++ per CPU at a time, so that the runs find them built; a source that does not
    compile is left to its run to say so."""
    from stratac.codegen.pipeline import compile_schedules
    from stratac.host.schedule import prove_worlds
    from stratac.ir import passes
    from stratac.targets import cpu
    outputs, uses = [], []
    for source, name in sources:
        path = _mutant_path(name, world, tmp)
        path.write_text(source, encoding="utf-8")
        try:
            compiled = compile_schedules(frontend.load_source(str(path)), passes.Options(cores=RUN_CORES),
                                         [world], prove_worlds)
        except StrataError:
            continue
        cases = mutant_cases([c.schedule for c in compiled], world)
        outputs += [c.output for c in compiled]
        uses += [runner.entry_uses(cases)] * len(compiled)
    cpu.build_all(outputs, uses)


RUN_CORES = 4


def mutant_cases(scheds, world: int) -> list:
    """The cases run_mutant's run takes for a source of these schedules."""
    moe = any(s.contract.kind.moe for s in scheds)
    int8 = any(b.dtype is ir.DType.I8 for s in scheds for b in s.params)
    return (INT8_CASES if int8 else MOE_CASES) if moe else collective_cases(world)


def run_mutant(source: str, name: str, world: int, tmp: Path, timeout: float = 30.0) -> Outcome:
    """`stratac run` of `source` at `world`: every schedule, every case, checked against torch."""
    path = _mutant_path(name, world, tmp)
    path.write_text(source, encoding="utf-8")
    try:
        scheds = frontend.schedules(Source(str(path), source))
        cases = mutant_cases(scheds, world)
        out = runner.run(runner.RunSpec(file=str(path), world=world, cases=cases, iters=1, warmup=0,
                                        cores=RUN_CORES, timeout=timeout), echo=lambda line: None)
    except StrataError as exc:
        return Outcome("REJECTED", _first_error(exc.diagnostics))
    if out.failures:
        text = "\n".join(out.failures)
        # the proof of the call's instance refused it (stratac.host.instance): nothing was written
        if all("nothing was written" in f for f in out.failures):
            return Outcome("REFUSED", text)
        return Outcome("HANG" if "timed out" in text else "FAILED", text)
    wrong = [r for r in out.results if not r["ok"]]
    if wrong:
        return Outcome("WRONG", "\n".join(
            f"{r['schedule']} rank {r['rank']} {r['dtype']} count={r['count']} op={r['op']} "
            f"root={r['root']}{' routing=' + r['moe']['routing'] if r.get('moe') else ''}: "
            f"{r['why'] or '(the dispatch line says why)'}" for r in wrong))
    want = world * len(cases) * len(scheds)
    if len(out.results) != want or out.exit_code != 0:
        return Outcome("FAILED", f"{len(out.results)} results of {want}, exit status {out.exit_code}")
    return Outcome("OK")


# ---- tests --------------------------------------------------------------------------------------

def test_mutated_lines_are_the_statement_lines_of_schedule_bodies():
    text = "\n".join([
        "# a comment before",                                    # 1
        "schedule s(x: sym T[n],",                               # 2  header, over two lines
        "           op: redop) implements allreduce(x, op) {",   # 3
        "  part = split(x, world)  # trailing comment",          # 4  *
        "",                                                      # 5
        "  # a comment inside",                                  # 6
        "  on aiv {",                                            # 7  * (deleting it: syntax error)
        "    part[rank] = op(part[rank]@p",                      # 8  * one statement, two lines
        "                    for p in ranks)",                   # 9  *
        "  }",                                                   # 10
        "  barrier }",                                           # 11 * closes the body too
        "schedule t(x: sym T[n]) implements allgather(x -> x) {",  # 12
        "  {",                                                   # 13
        "  barrier",                                             # 14 *
        "}",                                                     # 15
    ])
    assert mutated_lines(text) == [4, 7, 8, 9, 11, 14]


def test_every_example_has_mutants_and_verifies_unmutated():
    """A broken example would make every mutant "rejected" and the test vacuous."""
    assert len(EXAMPLES) >= 15
    for p in EXAMPLES:
        assert len(mutants(p)) >= 2, p.name   # the one-shot AllReduce: its stage and its barrier
        for s in frontend.schedules(frontend.load_source(str(p))):
            bad = [r for r in verify.verify_worlds(s, VERIFY_WORLDS) if not r.ok]
            assert not bad, f"{p.name}: {bad[0].diagnostics[0].render()}"


def test_the_accepted_mutants_are_the_known_equivalent_ones():
    """Every mutant the verifier accepts at a world above 1 is listed in EQUIVALENT with its reason,
    and every entry there still exists and is accepted at exactly the worlds it says."""
    t0 = time.monotonic()
    accepted: dict[tuple, tuple[int, ...]] = {}
    summary = []
    for p in EXAMPLES:
        ms = mutants(p)
        codes: Counter[str] = Counter()
        for m in ms:
            vs = verdicts(m)
            rejected = [v for w, v in vs.items() if w in VERIFY_WORLDS and not v.accepted]
            codes.update({str(rejected[0]) if rejected else "accepted at every world"})
            worlds = tuple(w for w in VERIFY_WORLDS if w > 1 and vs[w].accepted)
            if worlds:
                accepted[m.key] = worlds
        at1 = sum(verdicts(m)[1].accepted for m in ms)
        summary.append(f"{p.name}: {len(ms)} mutants; first rejection (worlds 1-4) "
                       f"{dict(sorted(codes.items()))}; accepted at world 1: {at1}")
    print(f"mutants and verdicts ({time.monotonic() - t0:.1f} s; pytest -s shows this):\n  "
          + "\n  ".join(summary))
    new = {k: w for k, w in accepted.items() if k not in EQUIVALENT}
    assert not new, ("the verifier accepts mutants nobody has explained (file, line, occurrence -> "
                     f"worlds): {new}; say why each is equivalent in EQUIVALENT, or, if it is not, "
                     "make the verifier reject it")
    stale = {k: (v[0], accepted.get(k, ())) for k, v in EQUIVALENT.items() if accepted.get(k) != v[0]}
    assert not stale, f"EQUIVALENT is out of date (entry -> (listed worlds, accepted worlds)): {stale}"


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    """The mutants' builds stay out of the user's cache, in a cache of their own that outlives the
    run (builds are keyed by everything that goes into them, so a kept one is only ever the same
    kernel): the mutants are the same from one run of the suite to the next, and building them,
    about 4 s each, was most of this test's time. STRATAC_TEST_MUTANT_CACHE moves it."""
    return Path(os.environ.get("STRATAC_TEST_MUTANT_CACHE",
                               Path.home() / ".cache" / "stratac-test-mutants"))


def _runs_at(world: int) -> list[Mutant]:
    """The accepted mutants to run at `world`. Asked for worlds (STRATAC_MUTATION_WORLDS): every
    mutant the verifier accepts there. By default (CI): each accepted mutant once, at one of the
    worlds of RUN_WORLDS it is accepted at, the worlds taken in turn over the mutants, so that
    every world runs some and a run costs a third of running each at all three (a rank process
    starts in about a second: the runs are what the suite's time goes to)."""
    todo = []
    accepted = [m for m in _all_mutants() if any(verdicts(m)[w].accepted for w in RUN_WORLDS)]
    for i, m in enumerate(accepted):
        worlds = [w for w in RUN_WORLDS if verdicts(m)[w].accepted]
        mine = world in worlds if EVERY_WORLD else worlds[i % len(worlds)] == world
        if mine:
            todo.append(m)
    return todo


@pytest.mark.slow
@pytest.mark.parametrize("world", RUN_WORLDS)
def test_accepted_mutants_run_ok(world, tmp_path, cache_dir, monkeypatch):
    """Every mutant the verifier accepts runs OK against torch (or is refused before anything is
    written) at a world it is accepted at (_runs_at: at every such world when asked for worlds)."""
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(cache_dir))
    todo = _runs_at(world)
    assert MAX_RUNS_PER_WORLD is None or len(todo) <= MAX_RUNS_PER_WORLD, \
        f"{len(todo)} mutants accepted at world {world}: " + ", ".join(map(str, todo))
    build_mutants([(m.source, f"{m.path.stem}-L{m.line}") for m in todo], world, tmp_path)
    bad = []
    for m in todo:
        got = run_mutant(m.source, f"{m.path.stem}-L{m.line}", world, tmp_path)
        print(f"world {world}: {m}: {got.kind}")
        if got.kind not in FINE:
            bad.append(f"{m} at world {world}: verified, then {got.kind}:\n{got.detail}")
    assert not bad, "\n\n".join(bad)


def _unverified_worker():
    spec = importlib.util.spec_from_file_location("unverified_worker", HERE / "unverified_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _UnverifiedRanks():   # noqa: N802 - it stands in for the runner's Rank class
    """The runner's Rank (stratac.tools.run.procs), except that the rank processes it starts run
    tests/verify/unverified_worker.py instead of stratac.tools.run.worker."""
    from stratac.tools.run import procs

    def rank(argv, *args, **kw):
        assert argv[:2] == ["-m", "stratac.tools.run.worker"], argv
        return procs.Rank([str(HERE / "unverified_worker.py"), *argv[2:]], *args, **kw)
    return rank


# (example, deleted line's text, what the run must say, a substring of its detail)
KNOWN_BAD = [
    ("allreduce_twoshot.strata", "on aiv: part[rank] = op(part[rank]@p for p in ranks)", "WRONG",
     "expected"),
    ("moe_prefill.strata", "on aiv: y = gather(win, ids, weights, offs)", "WRONG", "y["),
    ("allreduce_twoshot_flags.strata", "for p in peers: signal done[rank]@p", "HANG",
     "never signalled"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name, text, kind, detail", KNOWN_BAD, ids=[k[0] + ":" + k[2] for k in KNOWN_BAD])
def test_the_oracle_says_wrong(name, text, kind, detail, tmp_path, cache_dir, monkeypatch):
    """A mutant the verifier rejects, built and run without it, is WRONG (or hangs) by the same
    classifier that calls the accepted mutants OK: the oracle can fail."""
    m = next(m for m in mutants(ROOT / "examples" / name) if m.text == text)
    assert not verdicts(m)[2].accepted
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(cache_dir))
    monkeypatch.setattr(runner, "compile_schedules", _unverified_worker().compile_unverified)
    monkeypatch.setattr(runner, "Rank", _UnverifiedRanks())
    got = run_mutant(m.source, f"{m.path.stem}-L{m.line}", 2, tmp_path, timeout=3)
    assert got.kind == kind, f"{m}: {got}"
    assert detail in got.detail, got.detail
