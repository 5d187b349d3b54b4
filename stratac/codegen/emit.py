"""Code generation: IR ready for a target -> kernel.cpp, launch.cpp, CMakeLists.txt, manifest.json.

Python turns the IR into plain template data (C expressions as strings, statements as dicts);
the jinja2 templates in templates/ own the text. StrictUndefined: a missing value is an error.

Every C++ expression a kernel contains is printed by one printer, `ir.c_source`, which
parenthesizes by C++ precedence: the emitter hands the templates whole expressions (a loop's
condition, a pointer plus its offset, a stamp), and the templates write no operator next to one
(tests/codegen/test_templates.py keeps it so). C++ text that is not an IR expression (a pointer, a
call of the device library) enters an expression as a `_cpp` term, which binds like a name.
"""

from __future__ import annotations

import functools
import json
import re
from collections import ChainMap
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from stratac import ir
from stratac.codegen import abi
from stratac.ir import control
from stratac.ir.passes import routes as passes_routes
from stratac.ir.passes import stages as passes_stages
from stratac.resources import resource_dir

GENERATOR = "stratac"


@dataclass(frozen=True)
class Output:
    schedule: ir.Schedule
    files: dict[str, str]          # file name -> text


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    """One environment per process: jinja2 compiles a template once per environment (a fresh one
    per schedule spent a quarter of a second of every compile on parsing the templates again)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)


def _cname(name: str) -> str:
    if name == ir.ELEM:   # the element size of the kernel's type T, as every other integer an int64_t
        return "int64_t(sizeof(T))"
    return "rank" if name == "rank" else "world" if name == "world" else f"{abi.c_name(name)}_"


class _Names(dict):
    def __missing__(self, key):
        return key[1:] if key.startswith(_CPP) else _cname(key)


_CPP = "\1"        # the name of a `_cpp` term starts with it (no IR name, no team key does)
_HEAD = re.compile(r"[A-Za-z_][\w:]*(?:<[\w:, *]*>)?")     # a name or a template-id


def _cpp(text: str) -> ir.Var:
    """C++ text as a term of an IR expression, printed as it is: a name, or a call (or a cast),
    which binds like one; anything else would need the printer's parentheses."""
    m = _HEAD.match(text)
    assert m and _one_group(text[m.end():]), f"{text!r} does not bind like a name"
    return ir.Var(_CPP + text)


def _one_group(tail: str) -> bool:
    """Whether tail is empty or one bracketed group, `(a, b)` (not `(a) + (b)`)."""
    depth = 0
    for i, ch in enumerate(tail):
        depth += ch in "({"
        depth -= ch in ")}"
        if depth <= 0 and (i != len(tail) - 1 or depth < 0):
            return False
    return depth == 0 and (not tail or tail[0] in "({")


_C = _Names()


# ---- teams: a kernel computes each team once (strata::Team members set in Init), and its
# expressions read them: `node_.size`, `node_.rank`, `node_.base + p_` rather than the expression
# of rank and world each stands for, written out wherever it occurs.

@dataclass
class _Teams:
    table: dict[ir.IExpr, ir.Var] = field(default_factory=dict)   # a team's value -> its name
    names: dict[str, str] = field(default_factory=dict)           # that name -> its C++
    owner: dict[str, str] = field(default_factory=dict)           # that name -> its team
    used: set[str] = field(default_factory=set)                   # the teams an expression named


_TEAMS: ContextVar[_Teams] = ContextVar("teams", default=_Teams())


# ---- lets: a let is substituted in the IR (the verifier reads the expressions whole), and the
# kernel names it again: its ir.Local declares `const int64_t name_ = value;` where the let stands,
# and an expression after it in its block prints the name where it holds the value. A declaration
# no expression came to use is dropped (_drop_unused).

@dataclass
class _Lets:
    # a let's value -> its name and its declaration's number
    table: dict[ir.IExpr, tuple[ir.Var, int]] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)      # the declarations an expression named
    count: int = 0


_LETS: ContextVar[_Lets] = ContextVar("lets", default=_Lets())
# the source of the schedule being generated: a statement inlined from an imported file says which
_SOURCE: ContextVar[object] = ContextVar("source", default=None)


