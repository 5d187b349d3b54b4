"""Random well-formed schedules for the schedule fuzzer (tests/fuzz_schedules.py).

A schedule is built from *choices*: every decision the generator takes is `pick(name, options)`,
and option 0 is always the one that keeps the schedule correct (the standard library's way of
writing it). The other options are the mistakes a reader could make, or equivalent rewrites that
exercise the front end and the printer (an expression written another way, a `let` nobody uses,
an `if` on a size whose arms are the same). So

* every schedule is well-formed by construction: the names, types and blocks are right, and it
  parses (a front-end rejection is a bug of this generator, and the fuzzer counts it as one);
* with every choice at 0 it is verified, and each non-zero choice is a small, named change, so a
  disagreement is minimised by setting choices back to 0 one at a time (fuzz_schedules.minimise);
* hypothesis draws the choices (`schedules()`), so CI runs a fixed, derandomized set.

The families cover the language: splits and splits of splits, step loops with per-step flags or
barriers, reductions over ranks and of named regions (`op(a, b)`), accumulates, teams (block,
stride, across) and their barriers, asynchronous SDMA stages and their awaits, composition (`call
... on TEAM`), rank parameters, flags with rounds (a FIFO whose slots are reused, with credits),
loop state (the ring's block index carried in a `var`), and MoE routing (histogram, exscan,
slots, place, gather).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st


@dataclass
class Spec:
    """A generated file: its text and the choices that made it (name -> index of the option)."""
    family: str
    text: str
    choices: dict[str, int] = field(default_factory=dict)

    @property
    def mistakes(self) -> dict[str, int]:
        return {k: v for k, v in self.choices.items() if v and not k.startswith("~")}


class Picker:
    """`pick(name, options)`: the option chosen for `name`, drawn or replayed. Names starting with
    `~` are rewrites that never change the meaning (not mistakes)."""

    def __init__(self, draw=None, fixed: dict[str, int] | None = None):
        self.draw, self.fixed, self.taken = draw, dict(fixed or {}), {}

    def __call__(self, name: str, options):
        options = list(options)
        assert name not in self.taken, name
        if name in self.fixed:
            i = min(self.fixed[name], len(options) - 1)
        elif self.draw is not None:
            # the correct option half of the time, so that a schedule has a few mistakes, not all
            i = self.draw(st.one_of(st.just(0), st.integers(0, len(options) - 1)), label=name) \
                if len(options) > 1 else 0
        else:
            i = 0
        self.taken[name] = i
        return options[i]


# ---- equivalent rewrites of expressions (they exercise the front end and the C++ printer) ----

def expr(pick, name: str, text: str) -> str:
    """`text` (an integer expression) or one that always has the same value."""
    forms = [text, f"({text})", f"({text}) * 1", f"0 + ({text})", f"-(-({text}))",
             f"(({text}) << 1) >> 1" if _nonneg(text) else f"(({text}))",
             f"(({text}) | 0)", f"(({text}) ^ 0) + 0",
             # top operator | or &: as a loop bound printed without parentheses, `s < 0 | a` is
             # `(s < 0) | a` in C++, and `s < -1 & a` is 0 (issue 23's precedence bug)
             f"0 | ({text})", f"-1 & ({text})"]
    return pick("~" + name, forms)


def _nonneg(text: str) -> bool:
    return "-" not in text


def noise(pick, name: str, symbol: str | None) -> list[str]:
    """Statements that change nothing: an unused `let`, or none."""
    forms = [[], [f"let {name}_k = (world + 3) % 2 + log2(world)"],
             [f"let {name}_k = rank ^ (world - 1) & 7"]]
    if symbol:
        forms.append([f"let {name}_k = {symbol} / 4096 + 1"])
    return pick("~" + name, forms)


def stage(engine: str, body: str, handle: str | None = None) -> str:
    if handle:
        return f"on sdma async {handle}: {body}"
    return f"on {engine}: {body}"


def size_if(pick, name: str, sym: str, then: list[str], other: list[str] | None = None) -> list[str]:
    """`then`, or `if SYM > K { then } else { other or then }`: an if on a size (the verifier
    samples both sides of it), with the same statements in both arms when `other` is None."""
    k = pick("~" + name + "_k", [None, 0, 3, 4096, 100000])
    if k is None:
        return then
    return [f"if {sym} > {k} {{", *["  " + s for s in then], "} else {",
            *["  " + s for s in (other if other is not None else then)], "}"]


# ---- families ----

def twoshot(pick) -> Spec:
    """Reduce-scatter by reads, all-gather by writes (or reads), in place, over a split."""
    lines = ["schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {",
             "  part = split(x, world)"]
    lines += ["  " + s for s in noise(pick, "n0", "n")]
    lines += pick("b1", [["  barrier"], []])
    idx = pick("rs_idx", ["rank", "(rank + 1) % world"])
    src = pick("rs_over", ["ranks", "peers"])
    rs = f"part[{idx}] = op(part[{idx}]@p for p in {src})"
    lines.append("  on aiv: " + rs)
    lines += pick("b2", [["  barrier"], [], ["  barrier(world_team)"]])
    if "  barrier(world_team)" in lines:
        lines.insert(1, "  team world_team = block(world)")
    mode = pick("ag_mode", ["push", "pull", "push_self_missing"])
    eng = pick("ag_engine", ["sdma", "aiv", "auto"])
    if mode == "push":
        body = "for p in peers: part[rank]@p = part[rank]"
    elif mode == "pull":
        body = "for p in peers: part[p] = part[p]@p"
    else:
        body = "for p in peers: if p != world - 1: part[rank]@p = part[rank]"
    asyn = pick("ag_async", [None, "await_before_barrier", "await_after_barrier"]) if eng == "sdma" else None
    if asyn:
        lines.append("  " + stage(eng, body, "h"))
        if asyn == "await_before_barrier":
            lines += ["  await h"] + pick("b3", [["  barrier"], []])
        else:
            lines += pick("b3", [["  barrier"], []]) + ["  await h"]
    else:
        lines += ["  " + s for s in size_if(pick, "agif", "n", [stage(eng, body)])]
        lines += pick("b3", [["  barrier"], []])
    lines.append("}")
    return Spec("twoshot", "\n".join(lines) + "\n")


def oneshot(pick) -> Spec:
    lines = ["schedule fz(x: sym T[n], out: sym T[n], op: redop) implements allreduce(x -> out, op) {"]
    lines += pick("b1", [["  barrier"], []])
    src = pick("over", ["ranks", "peers"])
    lines += ["  " + s for s in size_if(pick, "if", "n", [f"on aiv: out = op(x@p for p in {src})"])]
    lines += pick("b2", [["  barrier"], []])
    lines.append("}")
    return Spec("oneshot", "\n".join(lines) + "\n")


def reducescatter(pick) -> Spec:
    lines = ["schedule fz(x: sym T[n * world], out: sym T[n], op: redop) "
             "implements reducescatter(x -> out, op) {",
             "  blk = split(x, world)"]
    lines += pick("b1", [["  barrier"], []])
    idx = pick("idx", ["rank", "(rank + 1) % world", "world - 1 - rank"])
    lines.append(f"  on aiv: out = op(blk[{expr(pick, 'idx_e', idx)}]@p for p in ranks)")
    lines += pick("b2", [["  barrier"], []])
    lines.append("}")
    return Spec("reducescatter", "\n".join(lines) + "\n")


def allgather(pick) -> Spec:
    """Push, pull, or a ring with a barrier per step."""
    lines = ["schedule fz(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {",
             "  blk = split(out, world)"]
    mode = pick("mode", ["push", "pull", "ring_barrier"])
    eng = pick("engine", ["sdma", "aiv", "auto"])
    if mode == "push":
        lines += pick("b1", [["  barrier"], []])
        lines.append(f"  on {eng}: for p in ranks: blk[rank]@p = x")
        lines += pick("b2", [["  barrier"], []])
    elif mode == "pull":
        lines += pick("b1", [["  barrier"], []])
        who = pick("pull_src", ["x@p", "blk[p]@p"])
        if who == "x@p":
            lines.append(f"  on {eng}: for p in ranks: blk[p] = x@p")
        else:   # reads the peer's out block before the peer wrote it there: wrong
            lines.append(f"  on {eng}: blk[rank] = x")
            lines.append(f"  on {eng}: for p in peers: blk[p] = blk[p]@p")
        lines += pick("b2", [["  barrier"], []])
    else:
        lines.append(f"  on {eng}: blk[rank] = x")
        lines += pick("b1", [["  barrier"], []])
        hi = pick("hi", ["world - 1", "world - 2", "world"])
        lines.append(f"  for s in 0 .. {expr(pick, 'hi_e', hi)} {{")
        b = pick("b", ["(rank - s) % world", "(rank + s) % world", "(rank - s - 1) % world"])
        lines.append(f"    let b = {b}")
        asyn = pick("step_async", [None, "await_then_barrier", "barrier_then_await"]) \
            if eng == "sdma" else None
        if asyn is None:
            lines.append(f"    on {eng}: blk[b]@((rank + 1) % world) = blk[b]")
            lines += pick("b_step", [["    barrier"], []])
        elif asyn == "await_then_barrier":
            lines += ["    on sdma async h: blk[b]@((rank + 1) % world) = blk[b]", "    await h", "    barrier"]
        else:   # the next step reads what this step's copy writes before the copy's await
            lines += ["    on sdma async h: blk[b]@((rank + 1) % world) = blk[b]", "    barrier", "    await h"]
        lines.append("  }")
        lines += pick("b2", [[], ["  barrier"]])
    lines.append("}")
    return Spec("allgather", "\n".join(lines) + "\n")


RING = """\
schedule {name}(x: sym T[n], op: redop) implements allreduce(x, op) {{
  flag ready[1]
  flag got[2 * world]
  part = split(x, world)
  let next = {next}
{entry}{pre}  for s in 0 .. {hi} {{
    let c = {c}
{wait}    if s < world - 1 {{ {reduce} }} else {{ {copy} }}
{signal}{post}  }}
{last}}}
"""


def ring_text(pick, name: str) -> str:
    nxt = expr(pick, "next_e", pick("next", ["(rank + 1) % world", "(rank - 1) % world"]))
    entry = pick("entry", ["  signal ready[0]@((rank - 1) % world)\n  wait ready[0]\n",
                           "", "  signal ready[0]@((rank + 1) % world)\n  wait ready[0]\n"])
    hi = expr(pick, "hi_e", pick("hi", ["2 * world - 2", "2 * world - 3", "2 * (world - 1)"]))
    c = pick("c", ["(rank - s) % world", "(rank + s) % world", "(rank - s + 1) % world"])
    pre = post = ""
    if pick("~c_state", [False, True]):    # the same block index as loop state (var, set)
        first, step = {"(rank - s) % world": ("rank", "-"), "(rank + s) % world": ("rank", "+"),
                       "(rank - s + 1) % world": ("(rank + 1) % world", "-")}[c]
        pre, post, c = f"  var cs = {first}\n", f"    set cs = (cs {step} 1) % world\n", "cs"
    wait = pick("wait", ["    if s > 0: wait got[s - 1]\n", "", "    if s > 1: wait got[s - 2]\n",
                         "    if s > 0: wait got[s]\n"])
    asyn = pick("~copy_async", [False, True])
    if asyn:
        order = pick("await_order", ["await_then_signal", "signal_then_await"])
        # the await sits in the block that posted (the else arm); the signal before or after it
        if order == "await_then_signal":
            copy = "on sdma async h: part[c]@next = part[c]\n      await h"
            sig = "    signal got[s]@next\n"
        else:
            copy = "on sdma async h: part[c]@next = part[c]\n      signal got[s]@next\n      await h"
            sig = "    if s < world - 1: signal got[s]@next\n"
    else:
        copy = pick("copy_engine", ["on sdma: part[c]@next = part[c]", "on aiv: part[c]@next = part[c]"])
        sig = pick("signal", ["    signal got[s]@next\n", "    if s > 0: signal got[s]@next\n"])
    last = pick("last", ["  if world > 1: wait got[2 * world - 3]\n", "",
                         "  if world > 1: wait got[2 * world - 4]\n"])
    # a reduce-scatter step: the DMA's atomic accumulate, or NCCL's recvReduceSend (a reduction of
    # two named regions into the next rank's copy; its mistake names the running rank's twice)
    if pick("~reduce_form", ["accumulate", "reduce_list"]) == "accumulate":
        reduce = "on aiv: part[c]@next op= part[c]"
    else:
        reduce = "on aiv: part[c]@next = op(part[c], " + pick("reduce_src", ["part[c]@next", "part[c]"]) + ")"
    return RING.format(name=name, next=nxt, entry=entry, hi=hi, c=c, wait=wait, copy=copy,
                       signal=sig, last=last, reduce=reduce, pre=pre, post=post)


def ring(pick) -> Spec:
    return Spec("ring", ring_text(pick, "fz"))


def pipelined(pick) -> Spec:
    """The pipelined ring AllGather: chunks of blocks (a split of a split), two async handles."""
    a0 = pick("await0", ["before_signal", "after_signal"])
    sig0 = "    signal got[s * 2]@next"
    aw0 = "    await h0"
    first = [aw0, sig0] if a0 == "before_signal" else [sig0, aw0]
    w1 = pick("wait1", ["    if s > 0: wait got[(s - 1) * 2 + 1]", "", "    if s > 0: wait got[(s - 1) * 2]"])
    seed_ = pick("seed", ["  on sdma: blk[rank] = x", "  on sdma async hs: blk[rank] = x\n  await hs",
                          "  on sdma async hs: blk[rank] = x\n  wait ready[0]\n  await hs"])
    wait_ready = "" if "wait ready" in seed_ else "  wait ready[0]\n"
    text = f"""\
