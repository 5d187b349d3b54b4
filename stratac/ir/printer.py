"""The schedule IR as text (`stratac compile --dump-ir`), so that tests can state it as a golden."""

from __future__ import annotations

from stratac.diagnostics import Span
from stratac.ir.expr import Const, Var, bare
from stratac.ir.nodes import (
    Accumulate,
    Await,
    Barrier,
    Copy,
    Domain,
    If,
    Local,
    Loop,
    Node,
    Reduce,
    ReduceList,
    Route,
    Schedule,
    Set,
    Signal,
    Stage,
    Wait,
)


def dump(s: Schedule) -> str:
    params = ", ".join([f"{p.name}: {'sym ' if p.symmetric else ''}{p.type_text}[{p.shape_text}]"
                        for p in s.tensors] + [f"{x.name}: {x.kind.value}" for x in s.scalars])
    out = [f"schedule {s.name}({params}) implements {s.contract}"]
    if s.sizes:
        out.append(f"  sizes {', '.join(s.sizes)}")
    for p in s.scratch:
        out.append(f"  scratch {p.name}: {'sym ' if p.symmetric else ''}{p.type_text}[{p.shape_text}]")
    for r in s.requires:
        out.append(f"  requires {r.text}  # {bare(r.cond)}")
    for tm in s.teams:
        out.append(f"  team {tm}  # member i = {bare(tm.member(Var('i')))}, rank {bare(tm.index)} "
                   f"of {bare(tm.size)}")
    for f in s.flags:
        rounds = "" if f.rounds == Const(1) else f" rounds {f.rounds}"
        out.append(f"  flag {f.name}[{f.size}]{rounds} seq={f.seq}")
    starts = {c.start: c for c in s.calls if c.end > c.start}
    depth = 1
    for i, op in enumerate(s.body):
        c = starts.get(i)
        if c is not None:
            where = "every rank" if c.team is None else f"the members of {c.team}"
            out.append(f"  {c}:{_line(c.span)} inlined on {where}, names {c.prefix}*")
            for r in c.requires:
                out.append(f"    requires {r.text}  # {bare(r.cond)}, checked per world")
            depth = 2
        _dump_op(op, depth, out)
        if depth == 2 and any(c.end == i + 1 for c in starts.values()):
            depth = 1
    if s.sync_expr is not None:
        out.append(f"  # {bare(s.sync_expr)} flag stamps per call")
    elif s.sync_ops:
        out.append(f"  # {s.sync_ops} flag stamps per call")
    if s.kernel:
        k = s.kernel
        route = (f" + {k.route_bytes} B routing" if k.route_bytes else "") + (
            f" + {k.mask_bytes} B mask" if k.mask_bytes else "")
        out.append(f"  # UB per core: {k.copy_tiles} copy + {k.reduce_tiles} reduce tiles x "
                   f"{k.tile_bytes} B + {k.scratch_bytes} B scratch{route} = {k.ub_bytes} B; "
                   f"{k.cores} cores ({k.soc})")
    return "\n".join(out) + "\n"


def _round(op: Signal | Wait) -> str:
    return "" if op.round == Const(0) else f" round {op.round}"


def _line(span: Span) -> str:
    return f"  # line {span.line}"


def _dump_op(op: Node, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(op, Stage):
        plan = ""
        if op.plan:
            p = op.plan
            used = [name for name, on in (("aiv-copy", p.copies_on_aiv), ("sdma-copy", p.copies_on_sdma),
                                          ("aiv-reduce", p.reduces), ("routing", p.routes)) if on]
            plan = f" [{' '.join(used)}" + (f" sdma>={p.sdma_threshold}B]" if p.copies_on_aiv and
                                              p.copies_on_sdma else "]")
        post = f" async {op.handle}" if op.handle else ""
        out.append(f"{pad}stage {op.index} on {op.engine.value}{post}{plan}:{_line(op.span)}")
        for inner in op.body:
            _dump_op(inner, depth + 1, out)
    elif isinstance(op, Loop):
        out.append(f"{pad}for {op.head}:{_line(op.span)}")
        for inner in op.body:
            _dump_op(inner, depth + 1, out)
    elif isinstance(op, Copy):
        out.append(f"{pad}{op.dst} = {op.src}{_line(op.span)}")
    elif isinstance(op, Reduce):
        dom = op.domain.value if op.count is None else (
            f"0 .. {bare(op.count)}" + (f" but {bare(op.skip)}" if op.domain is Domain.PEERS else ""))
        out.append(f"{pad}{op.dst} = {op.op.value}({op.src} for {op.var} in {dom})"
                   f"{_line(op.span)}")
    elif isinstance(op, ReduceList):
        out.append(f"{pad}{op.dst} = {op.op.value}({', '.join(map(str, op.srcs))}){_line(op.span)}")
    elif isinstance(op, Accumulate):
        out.append(f"{pad}{op.dst} {op.op.value}= {op.src}{_line(op.span)}")
    elif isinstance(op, Route):
        joined = "  [in the pass of the place above]" if op.joined else ""
        out.append(f"{pad}{op}{joined}{_line(op.span)}")
    elif isinstance(op, If):
        out.append(f"{pad}if {op.cond}:{_line(op.span)}")
        for inner in op.then:
            _dump_op(inner, depth + 1, out)
        if op.orelse:
            out.append(f"{pad}else:")
            for inner in op.orelse:
                _dump_op(inner, depth + 1, out)
    elif isinstance(op, Barrier):
        team = f"({op.team.name})" if op.team else ""
        out.append(f"{pad}barrier{team} seq={bare(op.seq)}{_line(op.span)}")
    elif isinstance(op, Signal):
        out.append(f"{pad}signal {op.flag}[{op.index}]@{op.rank}{_round(op)}{_line(op.span)}")
    elif isinstance(op, Wait):
        out.append(f"{pad}wait {op.flag}[{op.index}]{_round(op)}{_line(op.span)}")
    elif isinstance(op, Await):
        out.append(f"{pad}await {op.handle}{_line(op.span)}")
    elif isinstance(op, Local):
        subst = "  [substituted where used; a name in the kernel]" if op.inline else ""
        size = "" if op.size is None else f"[{bare(op.size)}]"
        out.append(f"{pad}{'var' if op.mutable else 'let'} {op.name}{size} = {bare(op.value)}{subst}"
                   f"{_line(op.span)}")
    elif isinstance(op, Set):
        index = "" if op.index is None else f"[{bare(op.index)}]"
        out.append(f"{pad}set {op.name}{index} = {bare(op.value)}{_line(op.span)}")
    else:  # pragma: no cover - the IR has no other node kinds
        raise TypeError(op)