def _at(span) -> dict:
    """A statement's source line: `line` for STRATA_LINE, `at` for the `// strata:` comment (the
    line, and the file's name when it is another file's: an imported callee's)."""
    other = span.source.name != getattr(_SOURCE.get(), "name", span.source.name)
    return {"line": span.line, "at": f"{span.line} ({Path(span.source.name).name})" if other else str(span.line)}


def _named(e: ir.IExpr) -> ir.IExpr:
    """e (simplified) with every subexpression that is a let's value in scope or a team's value
    replaced by its name, bottom up, so that `rank % T` becomes `node.rank` once T has become
    `node.size`."""
    teams, lets = _TEAMS.get(), _LETS.get()
    if not teams.table and not lets.table:
        return e

    def find(x: ir.IExpr) -> ir.Var | None:
        let = lets.table.get(x)
        if let is not None:
            lets.used.add(let[1])
            return let[0]
        got = teams.table.get(x)
        if got is not None:
            teams.used.add(teams.owner[got.name])
        return got

    def walk(x: ir.IExpr) -> ir.IExpr:
        got = find(x)                            # the largest match first: `node.base`, not
        if got is None and isinstance(x, ir.Bin):    # `lane.rank * node.size`
            x = ir.Bin(x.kind, walk(x.lhs), walk(x.rhs))
            got = find(x)
        elif got is None and isinstance(x, ir.Sel):
            x = ir.Sel(walk(x.cond), walk(x.then), walk(x.orelse))
        elif got is None and isinstance(x, ir.Elem):
            x = ir.Elem(x.name, walk(x.index))
        return x if got is None else got

    return walk(e)


def _names() -> ChainMap:
    return ChainMap(_TEAMS.get().names, _C)


def c(e: ir.IExpr) -> str:
    """An IR expression as C++ (simplified first: constant terms folded, + 0 and * 1 dropped; a
    team's size, place, base and step by name)."""
    return ir.c_source(_named(ir.simplify(e)), _names())


def _argument(e: ir.IExpr) -> str:
    """An expression as a function's argument or an assignment's value: c(e) without the
    parentheses around a whole conditional (a comma and `=` bind looser than `?:`)."""
    text = c(e)
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[1:-1] if i == len(text) - 1 and text[0] == "(" else text
    return text


def _team_members(s: ir.Schedule) -> list[dict]:
    """Fills the current _Teams with the schedule's teams, and returns for each team the call of
    Init that computes it (`block(T)` is strata::BlockTeam(rank, T), `stride(T)`
    strata::StrideTeam(rank, world, T), `groups(...)` strata::GroupTeam(rank, first, size) with
    the running rank's group's first rank and size, T written with the names of the teams before
    it) and the
    teams that call names."""
    teams, members = _TEAMS.get(), []
    for team in s.teams:
        before = set(teams.used)
        if team.kind == "groups":
            call = f"strata::GroupTeam(rank, {_argument(team.base)}, {_argument(team.size)})"
        else:
            t_text = c(team.t)
            call = (f"strata::BlockTeam(rank, {t_text})" if team.kind == "block"
                    else f"strata::StrideTeam(rank, world, {t_text})")
        members.append({"name": team.name, "c": _cname(team.name), "call": call,
                        **_at(team.span), "kind": team.kind, "deps": teams.used - before})
        teams.used = before
        for attr in ("size", "index", "base", "step"):
            raw = ir.simplify(getattr(team, attr))
            value = _named(raw)
            if isinstance(value, (ir.Const, ir.Var)) or value in teams.table:
                continue       # a literal or a name already reads as itself
            key = f"\0{team.name}.{attr}"
            teams.table[value] = teams.table[raw] = ir.Var(key)    # as written, and with names
            teams.names[key] = f"{_cname(team.name)}.{'rank' if attr == 'index' else attr}"
            teams.owner[key] = team.name
    return members


def _used_teams(members: list[dict]) -> list[dict]:
    """The members the kernel's expressions name, and the ones their own calls name."""
    need = set(_TEAMS.get().used)
    for m in reversed(members):
        if m["name"] in need:
            need |= m["deps"]
    return [m for m in members if m["name"] in need]


def _addends(e: ir.IExpr) -> list[ir.IExpr]:
    if isinstance(e, ir.Bin) and e.kind is ir.BinKind.ADD:
        return _addends(e.lhs) + _addends(e.rhs)
    return [] if e == ir.Const(0) else [e]