schedule fz(x: sym T[n], out: sym T[n * world]) implements allgather(x -> out) {{
  flag ready[1]
  flag got[2 * world]
  blk = split(out, world)
  chunk = split(blk, 2)
  let next = (rank + 1) % world
  signal ready[0]@((rank - 1) % world)
{seed_}
{wait_ready}  for s in 0 .. {expr(pick, 'hi_e', 'world - 1')} {{
    let b = (rank - s) % world
    if s > 0: wait got[(s - 1) * 2]
    on sdma async h0: chunk[b][0]@next = chunk[b][0]
{w1}
    on sdma async h1: chunk[b][1]@next = chunk[b][1]
{chr(10).join(first)}
    await h1
    signal got[s * 2 + 1]@next
  }}
  if world > 1: for c in 0 .. 2: wait got[(world - 2) * 2 + c]
}}
"""
    return Spec("pipelined", text)


def broadcast(pick) -> Spec:
    lines = ["schedule fz(x: sym T[n], root: rank) implements broadcast(x, root) {",
             "  part = split(x, world)"]
    lines += pick("b1", [["  barrier"], []])
    cond = pick("cond", ["rank == root", "rank == 0", "rank != root"])
    lines.append(f"  if {cond}: on sdma: for p in peers: part[p]@p = part[p]")
    lines += pick("b2", [["  barrier"], []])
    skip = pick("skip", ["if p != root: ", ""])
    eng = pick("engine", ["sdma", "aiv"])
    lines.append(f"  on {eng}: for p in peers: {skip}part[rank]@p = part[rank]")
    lines += pick("b3", [["  barrier"], []])
    lines.append("}")
    return Spec("broadcast", "\n".join(lines) + "\n")


def reduce_(pick) -> Spec:
    lines = ["schedule fz(x: sym T[n], op: redop, root: rank) implements reduce(x, op, root) {"]
    lines += pick("b1", [["  barrier"], []])
    cond = pick("cond", ["rank == root", "rank == 0"])
    over = pick("over", ["ranks", "peers"])
    lines.append(f"  if {cond}: on aiv: x = op(x@p for p in {over})")
    lines += pick("b2", [["  barrier"], []])
    lines.append("}")
    return Spec("reduce", "\n".join(lines) + "\n")


def alltoall(pick) -> Spec:
    lines = ["schedule fz(x: sym T[n * world], out: sym T[n * world]) implements alltoall(x -> out) {",
             "  xb = split(x, world)", "  ob = split(out, world)"]
    lines += pick("b1", [["  barrier"], []])
    form = pick("form", ["ob[rank]@p = xb[p]", "ob[p]@p = xb[rank]", "ob[rank]@p = xb[rank]"])
    eng = pick("engine", ["sdma", "aiv"])
    lines.append(f"  on {eng}: for p in ranks: {form}")
    lines += pick("b2", [["  barrier"], []])
    lines.append("}")
    return Spec("alltoall", "\n".join(lines) + "\n")


def chunked(pick) -> Spec:
    """Two-shot over chunks whose count depends on the size: a step loop `for c in 0 .. 1 + n /
    4096` over a split of a split (the issue's size-dependent bound)."""
    k = "1 + n / 4096"
    hi = pick("hi", [k, "n / 4096", "1 + n / 8192"])
    idx = pick("idx", ["c", "c * 0", "(c + 1) % (" + k + ")"])
    text = f"""\
schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {{
  part = split(x, world)
  chunk = split(part, {expr(pick, 'k_e', k)})
  barrier
  for c in 0 .. {expr(pick, 'hi_e', k)} {{
    on aiv: chunk[rank][c] = op(chunk[rank][c]@p for p in ranks)
  }}
  barrier
  for c in 0 .. {hi} {{
    on sdma: for p in peers: chunk[rank][{idx}]@p = chunk[rank][{idx}]
  }}
  barrier
}}
"""
    return Spec("chunked", text)


def halving(pick) -> Spec:
    """Recursive halving and doubling: xor partners, shifts, log2, `requires world is pow2`."""
    req = pick("requires", ["  requires world is pow2\n", ""])
    d1 = pick("d1", ["world >> (k + 1)", "world >> k", "1 << k"])
    base = pick("base", ["p / d * d + j", "rank / d * d + j", "p / d * d"])
    w1 = pick("wait1", ["    if k > 0: wait got[k - 1]\n", ""])
    w2 = pick("wait2", ["    wait got[L + k - 1]\n", "    if k > 0: wait got[L + k - 1]\n"])
    last = pick("last", ["  if world > 1: wait got[2 * L - 1]\n", ""])
    eng = pick("engine", ["sdma", "aiv"])
    L = expr(pick, "L_e", "log2(world)")
    text = f"""\
schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {{
{req}  flag ready[world]
  flag got[2 * world]
  part = split(x, world)
  let L = {L}
  for k in 0 .. L: signal ready[k]@(rank ^ (world >> (k + 1)))
  for k in 0 .. L: wait ready[k]
  for k in 0 .. L {{
    let d = {d1}
    let p = rank ^ d
{w1}    on aiv: for j in 0 .. d: part[{base}]@p op= part[{base}]
    signal got[k]@p
  }}
  for k in 0 .. L {{
    let d = 1 << k
    let p = rank ^ d
{w2}    on {eng}: for j in 0 .. d: part[rank / d * d + j]@p = part[rank / d * d + j]
    signal got[L + k]@p
  }}
{last}}}
"""
    return Spec("halving", text)


def reduce_on_write(pick) -> Spec:
    """Atomic accumulates into the owner's slice (`op=`), then an SDMA all-gather."""
    b = [pick(f"b{i}", [["  barrier"], []]) for i in range(1, 5)]
    seed_ = pick("seed", ["  on aiv: os[rank] = xs[rank]", "", "  on aiv: os[rank] op= xs[rank]"])
    acc = pick("acc", ["for p in peers: os[p]@p op= xs[p]", "for p in ranks: os[p]@p op= xs[p]",
                       "for p in peers: os[p]@p = xs[p]"])
    lines = ["schedule fz(x: sym T[n], out: sym T[n], op: redop) implements allreduce(x -> out, op) {",
             "  xs = split(x, world)", "  os = split(out, world)", *b[0], seed_, *b[1],
             f"  on aiv: {acc}", *b[2], "  on sdma: for p in peers: os[rank]@p = os[rank]", *b[3], "}"]
    return Spec("reduce_on_write", "\n".join(x for x in lines if x) + "\n")


TEAM_SIZES = ["((world & -world) - 1 & 7) + 1", "1", "world", "2 - world % 2"]


def teams(pick) -> Spec:
    """The two-level AllReduce over a block team and the team across it."""
    T = pick("T", TEAM_SIZES)
    lane_decl = pick("lane", ["across(node)", "stride(T)"])
    b1 = pick("b1", ["barrier(node)", "", "barrier(lane)"])
    b2 = pick("b2", ["barrier(lane)", "", "barrier(node)", "barrier"])
    b3 = pick("b3", ["barrier(lane)", "", "barrier(node)"])
    b4 = pick("b4", ["barrier(node)", "", "barrier(lane)", "barrier"])
    me = pick("me", ["node.rank", "rank % T", "lane.rank"])
    text = f"""\
schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {{
  let T = {expr(pick, 'T_e', T)}
  team node = block(T)
  team lane = {lane_decl}
  part = split(x, node.size)
  chunk = split(part, lane.size)
  let me = {me}
  {b1}
  on aiv: part[me] = op(part[me]@p for p in node.ranks)
  {b2}
  on aiv: chunk[me][lane.rank] = op(chunk[me][lane.rank]@p for p in lane.ranks)
  on sdma: for p in lane.peers: chunk[me][lane.rank]@p = chunk[me][lane.rank]
  {b3}
  on {pick('engine', ['sdma', 'aiv'])}: for p in node.peers: part[me]@p = part[me]
  {b4}
}}
"""
    return Spec("teams", text)


def composed(pick) -> Spec:
    """The ring AllReduce (itself perturbed) called on the lane of a two-level AllReduce."""
    callee = ring_text(lambda n, o: pick("ring." + n, o), "ring_allreduce")
    T = pick("T", TEAM_SIZES)
    b1 = pick("b1", ["barrier(node)", "", "barrier"])
    b2 = pick("b2", ["barrier(node)", "", "barrier(lane)"])
    on = pick("on", ["lane", "node", "world"])
    region = pick("region", ["part[me]", "part[(me + 1) % node.size]", "x"])
    text = callee + f"""
schedule fz(x: sym T[n], op: redop) implements allreduce(x, op) {{
  let T = {expr(pick, 'T_e', T)}
  team node = block(T)
  team lane = across(node)
  part = split(x, node.size)
  let me = node.rank
  {b1}
  on aiv: part[me] = op(part[me]@p for p in node.ranks)
  call ring_allreduce({region}, op) on {on}
  on sdma: for p in node.peers: part[me]@p = part[me]
  {b2}
}}
"""
    return Spec("composed", text)


def fifo(pick) -> Spec:
    """The ring ReduceScatter through a FIFO of K slots (flags with rounds, credits back): the
    rounds, the credit and the slots' reuse are the choices."""
    K = pick("~K", ["2", "3"])
    # too few rounds: none at world 2, or one at every world (which front end cannot see)
    rounds = pick("rounds", [f"(world + {K} - 1) / {K}", f"(world - 2) / {K}", "(world - 1) / world + 1"])
    credit = pick("credit", [f"    if s >= {K}: wait free[s % {K}] round (s - {K}) / {K}\n", "",
                             f"    if s >= {K}: wait free[s % {K}] round s / {K}\n",
                             f"    if s >= {K}: wait free[(s + 1) % {K}] round (s - {K}) / {K}\n"])
    back = pick("back", [f"      signal free[(s - 1) % {K}]@prev round (s - 1) / {K}\n", "",
                         f"      signal free[(s - 1) % {K}]@prev round s / {K}\n"])
    full = pick("full", [f"s / {K}", "0", f"(s + 1) / {K}"])
    got = pick("got", [f"(s - 1) / {K}", f"s / {K}", "0"])
    last = pick("last", [f"(world - 2) / {K}", f"(world - 1) / {K}"])
    text = f"""\
schedule fz(x: T[n * world], out: T[n], op: redop) implements reducescatter(x -> out, op) {{
  flag ready[1]
  flag full[{K}] rounds {rounds}
  flag free[{K}] rounds {rounds}
  scratch fifo: sym T[{K} * n]
  slot = split(fifo, {K})
  xb = split(x, world)
  let next = (rank + 1) % world
  let prev = (rank - 1) % world
  signal ready[0]@prev
  wait ready[0]
  for s in 0 .. {expr(pick, 'hi_e', 'world - 1')} {{
    let c = (rank - s - 1) % world
{credit}    if s == 0 {{
      on aiv: slot[0]@next = xb[c]
    }} else {{
      wait full[(s - 1) % {K}] round {got}
      on aiv: slot[s % {K}]@next = op(slot[(s - 1) % {K}], xb[c])
{back}    }}
    signal full[s % {K}]@next round {full}
  }}
  if world > 1 {{
    wait full[(world - 2) % {K}] round {last}
    on aiv: out = op(slot[(world - 2) % {K}], xb[rank])
  }} else {{
    on aiv: out = x
  }}
}}
"""
    return Spec("fifo", text)


def moe_prefill(pick) -> Spec:
    b1 = pick("b1", ["  barrier", ""])
    b2 = pick("b2", ["  barrier", ""])
    b3 = pick("b3", ["  barrier", ""])
    peers = pick("peers", ["peers", "ranks"])
    place_eng = pick("place_engine", ["aiv", "sdma"])
    fuse = pick("fuse", [False, True])
    exscan = "  on aiv: offs = exscan(counts)\n"
    place = f"  on {place_eng}: win = place(x, ids, offs)\n"
    if fuse:   # exscan and place in one stage: place reads offs while exscan writes them
        body = "  on aiv {\n    offs = exscan(counts)\n    win = place(x, ids, offs)\n  }\n"
    else:
        body = exscan + place
    cb1 = pick("cb1", ["  barrier", ""])
    cb2 = pick("cb2", ["  barrier", ""])
    text = f"""\
schedule fz_dispatch(x: sym T[tokens, hidden], ids: i32[tokens, topk],
                     counts: sym i32[world, experts],
                     win: sym T[world * tokens * topk, hidden])
    implements moe_dispatch(x, ids -> win, counts) {{
  scratch offs: i32[experts]
  mine = split(counts, world)
  on aiv: mine[rank] = histogram(ids)
{b1}
  on aiv: for p in {peers}: mine[rank]@p = mine[rank]
{b2}
{body}{b3}
}}

schedule fz_combine(win: sym T[world * tokens * topk, hidden], ids: i32[tokens, topk],
                    weights: f32[tokens, topk], counts: sym i32[world, experts],
                    y: T[tokens, hidden])
    implements moe_combine(win, ids, weights, counts -> y) {{
  scratch offs: i32[experts]
  on aiv: offs = exscan(counts)
{cb1}
  on aiv: y = gather(win, ids, weights, offs)
{cb2}
}}
"""
    return Spec("moe_prefill", text)


def moe_decode(pick) -> Spec:
    sig = pick("signal", ["  for p in peers: signal ready[rank]@p", "",
                          "  for p in peers: signal ready[p]@p"])
    wt = pick("wait", ["  for p in peers: wait ready[p]", ""])
    split_stage = pick("split_stage", [False, True])
    if split_stage:   # the count row and slots in the first stage, place in a stage of its own
        first = "  on aiv {\n    mine[rank] = histogram(ids)\n    offs = slots(capacity)\n  }\n" \
                "  on aiv: for p in peers: mine[rank]@p = mine[rank]\n  on aiv: win = place(x, ids, offs)\n"
    else:
        first = "  on aiv {\n    mine[rank] = histogram(ids)\n    offs = slots(capacity)\n  }\n" \
                "  on aiv {\n    for p in peers: mine[rank]@p = mine[rank]\n    win = place(x, ids, offs)\n  }\n"
    cw = pick("cwait", ["  for p in peers: wait done[p]", ""])
    cb = pick("cb", ["  barrier", ""])
    text = f"""\
schedule fz_dispatch(x: sym T[tokens, hidden], ids: i32[tokens, topk],
                     counts: sym i32[world, experts],
                     win: sym T[experts * capacity, hidden])
    implements moe_dispatch(x, ids -> win, counts, capacity) {{
  flag ready[world]
  scratch offs: i32[experts]
  mine = split(counts, world)
{first}{sig}
{wt}
}}

schedule fz_combine(win: sym T[experts * capacity, hidden], ids: i32[tokens, topk],
                    weights: f32[tokens, topk], counts: sym i32[world, experts],
                    y: T[tokens, hidden])
    implements moe_combine(win, ids, weights, counts -> y, capacity) {{
  flag done[world]
  scratch offs: i32[experts]
  on aiv: offs = slots(capacity)
  for p in peers: signal done[rank]@p
{cw}
  on aiv: y = gather(win, ids, weights, offs)
{cb}
}}
"""
    return Spec("moe_decode", text)


FAMILIES = {f.__name__.rstrip("_"): f for f in
            (twoshot, oneshot, reducescatter, allgather, ring, pipelined, broadcast, reduce_, alltoall,
             chunked, halving, reduce_on_write, teams, composed, fifo, moe_prefill, moe_decode)}


def build(family: str, pick) -> Spec:
    spec = FAMILIES[family](pick)
    spec.family = family
    spec.choices = dict(pick.taken)
    return spec


def replay(family: str, choices: dict[str, int]) -> Spec:
    return build(family, Picker(fixed=choices))


@st.composite
def schedules(draw, families: list[str] | None = None) -> Spec:
    family = draw(st.sampled_from(sorted(families or FAMILIES)), label="family")
    return build(family, Picker(draw))
