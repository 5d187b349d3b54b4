"""Code generation: IR ready for a target -> kernel.cpp, launch.cpp, CMakeLists.txt, manifest.json.

Python turns the IR into plain template data (C expressions as strings, statements as dicts);
the jinja2 templates in templates/ own the text. StrictUndefined: a missing value is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2

from stratac import ir
from stratac.codegen import abi
from stratac.ir.passes import routes as passes_routes
from stratac.ir.passes import stages as passes_stages
from stratac.resources import resource_dir

GENERATOR = "stratac"


@dataclass(frozen=True)
class Output:
    schedule: ir.Schedule
    files: dict[str, str]          # file name -> text


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)


def _cname(name: str) -> str:
    return "rank" if name == "rank" else "world" if name == "world" else f"{name}_"


class _Names(dict):
    def __missing__(self, key):
        return _cname(key)


_C = _Names()


def c(e: ir.IExpr) -> str:
    return ir.c_source(e, _C)


def _region(r: ir.Region, s: ir.Schedule) -> dict:
    """A region in elements of the kernel's type T: a buffer of a fixed element type (counts,
    ids) is seen as T elements, since copies move bytes."""
    base, lo, n = _cname(r.buffer), c(r.lo), c(r.length)
    d = s.param(r.buffer).dtype
    if d is not None:
        ratio = f"strata::Ratio<{d.ctype}, T>()"
        base, lo, n = f"strata::Reinterpret<T>({base})", f"{lo} * {ratio}", f"{n} * {ratio}"
    return {"base": base, "lo": lo, "len": n, "pe": c(r.rank) if r.rank is not None else "rank"}


def _route(op: ir.Route, engine: ir.Engine, s: ir.Schedule) -> dict:
    K = ir.RouteKind
    role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
    dst = f"{_cname(op.dst.buffer)} + {c(op.dst.lo)}"
    n = c(op.dst.length)
    if op.kind is K.HISTOGRAM:
        call = f"rt_.Histogram({dst}, {_cname(role['ids'])}, {c(s.param(role['ids']).size)}, {n})"
    elif op.kind is K.EXSCAN:
        call = f"rt_.Exscan({dst}, {_cname(role['counts'])}, {n}, rank, world)"
    elif op.kind is K.SLOTS:
        call = f"rt_.Slots({dst}, {n}, {c(op.capacity)}, rank, world)"
    else:
        ids = s.param(role["ids"])
        tokens, topk = (c(d) for d in (ids.dims + (ir.Const(1),))[:2])   # [tokens, topk] or [tokens]
        win = s.param(op.dst.buffer if op.kind is K.PLACE else role["win"])
        rows, hidden = (c(d) for d in win.dims)
        experts = c(s.param(role["offs"]).size)
        if op.kind is K.PLACE:
            via = {ir.Engine.AIV: "kAiv", ir.Engine.SDMA: "kSdma", ir.Engine.AUTO: "kAuto"}[engine]
            call = (f"rt_.Place(mv_, strata::Via::{via}, {_cname(win.name)}, {rows}, "
                    f"{_cname(role['x'])}, {_cname(ids.name)}, {_cname(role['offs'])}, {tokens}, "
                    f"{topk}, {hidden}, {experts}, rank, world, kSdmaThreshold)")
        else:
            call = (f"rt_.Gather({_cname(op.dst.buffer)}, {_cname(win.name)}, {rows}, {_cname(ids.name)}, "
                    f"{_cname(role['weights'])}, {_cname(role['offs'])}, {tokens}, {topk}, {hidden}, "
                    f"{experts}, world)")
    return {"kind": "route", "line": op.span.line, "call": call}


def _red(op: ir.Op) -> str:
    """A reduction as C++: a strata::Red constant, or the kernel's OP template parameter."""
    if isinstance(op, ir.OpParam):
        return "OP"
    return "strata::Red::" + {ir.ReduceOp.SUM: "kSum", ir.ReduceOp.MAX: "kMax",
                              ir.ReduceOp.MIN: "kMin"}[op]