def _chain(*terms: str | ir.IExpr) -> str:
    """`a + b + c` as C++: a pointer (or any int64_t) plus offsets, in the order given. A term is
    C++ text that binds like a name (a pointer, a local, a call) or an IR expression, whose
    addends join the chain (offsets are never negative, so any grouping gives the same address)
    and whose zeros are dropped."""
    flat: list[ir.IExpr] = []
    for t in terms:
        flat += [_cpp(t)] if isinstance(t, str) else _addends(ir.simplify(t))
    e: ir.IExpr = ir.Const(0)
    for t in flat:
        e = t if e == ir.Const(0) else ir.Bin(ir.BinKind.ADD, e, t)
    return ir.c_source(_named(e), _names())


def _part_helpers() -> dict:
    """The bodies of PartOffset(total, parts, i) and PartLength(total, parts, i), which a kernel
    defines when its regions are parts of uneven splits (`part = split(x, k)` in the source): made
    from ir.split_part, the definition the verifier checks."""
    lo, n = ir.split_part(ir.Var("total"), ir.Var("parts"), ir.Var("i"))
    names = {"total": "total", "parts": "parts", "i": "i"}
    return {"offset": ir.c_source(lo, names), "length": ir.c_source(n, names)}


def _has_min(e: ir.IExpr) -> bool:
    return isinstance(e, ir.Bin) and (e.kind is ir.BinKind.MIN or _has_min(e.lhs) or _has_min(e.rhs))


def _part_calls(r: ir.Region, s: ir.Schedule) -> tuple[ir.IExpr, ir.IExpr] | None:
    """(offset, length) of a part of a split, or of a chunk of such a part (`chunk[i][c]` of
    `chunk = split(part, k)`), in PartOffset/PartLength calls, when the split is uneven (an even
    split, e.g. of n * world elements into world parts, simplifies to rank * n and n, which read
    better as they are) and the region is exactly that part or chunk."""
    if r.part is None or (r.sub is not None and r.sub[0] != "chunk"):
        return None
    index, parts = r.part
    size = s.param(r.buffer).size
    lo, n = ir.split_part(size, parts, index)
    args = f"{c(size)}, {c(parts)}, {c(index)}"
    offset, length = _cpp(f"PartOffset({args})"), _cpp(f"PartLength({args})")
    if r.sub is not None:
        _, chunk, chunks, _ = r.sub
        chunk_lo, n = ir.split_part(n, chunks, chunk)
        lo = ir.simplify(ir.add(lo, chunk_lo))
        args = f"{c(length)}, {c(chunks)}, {c(chunk)}"
        offset = ir.Bin(ir.BinKind.ADD, offset, _cpp(f"PartOffset({args})"))
        length = _cpp(f"PartLength({args})")
    if (lo, n) != (ir.simplify(r.lo), ir.simplify(r.length)) or not _has_min(lo):
        return None
    return offset, length


def _offset(r: ir.Region, s: ir.Schedule) -> ir.IExpr:
    """A region's first element, in elements of its buffer: in PartOffset calls or as the IR has it."""
    part = _part_calls(r, s)
    return part[0] if part else ir.simplify(r.lo)


def _length(r: ir.Region, s: ir.Schedule) -> str:
    """A region's length in elements of the kernel's type T (a buffer of a fixed element type,
    counts or ids, is seen as T elements, since copies move bytes)."""
    part = _part_calls(r, s)
    length = part[1] if part else r.length
    d = s.param(r.buffer).dtype
    if d is not None:
        length = ir.Bin(ir.BinKind.MUL, length, _cpp(f"strata::Ratio<{d.ctype}, T>()"))
    return c(length)


def _compound(off: ir.IExpr) -> bool:
    """Whether an offset is more than a name: an operation or a call."""
    return isinstance(off, (ir.Bin, ir.Sel)) or (isinstance(off, ir.Var) and off.name.startswith(_CPP))


def _moves(op, s: ir.Schedule) -> dict:
    """The regions of a copy, accumulate or reduce: each side's pointer (its buffer plus its offset,
    as T*) and rank, and the locals the move declares. An offset every side shares, if it is more
    than a name, is computed once, into `lo`. `src` is the first source, `srcs` all of them."""
    regions = (op.dst, *ir.sources(op))
    offsets = [_offset(r, s) for r in regions]
    local = []
    if all(o == offsets[0] for o in offsets) and _compound(offsets[0]):
        local = [{"name": "lo", "value": c(offsets[0])}]
        offsets = [_cpp("lo")] * len(offsets)

    def side(r: ir.Region, off: ir.IExpr) -> dict:
        # ptr: the region's first element (a reduce reads element off + t of it, strata::At);
        # at: the first element of this core's cut (copies and accumulates)
        ptr, at = _chain(_cname(r.buffer), off), _chain(_cname(r.buffer), off, "off")
        if s.param(r.buffer).dtype is not None:
            ptr = f"strata::Reinterpret<T>({ptr})"
            at = _chain(ptr, "off")
        return {"ptr": ptr, "at": at, "pe": _argument(r.rank) if r.rank is not None else "rank"}

    sides = [side(r, o) for r, o in zip(regions, offsets)]
    return {**_at(op.span), "len": _length(op.dst, s), "locals": local,
            "dst": sides[0], "src": sides[1], "srcs": sides[1:]}


def _place_rows(op: ir.Route, s: ir.Schedule) -> str:
    """A place's payload as strata::Router<T>::Rows: {window, its rows, x, row length in T}."""
    win, x = s.param(op.dst.buffer), dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))["x"]
    rows, hidden = (c(d) for d in win.dims)
    wptr, xptr = _cname(win.name), _cname(x)
    if win.dtype is not None and win.dtype.nbytes != 1:
        # rows of a fixed type (an int8 dispatch's f32 scales beside its int8 rows, T = int8_t)
        # are moved as T elements, like every copy: the pointers and the row length in T
        ratio = _cpp(f"strata::Ratio<{win.dtype.ctype}, T>()")
        wptr, xptr = f"strata::Reinterpret<T>({wptr})", f"strata::Reinterpret<T>({xptr})"
        hidden = c(ir.Bin(ir.BinKind.MUL, win.dims[1], ratio))
    return f"{{{wptr}, {rows}, {xptr}, {hidden}}}"


def _route(op: ir.Route, engine: ir.Engine, s: ir.Schedule, also: ir.Route | None = None) -> dict:
    """A routing construct's Router call; `also`: a place joined to op (one pass over the ids)."""
    K = ir.RouteKind
    role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
    dst = _chain(_cname(op.dst.buffer), op.dst.lo)
    n = c(op.dst.length)
    if op.kind is K.HISTOGRAM:
        call = f"rt_.Histogram({dst}, {_cname(role['ids'])}, {c(s.param(role['ids']).size)}, {n})"
    elif op.kind is K.EXSCAN:
        # the bound: an expert's region's rows (exscan(counts, R)), else the window's rows
        win = _window_of(s, op.dst.buffer)
        rows = c(op.capacity) if op.capacity is not None else c(s.param(win).dims[0]) if win else \
            ir.c_source(ir.Bin(ir.BinKind.SHL, ir.Const(1), ir.Const(40)), {})   # no window: no bound
        layout = "kPerExpert" if op.capacity is not None else "kPerOwner"
        call = (f"rt_.Exscan({dst}, {_cname(role['counts'])}, {n}, rank, world, strata::Bound::{layout}, "
                f"{rows}, strata::StatusLine(sync_, world))")
    elif op.kind is K.SLOTS:
        call = f"rt_.Slots({dst}, {n}, {c(op.capacity)}, rank, world)"
    else:
        ids = s.param(role["ids"])
        tokens, topk = (c(d) for d in (ids.dims + (ir.Const(1),))[:2])   # [tokens, topk] or [tokens]
        experts = c(s.param(role["offs"]).size)
        # offsets from an exscan come with the bound's status line (Exscan): skip when it is set
        status = "strata::StatusLine(sync_, world)" if _exscanned(s, role["offs"]) else "nullptr"
        if op.kind is K.PLACE:
            via = {ir.Engine.AIV: "kAiv", ir.Engine.SDMA: "kSdma", ir.Engine.AUTO: "kAuto"}[engine]
            second = _place_rows(also, s) if also is not None else "{nullptr, 0, nullptr, 0}"
            call = (f"rt_.Place(mv_, strata::Via::{via}, {_place_rows(op, s)}, {second}, "
                    f"{_cname(ids.name)}, {_cname(role['offs'])}, {tokens}, {topk}, {experts}, "
                    f"rank, world, kSdmaThreshold, {status})")
        else:
            win = s.param(role["win"])
            rows, hidden = (c(d) for d in win.dims)
            call = (f"rt_.Gather({_cname(op.dst.buffer)}, {_cname(win.name)}, {rows}, {_cname(ids.name)}, "
                    f"{_cname(role['weights'])}, {_cname(role['offs'])}, {tokens}, {topk}, {hidden}, "
                    f"{experts}, world, {status})")
    return {"kind": "route", **_at(op.span), "call": call,
            "joined": also.span.line if also is not None else None}