def _node(op, engine: ir.Engine, s: ir.Schedule) -> dict:
    if isinstance(op, ir.Loop):
        return {"kind": "loop", "var": _cname(op.var), "peers": op.domain is ir.Domain.PEERS,
                "line": op.span.line, "body": [_node(o, engine, s) for o in op.body]}
    if isinstance(op, ir.If):
        return {"kind": "if", "line": op.span.line, "cond": c(op.cond),
                "then": [_node(o, engine, s) for o in op.then],
                "orelse": [_node(o, engine, s) for o in op.orelse]}
    if isinstance(op, ir.Route):
        return _route(op, engine, s)
    if isinstance(op, ir.Copy):
        via = {ir.Engine.AIV: "kAiv", ir.Engine.SDMA: "kSdma", ir.Engine.AUTO: "kAuto"}[engine]
        return {"kind": "copy", "line": op.span.line, "via": via, "dst": _region(op.dst, s),
                "src": _region(op.src, s)}
    if isinstance(op, ir.Accumulate):
        return {"kind": "accumulate", "line": op.span.line, "op": _red(op.op), "dst": _region(op.dst, s),
                "src": _region(op.src, s)}
    return {"kind": "reduce", "line": op.span.line, "op": _red(op.op), "var": _cname(op.var),
            "peers": op.domain is ir.Domain.PEERS, "dst": _region(op.dst, s), "src": _region(op.src, s)}


def _flag_bases(s: ir.Schedule) -> dict[str, str]:
    """Offsets of each flag in the sync area (int32 slots): barrier slots [0, world) first."""
    bases, offset = {}, ir.Var("world")
    for f in s.flags:
        bases[f.name] = c(offset)
        offset = ir.add(offset, f.size)
    return bases


def _statements(s: ir.Schedule) -> list[dict]:
    flags = {f.name: f for f in s.flags}
    bases = _flag_bases(s)

    def sync_node(op) -> dict:
        if isinstance(op, ir.If):
            return {"kind": "if", "line": op.span.line, "cond": c(op.cond),
                    "then": [sync_node(o) for o in op.then],
                    "orelse": [sync_node(o) for o in op.orelse]}
        if isinstance(op, ir.Loop):
            return {"kind": "loop", "var": _cname(op.var), "peers": op.domain is ir.Domain.PEERS,
                    "line": op.span.line, "body": [sync_node(o) for o in op.body]}
        f = flags[op.flag]
        slot = f"sync_ + {bases[op.flag]} + {c(op.index)}"
        if isinstance(op, ir.Signal):
            return {"kind": "signal", "line": op.span.line, "slot": slot, "seq": f.seq, "pe": c(op.rank)}
        return {"kind": "wait", "line": op.span.line, "slot": slot, "seq": f.seq}

    def is_control(op) -> bool:
        """Signals and waits, possibly under loops and ifs, and nothing else."""
        if isinstance(op, (ir.Signal, ir.Wait)):
            return True
        if isinstance(op, ir.Loop):
            return all(is_control(o) for o in op.body)
        if isinstance(op, ir.If):
            return all(is_control(o) for o in op.then + op.orelse)
        return False

    def top(ops) -> list[dict]:
        out: list[dict] = []
        for op in ops:
            if isinstance(op, ir.Barrier):
                out.append({"kind": "barrier", "line": op.span.line, "seq": op.seq})
            elif isinstance(op, ir.Stage):
                out.append({"kind": "stage", "line": op.span.line, "index": op.index,
                            "engine": op.engine.value, "body": [_node(o, op.engine, s) for o in op.body]})
            elif is_control(op):
                node = sync_node(op)
                if out and out[-1]["kind"] == "control":
                    out[-1]["body"].append(node)
                else:
                    out.append({"kind": "control", "line": op.span.line, "body": [node]})
            else:  # an if around stages or barriers: every core of the rank takes the same arm
                out.append({"kind": "if", "line": op.span.line, "cond": c(op.cond),
                            "then": top(op.then), "orelse": top(op.orelse)})
        return out

    return top(s.body)