def _window_of(s: ir.Schedule, offs: str) -> str | None:
    """The window the place or gather reading these offsets fills or reads (its rows bound them)."""
    for op in passes_routes(s):
        role = dict(zip(ir.ROUTE_OPERANDS[op.kind], op.operands))
        if role.get("offs") == offs and op.kind in (ir.RouteKind.PLACE, ir.RouteKind.GATHER):
            return op.dst.buffer if op.kind is ir.RouteKind.PLACE else role["win"]
    return None


def _exscanned(s: ir.Schedule, offs: str) -> bool:
    return any(op.kind is ir.RouteKind.EXSCAN and op.dst.buffer == offs for op in passes_routes(s))


def _red(op: ir.Op) -> str:
    """A reduction as C++: a strata::Red constant, or the kernel's OP template parameter."""
    if isinstance(op, ir.OpParam):
        return "OP"
    return "strata::Red::" + {ir.ReduceOp.SUM: "kSum", ir.ReduceOp.MAX: "kMax",
                              ir.ReduceOp.MIN: "kMin"}[op]


def _loop(op: ir.Loop, body: list[dict]) -> dict:
    """A loop over ranks (`peers` skips the running rank) or a step loop from lo to hi: the
    variable, its first value, the condition it runs under and the one it skips an iteration
    under (peers: the running rank; else None)."""
    step = op.domain is ir.Domain.RANGE
    var = ir.Var(op.var)
    return {"kind": "loop", "var": _cname(op.var), "ranks": op.domain is ir.Domain.RANKS,
            "peers": op.domain is ir.Domain.PEERS,
            "lo": c(op.lo if step else ir.Const(0)),
            "cond": c(ir.Bin(ir.BinKind.LT, var, op.hi if step else ir.Var("world"))),
            "skip": c(ir.Bin(ir.BinKind.EQ, var, ir.Var("rank"))) if op.domain is ir.Domain.PEERS
            else None,
            **_at(op.span), "body": body}


def _nodes(ops, engine: ir.Engine, s: ir.Schedule) -> list[dict]:
    """A stage's statements; a place joined to the one before it (passes.join_places) is made in
    that one's call."""
    out = []
    for i, op in enumerate(ops):
        if isinstance(op, ir.Route) and op.joined:
            continue
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if isinstance(nxt, ir.Route) and nxt.joined:
            out.append(_route(op, engine, s, also=nxt))
        else:
            out.append(_node(op, engine, s))
    return out


def _node(op, engine: ir.Engine, s: ir.Schedule) -> dict:
    if isinstance(op, ir.Loop):
        return _loop(op, _nodes(op.body, engine, s))
    if isinstance(op, ir.If):
        return {"kind": "if", **_at(op.span), "cond": c(op.cond),
                "then": _nodes(op.then, engine, s), "orelse": _nodes(op.orelse, engine, s)}
    if isinstance(op, ir.Route):
        return _route(op, engine, s)
    if isinstance(op, ir.Copy):
        via = {ir.Engine.AIV: "kAiv", ir.Engine.SDMA: "kSdma", ir.Engine.AUTO: "kAuto"}[engine]
        return {"kind": "copy", "via": via, **_moves(op, s)}
    if isinstance(op, ir.Accumulate):
        return {"kind": "accumulate", "op": _red(op.op), **_moves(op, s)}
    if isinstance(op, ir.ReduceList):
        return {"kind": "reduce_list", "op": _red(op.op), **_moves(op, s)}
    peers = op.domain is ir.Domain.PEERS
    # over ranks (0 .. world, peers skip the running rank) or a team's places (0 .. its size,
    # peers skip the running rank's place)
    var = ir.Var(op.var)
    return {"kind": "reduce", "op": _red(op.op), "var": _cname(op.var), "peers": peers,
            "cond": c(ir.Bin(ir.BinKind.LT, var, ir.Var("world") if op.count is None else op.count)),
            "skip": c(ir.Bin(ir.BinKind.EQ, var, ir.Var("rank") if op.count is None else op.skip))
            if peers else None, **_moves(op, s)}


def _regions(ops):
    """Every region a copy, accumulate or reduce under ops (stages, loops, ifs) reads or writes."""
    for op in ops:
        if isinstance(op, (ir.Stage, ir.Loop)):
            yield from _regions(op.body)
        elif isinstance(op, ir.If):
            yield from _regions(op.then + op.orelse)
        elif isinstance(op, (ir.Copy, ir.Accumulate, ir.Reduce, ir.ReduceList)):
            yield op.dst
            yield from ir.sources(op)


def _has_moves(nodes: list[dict]) -> bool:
    """Whether a stage moves data (so needs its Partition): routes alone do not."""
    return any(n["kind"] in ("copy", "accumulate", "reduce", "reduce_list")
               or _has_moves(n.get("body", []) + n.get("then", []) + n.get("orelse", []))
               for n in nodes)


def _flag_bases(s: ir.Schedule) -> dict[str, ir.IExpr]:
    """Offsets of each flag in the sync area (slots of one 64-byte line each, strata::SyncSlot):
    barrier slots [0, world) first."""
    bases, offset = {}, ir.Var("world")
    for f in s.flags:
        bases[f.name] = offset
        offset = ir.add(offset, f.size)
    return bases


def _stamp(f: ir.Flag, op: ir.Signal | ir.Wait) -> str:
    """The stamp of a signal or wait as C++: the call's epoch plus the flag's offset (an expression
    of world and sizes after barriers in step loops) plus the op's round."""
    seq = ir.Const(f.seq) if isinstance(f.seq, int) else f.seq
    return c(ir.Bin(ir.BinKind.ADD, _cpp("epoch_"), ir.simplify(ir.add(seq, op.round))))