def manifest(s: ir.Schedule) -> dict:
    k = s.kernel
    assert k is not None, "run the pass pipeline before code generation"
    return {
        "generator": GENERATOR,
        "schedule": s.name,
        "source": Path(s.source_name).name,
        "contract": str(s.contract),
        "launcher": abi.launcher_name(s),
        "args": [{"name": a.name, "ctype": a.ctype, "role": a.role} for a in abi.args(s)],
        "kernels": [{"dtype": d.short, "op": op.value if op else None,
                     "name": abi.kernel_name(s, d, op)} for d in abi.dtypes(s) for op in abi.ops(s)],
        "params": [{"name": p.name, "dtype": p.dtype.short if p.dtype else None,
                    "typevar": p.typevar, "symmetric": p.symmetric, "size": str(p.size)}
                   for p in s.tensors],
        "scratch": [{"name": p.name, "dtype": p.dtype.short if p.dtype else None,
                     "typevar": p.typevar, "symmetric": p.symmetric, "size": str(p.size)}
                    for p in s.scratch],
        "scalars": [{"name": x.name, "kind": x.kind.value} for x in s.scalars],
        "sizes": list(s.sizes),
        "flags": {"barrier_slots": "world",
                  "named": [{"name": f.name, "size": str(f.size), "seq": f.seq} for f in s.flags],
                  "stamps_per_call": s.sync_ops},
        "ub_bytes_per_core": k.ub_bytes,
        "tile_bytes": k.tile_bytes,
        "cores": k.cores,
        "soc": k.soc,
        "stages": [{"index": op.index, "engine": op.engine.value, "line": op.span.line}
                   for op in passes_stages(s.body)],
        "kernel_type": "KERNEL_TYPE_MIX_AIV_1_0",
    }


def generate(s: ir.Schedule) -> Output:
    k = s.kernel
    assert k is not None, "run the pass pipeline before code generation"
    env = _env()
    rs = passes_routes(s)
    src = Path(s.source_name).name
    ctx = {
        "s": s,
        "source": src,
        "name": s.name,
        "kernel_class": "".join(w.capitalize() for w in s.name.split("_")),
        "kernels": [{"dtype": d.short, "ctype": d.ctype, "code": d.code,
                     "op": op.value if op else None,
                     "op_code": abi.OPS.index(op) if op else None,
                     "red": _red(op) if op else "strata::Red::kSum",
                     "name": abi.kernel_name(s, d, op)} for d in abi.dtypes(s) for op in abi.ops(s)],
        "has_op": s.op_param is not None,
        "ranks": [{"name": x.name, "c": _cname(x.name)} for x in s.rank_params],
        "kernel_args": abi.kernel_args(s),
        "launcher_args": abi.args(s),
        "launcher": abi.launcher_name(s),
        "prototype": abi.c_prototype(s),
        "tensors": [{"name": p.name, "c": _cname(p.name), "ctype": p.dtype.ctype if p.dtype else "T"}
                    for p in s.tensors + s.scratch],
        "routes": bool(rs),
        "gather": any(r.kind is ir.RouteKind.GATHER for r in rs),
        "sizes": [{"name": n, "c": _cname(n)} for n in s.sizes],
        "plan": k,
        "statements": _statements(s),
        "sdma_threshold": next((op.plan.sdma_threshold for op in passes_stages(s.body)), 0),
        "contract": str(s.contract),
    }
    files = {
        "kernel.cpp": env.get_template("kernel.cpp.j2").render(ctx),
        "launch.cpp": env.get_template("launch.cpp.j2").render(ctx),
        "CMakeLists.txt": env.get_template("CMakeLists.txt.j2").render(ctx),
        "manifest.json": json.dumps(manifest(s), indent=2) + "\n",
    }
    return Output(s, files)


def write(out: Output, directory: Path) -> Path:
    """Writes the files under directory/<schedule>/ atomically, file by file."""
    target = directory / out.schedule.name
    target.mkdir(parents=True, exist_ok=True)
    for name, text in out.files.items():
        tmp = target / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target / name)
    return target