def _statements(s: ir.Schedule) -> list[dict]:
    flags = {f.name: f for f in s.flags}
    bases = _flag_bases(s)
    shared = control.shared_loops(s)

    def sync_node(op) -> dict:
        if isinstance(op, ir.If):
            return {"kind": "if", **_at(op.span), "cond": c(op.cond),
                    "then": scoped(op.then, lambda ops: [sync_node(o) for o in ops]),
                    "orelse": scoped(op.orelse, lambda ops: [sync_node(o) for o in ops])}
        if isinstance(op, ir.Loop):
            node = _loop(op, scoped(op.body, lambda ops: [sync_node(o) for o in ops]))
            if id(op) in shared:    # trip v on core (v - first) % cores (ir.control)
                node["first"] = c(ir.add(op.lo if op.domain is ir.Domain.RANGE else ir.Const(0),
                                         _cpp("AscendC::GetBlockIdx()")))
            return node
        if isinstance(op, ir.Local):
            return _local(op)
        f = flags[op.flag]
        slot = f"strata::SyncSlot(sync_, {_chain(bases[op.flag], op.index)})"
        if isinstance(op, ir.Signal):
            return {"kind": "signal", **_at(op.span), "slot": slot, "stamp": _stamp(f, op),
                    "pe": _argument(op.rank)}
        return {"kind": "wait", **_at(op.span), "slot": slot, "stamp": _stamp(f, op)}

    def top(ops) -> list[dict]:
        out: list[dict] = []
        for op in ops:
            if isinstance(op, ir.Barrier):
                team = None
                if op.team is not None and op.team.name in {t.name for t in s.teams}:
                    team = _cname(op.team.name)              # strata::TeamBarrier(sync, stamp, team)
                    _TEAMS.get().used.add(op.team.name)
                elif op.team is not None:                    # (sync, stamp, base, step, size)
                    team = f"{c(op.team.base)}, {c(op.team.step)}, {c(op.team.size)}"
                out.append({"kind": "barrier", **_at(op.span), "stamp": _chain("epoch_", op.seq),
                            "team": team})
            elif isinstance(op, ir.Stage):
                body = _nodes(op.body, op.engine, s)
                moves = _has_moves(body)
                # the stage's own line marker covers its Partition; a stage of routes alone leaves
                # it to its first statement when that says the same
                same = bool(body) and body[0]["kind"] == "route" and body[0]["line"] == op.span.line
                out.append({"kind": "stage", **_at(op.span), "index": op.index,
                            "engine": op.engine.value, "body": body, "moves": moves,
                            "mark": moves or not same, "handle": op.handle})
            elif isinstance(op, ir.Await):
                out.append({"kind": "await", **_at(op.span), "handle": op.handle})
            elif isinstance(op, ir.Local):
                # every core computes the rank's locals (they are read by its moves' offsets). A
                # let's value reads nothing the signals and waits before it change: among them, it
                # goes before their group, which the ones after it then join
                if op.inline and out and out[-1]["kind"] == "control":
                    out.insert(len(out) - 1, _local(op))
                else:
                    out.append(_local(op))
            elif isinstance(op, ir.Set):
                target = _cname(op.name) if op.index is None else c(ir.Elem(op.name, op.index))
                out.append({"kind": "set", **_at(op.span), "name": target,
                            "value": _argument(op.value), "mutable": True})
            elif isinstance(op, ir.Loop) and not control.is_control(op):
                # a step loop around stages: every core of the rank runs every step, in step
                # with the others (each stage ends with all of its cores)
                out.append({**_loop(op, scoped(op.body, top)), "kind": "for"})
            elif control.is_control(op):
                node = sync_node(op)
                if out and out[-1]["kind"] == "control":
                    out[-1]["body"].append(node)
                else:
                    out.append({"kind": "control", **_at(op.span), "body": [node], "shared": False})
                # a shared block: its loops' trips on every core, the rest on core 0
                out[-1]["shared"] |= any(id(x) in shared for x in control.loops(op))
            else:  # an if around stages or barriers: every core of the rank takes the same arm
                out.append({"kind": "if", **_at(op.span), "cond": c(op.cond),
                            "then": scoped(op.then, top), "orelse": scoped(op.orelse, top)})
        return out

    lets = _LETS.get()

    def scoped(ops, walk) -> list[dict]:
        """walk(ops), the lets they declare named in their own expressions only."""
        outer = dict(lets.table)
        try:
            return walk(ops)
        finally:
            lets.table = outer

    return _drop_unused(scoped(s.body, top), lets.used)


def _local(op: ir.Local) -> dict:
    """A local's declaration; a let's value is printed before its name stands for it. A let
    records the lets its own value names (`uses`): it keeps them only if it is kept itself."""
    lets = _LETS.get()
    roots, lets.used = lets.used, set()
    try:
        node = {"kind": "local", **_at(op.span), "name": _cname(op.name),
                "value": _argument(op.value), "mutable": op.mutable, "array": None}
        if op.size is not None:    # an array: room for ir.ARRAY_CAPACITY, its first size filled
            j = _cpp("j")
            node.update(array=f"{_cname(op.name)}[{ir.ARRAY_CAPACITY}]", size=c(op.size),
                        fill=c(ir.Bin(ir.BinKind.LT, j, op.size)), elem=c(ir.Elem(op.name, j)))
    finally:
        uses, lets.used = lets.used, roots
    if not op.inline:
        roots |= uses
        return node
    lets.count += 1
    node.update(let=lets.count, uses=uses)
    lets.table[ir.simplify(op.value)] = (_cpp(_cname(op.name)), lets.count)
    return node


def _drop_unused(nodes: list[dict], used: set[int]) -> list[dict]:
    """The statements without the declarations of lets that nothing printed by name: `used` are
    the lets other statements named, and a let they keep keeps the lets its value names."""
    uses: dict[int, set[int]] = {}

    def collect(ns) -> None:
        for n in ns:
            if "let" in n:
                uses[n["let"]] = n["uses"]
            for part in ("body", "then", "orelse"):
                collect(n.get(part, ()))
    collect(nodes)
    live, todo = set(), list(used)
    while todo:
        k = todo.pop()
        if k not in live:
            live.add(k)
            todo.extend(uses.get(k, ()))

    def keep(ns) -> list[dict]:
        out = []
        for n in ns:
            if "let" in n and n["let"] not in live:
                continue
            for part in ("body", "then", "orelse"):
                if part in n:
                    n = {**n, part: keep(n[part])}
            out.append(n)
        return out
    return keep(nodes)


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
        "flags": {"barrier_slots": "world", "slot_bytes": abi.SYNC_SLOT_BYTES,
                  "named": [{"name": f.name, "size": str(f.size),
                             "seq": f.seq if isinstance(f.seq, int) else ir.bare(f.seq)} for f in s.flags],
                  "stamps_per_call": s.sync_ops if s.sync_expr is None else ir.bare(s.sync_expr)},
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
    token = _TEAMS.set(_Teams())
    lets_token = _LETS.set(_Lets())
    source_token = _SOURCE.set(s.span.source)
    try:
        teams = _team_members(s)
        statements, agree = _agreement(s, _statements(s))
        return _render(s, env, rs, src, statements, _used_teams(teams), agree)
    finally:
        _TEAMS.reset(token)
        _LETS.reset(lets_token)
        _SOURCE.reset(source_token)


def _agreement(s: ir.Schedule, statements: list[dict]) -> tuple[list[dict], dict | None]:
    """The ranks' agreement on the call (strata::Agree), the kernel's first statement. It is a
    barrier of the live ranks, so a schedule that begins with a world barrier (the usual entry
    barrier: every rank's input is ready) has that barrier replaced by it; any other begins with
    it. The verifier relies on that barrier (every rank has entered before any statement), so a
    kernel built without the agreement (passes.Options.agreement, bench's comparison only) keeps
    it without the comparison ("check": False, strata::EntryBarrier)."""
    check = s.kernel.agreement
    # the lets before it only name values: they may come after the agreement
    i = next((i for i, n in enumerate(statements) if n["kind"] != "local" or "let" not in n), None)
    if s.leads_with_barrier:
        first = statements[i]
        assert first["kind"] == "barrier" and first["team"] is None, first
        return statements[:i] + statements[i + 1:], {"line": first["line"], "at": first["at"],
                                                       "fused": True, "check": check}
    return statements, {**_at(s.span), "fused": False, "check": check}


def _render(s: ir.Schedule, env: jinja2.Environment, rs, src: str, statements: list[dict],
            teams: list[dict], agree: dict | None = None) -> Output:
    k = s.kernel
    ctx = {
        "s": s,
        "source": src,
        "name": s.name,
        "kernel_class": abi.kernel_class(s),
        "kernels": [{"dtype": d.short, "ctype": d.ctype, "code": d.code,
                     "op": op.value if op else None,
                     "op_code": abi.OPS.index(op) if op else None,
                     "red": _red(op) if op else "strata::Red::kSum",
                     "name": abi.kernel_name(s, d, op)} for d in abi.dtypes(s) for op in abi.ops(s)],
        "has_op": s.op_param is not None,
        "ints": [{"name": abi.c_param(s, x.name), "c": _cname(x.name)} for x in s.int_params],
        "kernel_args": abi.kernel_args(s),
        "launcher_args": abi.args(s),
        "launcher": abi.launcher_name(s),
        "prototype": abi.c_prototype(s),
        "tensors": [{"name": abi.c_param(s, p.name), "c": _cname(p.name),
                     "ctype": p.dtype.ctype if p.dtype else "T"}
                    for p in s.tensors + s.scratch],
        "routes": bool(rs),
        "gather": any(r.kind is ir.RouteKind.GATHER for r in rs),
        "sizes": [{"name": abi.c_param(s, n), "c": _cname(n)} for n in s.sizes],
        "plan": k,
        "statements": statements,
        "agree": agree,
        "teams": teams,
        "parts": _part_helpers() if any(_part_calls(r, s) for r in _regions(s.body)) else None,
        "sdma_threshold": next((op.plan.sdma_threshold for op in passes_stages(s.body)), 0),
        "contract": str(s.contract),
        "masked": ir.takes_mask(s),
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
