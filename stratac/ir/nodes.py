"""The schedule IR's nodes: what moves where, on which engine, in which order.

Frozen dataclasses with spans; kinds are enums; passes return new nodes (dataclasses.replace).
Symbolic in rank and world through the integer expressions of stratac.ir.expr.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from stratac.diagnostics import Span
from stratac.ir.expr import Bin, BinKind, Const, IExpr, Sel, Var, bare, simplify, size_scale


class DType(enum.Enum):
    F32 = ("f32", 4, "float", "float32")
    F16 = ("f16", 2, "half", "float16")
    BF16 = ("bf16", 2, "bfloat16_t", "bfloat16")
    I32 = ("i32", 4, "int32_t", "int32")
    # int8: moved, never computed on (A2/A3 vector arithmetic has no int8); a quantised MoE
    # dispatch's payload. Last, so that the other types' codes stay as they were.
    I8 = ("i8", 1, "int8_t", "int8")

    def __init__(self, short: str, nbytes: int, ctype: str, torch_name: str):
        self.short = short
        self.nbytes = nbytes
        self.ctype = ctype
        self.torch_name = torch_name

    @property
    def code(self) -> int:
        """The integer the launchers take to pick the kernel of this dtype (the ABI)."""
        return list(DType).index(self)

    @staticmethod
    def parse(text: str) -> "DType | None":
        return next((d for d in DType if d.short == text), None)


# `sizeof(T)`: the element size in bytes of a schedule's type variable, a name of its expressions
# (sema makes it; no name the grammar reads can be it). Every environment of an instance that uses
# it binds it: the verifier to each of ELEM_SIZES, a call to its tensors' element size, the kernel
# to sizeof(T) of its template parameter.
ELEM = "sizeof(T)"


class Engine(enum.Enum):
    AIV = "aiv"
    SDMA = "sdma"
    AUTO = "auto"


class Domain(enum.Enum):
    RANKS = "ranks"
    PEERS = "peers"
    RANGE = "range"     # lo, lo + 1, ..., hi - 1 (a step loop; Loop.lo and Loop.hi)


class ReduceOp(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"


class ContractKind(enum.Enum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"
    MOE_DISPATCH = "moe_dispatch"
    MOE_COMBINE = "moe_combine"
    ALLTOALLV = "alltoallv"      # a dispatch with one "expert" per rank: row t goes to rank dest[t]

    @property
    def moe(self) -> bool:
        """Routed by expert ids (the routing constructs and sample routings apply)."""
        return self in (ContractKind.MOE_DISPATCH, ContractKind.MOE_COMBINE, ContractKind.ALLTOALLV)

    @property
    def dispatch(self) -> bool:
        return self in (ContractKind.MOE_DISPATCH, ContractKind.ALLTOALLV)


class ScalarKind(enum.Enum):
    RANK = "rank"       # a rank of the world, e.g. the root of a broadcast
    REDOP = "redop"     # a reduction operation, chosen at the call
    DIVISOR = "divisor"  # a divisor of the world, e.g. a team's size (the ranks of a node)


@dataclass(frozen=True)
class OpParam:
    """A reduction given by a redop parameter: the kernel is built for sum, max and min."""

    name: str

    @property
    def value(self) -> str:
        return self.name


Op = Union[ReduceOp, OpParam]


@dataclass(frozen=True)
class Buffer:
    """A tensor parameter. dtype None means the type variable `typevar` (any DType)."""

    name: str
    dtype: DType | None
    typevar: str | None
    symmetric: bool
    size: IExpr
    span: Span
    scratch: bool = False   # declared in the body: the runtime allocates it, the caller never sees it
    shape: tuple[IExpr, ...] = ()   # rows, columns (row-major) for a 2-D tensor; () when 1-D

    @property
    def type_text(self) -> str:
        return self.dtype.short if self.dtype else str(self.typevar)

    @property
    def dims(self) -> tuple[IExpr, ...]:
        return self.shape or (self.size,)

    @property
    def shape_text(self) -> str:
        return ", ".join(bare(d) for d in self.dims)


@dataclass(frozen=True)
class Region:
    """Elements [lo, lo + length) of buffer's instance on rank `rank` (None: the running rank)."""

    buffer: str
    lo: IExpr
    length: IExpr
    rank: IExpr | None
    span: Span
    part: tuple[IExpr, IExpr] | None = None   # (index, parts) when it is a part of a split
    # inside that part: ("range", lo, hi, part length) for part[i][lo:hi] (0 <= lo <= hi <= the
    # part's length), ("chunk", c, chunks, part length) for chunk c of a split of the part (0 <= c < chunks)
    sub: tuple[str, IExpr, IExpr, IExpr] | None = None

    def __str__(self) -> str:
        at = f"@{self.rank}" if self.rank is not None else ""
        return f"{self.buffer}[{self.lo} +: {self.length}]{at}"


@dataclass(frozen=True)
class Copy:
    dst: Region
    src: Region
    span: Span


@dataclass(frozen=True)
class Team:
    """A named group of ranks (`team node = block(T)`): `block` holds the T consecutive ranks
    r / T * T .. r / T * T + T - 1, `stride` the world / T ranks with the same r % T. T divides
    world (the verifier checks it at every instance, E0201). Member i is base + i * step; the
    running rank is member `index` of its team; everything is an expression of rank and world, so
    the kernel computes it (no unrolling)."""

    name: str
    kind: str            # "block" | "stride" | "groups"
    t: IExpr             # the block size T (an expression of world); groups: their number
    span: Span
    sizes: tuple[IExpr, ...] = ()   # groups(S0, S1, ...): the groups' sizes, in rank order

    @property
    def size(self) -> IExpr:
        if self.kind == "groups":
            return self._by_group(self.sizes)
        return self.t if self.kind == "block" else simplify(Bin(BinKind.DIV, Var("world"), self.t))

    @property
    def index(self) -> IExpr:
        """The running rank's place in its team (`node.rank`)."""
        if self.kind == "groups":
            return simplify(Bin(BinKind.SUB, Var("rank"), self.base))
        kind = BinKind.MOD if self.kind == "block" else BinKind.DIV
        return Bin(kind, Var("rank"), self.t)

    @property
    def base(self) -> IExpr:
        if self.kind == "groups":
            return self._by_group(self.firsts)
        if self.kind == "block":
            return Bin(BinKind.MUL, Bin(BinKind.DIV, Var("rank"), self.t), self.t)
        return Bin(BinKind.MOD, Var("rank"), self.t)

    @property
    def step(self) -> IExpr:
        return self.t if self.kind == "stride" else Const(1)

    @property
    def firsts(self) -> tuple[IExpr, ...]:
        """groups: the first rank of each group (S0 + ... + S(j-1) for group j)."""
        out, at = [], Const(0)
        for size in self.sizes:
            out.append(at)
            at = simplify(Bin(BinKind.ADD, at, size))
        return tuple(out)

    def _by_group(self, values: tuple[IExpr, ...]) -> IExpr:
        """groups: values[j] for the group j the running rank is in (rank < its end), as nested
        conditionals, the last group's value when rank is past every earlier group's end."""
        firsts = self.firsts
        e = values[-1]
        for j in range(len(values) - 2, -1, -1):
            end = simplify(Bin(BinKind.ADD, firsts[j], self.sizes[j]))
            e = Sel(Bin(BinKind.LT, Var("rank"), end), values[j], e)
        return e

    def member(self, i: IExpr) -> IExpr:
        """The rank of member i (`node[i]`)."""
        return simplify(Bin(BinKind.ADD, self.base, Bin(BinKind.MUL, i, self.step)))

    def __str__(self) -> str:
        if self.kind == "groups":
            return f"{self.name} = groups({', '.join(bare(x) for x in self.sizes)})"
        return f"{self.name} = {self.kind}({bare(self.t)})"


@dataclass(frozen=True)
class Reduce:
    """dst = op over var in domain of src (src mentions var). With `count` set, var takes
    0 .. count - 1 (the members of a team, src naming member var), leaving out var == skip for
    Domain.PEERS; otherwise var is a rank (ranks, or peers: all but the running rank)."""

    dst: Region
    op: Op
    src: Region
    var: str
    domain: Domain
    span: Span
    count: IExpr | None = None
    skip: IExpr | None = None


@dataclass(frozen=True)
class ReduceList:
    """dst = op(srcs[0], srcs[1], ...): the reduction of two or more named regions (NCCL's
    recvReduceCopy/recvReduceSend: a local block and a received one, into a local or a peer's
    buffer), folded in the order written."""

    dst: Region
    op: Op
    srcs: tuple[Region, ...]
    span: Span


@dataclass(frozen=True)
class Accumulate:
    """dst op= src: reduce on write, an atomic DMA accumulate (concurrent accumulates commute)."""

    dst: Region
    op: Op
    src: Region
    span: Span


@dataclass(frozen=True)
class If:
    cond: IExpr          # nonzero: then; it may depend on rank, so ranks can take different arms
    then: tuple["Node", ...]
    orelse: tuple["Node", ...]
    span: Span


@dataclass(frozen=True)
class Loop:
    var: str
    domain: Domain
    body: tuple["Node", ...]
    span: Span
    lo: IExpr | None = None     # Domain.RANGE: var takes lo, lo + 1, ..., hi - 1 (none if hi <= lo)
    hi: IExpr | None = None

    @property
    def head(self) -> str:
        """The loop as the printer shows it: `s in 0 .. (world - 1)`, `p in peers`."""
        if self.domain is Domain.RANGE:
            return f"{self.var} in {bare(self.lo)} .. {bare(self.hi)}"
        return f"{self.var} in {self.domain.value}"


@dataclass(frozen=True)
class Plan:
    """What the passes decided for a stage (None until they ran)."""

    copies_on_aiv: bool            # some copy may go through the vector cores' UB
    copies_on_sdma: bool           # some copy may go to the SDMA queues (needs a quiet at the end)
    reduces: bool                  # vector reductions
    sdma_threshold: int            # bytes from which `auto` copies go to SDMA
    routes: bool = False           # MoE routing constructs (strata::Router)


@dataclass(frozen=True)
class KernelPlan:
    """UB layout of one core, the same for every stage of the kernel (one TPipe per kernel)."""

    copy_tiles: int                # tiles of the copy queue (VECIN->VECOUT, double-buffered)
    reduce_tiles: int              # tiles of the reduction: its queues (and for 16-bit types its float accumulator)
    tile_bytes: int                # bytes per tile, a multiple of 32 (of 64 if the kernel reduces)
    scratch_bytes: int             # UB scratch for SDMA descriptors and flag staging
    ub_bytes: int                  # total UB bytes per core
    cores: int                     # vector cores a launch uses by default
    soc: str
    route_bytes: int = 0           # UB of the MoE routing constructs (counters, gather buffers)
    agreement: bool = True         # the ranks agree on each call before writing (strata::Agree)
    mask_bytes: int = 0            # UB of the mask of active ranks (strata::Ranks; ir.takes_mask)


@dataclass(frozen=True)
class Stage:
    engine: Engine
    body: tuple["Node", ...]
    span: Span
    index: int
    plan: Plan | None = None
    # `on sdma async h:` the stage posts its copies and returns; they are in flight until `await h`
    handle: str | None = None


@dataclass(frozen=True)
class Await:
    """await h: every core of the rank has completed the SDMA copies of the asynchronous stage h
    (SHMEM's quiet drains the core's whole queue, so also whatever the core posted before it)."""

    handle: str
    span: Span


@dataclass(frozen=True)
class Local:
    """An integer of the running rank, declared where it stands and visible to the rest of its
    block: `var name = value` (mutable: `set` changes it; loop state) or a let that reads a var
    (the value when it ran). Every core of the rank computes it, outside stages.

    inline: a let whose uses are substituted in the expressions after it, as every other let's are
    (what the verifier, the check before a call and the simulator read); the node only names its
    value for the generated code, which prints the name where an expression holds the value
    (codegen.emit), and they skip it.

    size: an integer array, `var t[size] = value` (each of its `size` elements starts as value;
    size is an expression every rank agrees on, 0 .. ARRAY_CAPACITY at every instance); None for a
    single integer."""

    name: str
    value: IExpr
    span: Span
    mutable: bool = True
    inline: bool = False
    size: IExpr | None = None


@dataclass(frozen=True)
class Set:
    """set name = value: a var's new value, on every core of the running rank; `set t[index] =
    value` (index not None): element index of the array t (in range at every instance)."""

    name: str
    value: IExpr
    span: Span
    index: IExpr | None = None


@dataclass(frozen=True)
class Barrier:
    span: Span
    team: Team | None = None   # barrier(node): joins the members of the running rank's team only
    # the stamp offset (stamp = epoch + seq) the epoch pass gives it: 1 + the barriers the rank
    # passed before it in the call, which under an `if` may depend on the condition; 0 before
    # the pass
    seq: IExpr = Const(0)


@dataclass(frozen=True)
class Flag:
    name: str
    size: IExpr
    span: Span
    seq: "int | IExpr" = 0   # stamp offset of this flag's round 0 within a call (round r: seq + r);
                             # an expression of world and sizes when barriers in step loops or
                             # rounds that depend on them come before it (Schedule.sync_expr)
    rounds: IExpr = Const(1)  # `rounds R`: each slot is signalled up to R times per call, in order
                              # (an expression of world and sizes)


@dataclass(frozen=True)
class Signal:
    flag: str
    index: IExpr
    rank: IExpr
    span: Span
    round: IExpr = Const(0)   # which of the slot's rounds this signal sets (Flag.rounds)


@dataclass(frozen=True)
class Wait:
    flag: str
    index: IExpr
    span: Span
    round: IExpr = Const(0)   # the round of the slot it waits for (or a later one)


class RouteKind(enum.Enum):
    """MoE routing constructs (dsl/README.md, "Routing"). ids hold int32 expert ids, -1 = no expert;
    expert e lives on rank e / (experts / world) as its local expert e % (experts / world)."""

    HISTOGRAM = "histogram"   # dst[e] = the number of entries of ids equal to e
    EXSCAN = "exscan"         # dst[e] = first window row of this rank's rows for e (packed layout)
    # exscan(counts, R): the same in regions of R rows, one per local expert (per-expert bound)
    SLOTS = "slots"           # dst[e] = first window row of this rank's slots for e (fixed capacity)
    PLACE = "place"           # row t of x -> window row offs[e] + (its place among my rows for e)
    GATHER = "gather"         # dst row t = sum over k of weights[t, k] * that window row of ids[t, k]


ROUTE_OPERANDS = {RouteKind.HISTOGRAM: ("ids",), RouteKind.EXSCAN: ("counts",),
                  RouteKind.SLOTS: ("capacity",), RouteKind.PLACE: ("x", "ids", "offs"),
                  RouteKind.GATHER: ("win", "ids", "weights", "offs")}


@dataclass(frozen=True)
class Route:
    """dst = kind(operands): operands name buffers (ROUTE_OPERANDS), except slots' capacity."""

    kind: RouteKind
    dst: Region
    operands: tuple[str, ...]
    span: Span
    # slots: the rows per (expert, source rank); exscan: the rows of each local expert's region of
    # the window (its bound), None for one packed run per owner
    capacity: IExpr | None = None
    # a place made in the same pass over the ids as the place right before it (same ids and
    # offsets, buffers apart): set by passes.join_places, never by the front end
    joined: bool = False

    def __str__(self) -> str:
        args = list(self.operands) + ([str(self.capacity)] if self.capacity is not None else [])
        return f"{self.dst} = {self.kind.value}({', '.join(args)})"


Node = Union[Copy, Reduce, ReduceList, Accumulate, Route, If, Loop, Stage, Await, Barrier, Signal, Wait,
             Local, Set]


def sources(op: "Copy | Reduce | ReduceList | Accumulate") -> tuple[Region, ...]:
    """The regions a move reads as written: a copy's or accumulate's source, a reduction's operand
    (one region, per its variable) or each region of a reduction of named regions."""
    return op.srcs if isinstance(op, ReduceList) else (op.src,)


@dataclass(frozen=True)
class Contract:
    kind: ContractKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]     # equal to inputs for an in-place contract
    op: Op | None
    span: Span
    root: str | None = None      # the rank parameter naming the root
    capacity: str | None = None  # MoE: the size symbol of the slots per (expert, source rank)
    # moe_dispatch: rows that travel with the tokens, (source, window) pairs: row t of the source
    # goes to the same row of its window as row t of x goes to in win (a quantised payload's scales)
    side: tuple[tuple[str, str], ...] = ()
    # MoE, `per_expert(R)`: the size symbol of the rows of each local expert's region of the packed
    # window (the bound each expert's rows are checked against); None: one packed run per owner
    region: str | None = None

    @property
    def in_place(self) -> bool:
        return self.inputs == self.outputs

    def __str__(self) -> str:
        if self.kind.moe:
            data = f"{', '.join(self.inputs)} -> {', '.join(self.outputs)}"
        else:
            data = self.inputs[0] if self.in_place else f"{self.inputs[0]} -> {self.outputs[0]}"
        extra = [a for a in (self.op.value if self.op else None, self.root, self.capacity) if a]
        extra += [f"per_expert({self.region})"] if self.region else []
        extra += [f"{a} -> {b}" for a, b in self.side]
        return f"{self.kind.value}({', '.join([data, *extra])})"


@dataclass(frozen=True)
class Requirement:
    """`requires COND`: the world sizes a schedule supports. cond is over world alone; text is the
    condition as written (`world is pow2`)."""

    cond: IExpr
    text: str
    span: Span

    def holds(self, world: int) -> bool:
        try:
            return bool(self.cond.eval({"world": world}))
        except (ZeroDivisionError, ValueError):
            return False

    def __str__(self) -> str:
        return f"requires {self.text}, {self.span.source.name}:{self.span.line}"


# A mask of active ranks is a bitmap the host writes into the sync area and the kernel copies into
# UB (strata::Ranks, codegen/abi.py mask_offset): its UB buffer holds this many ranks
# (strata::kMaskMaxWorld), the largest world stratac proves (verify.samples.MAX_WORLD).
MASK_MAX_WORLD = 16384


def takes_mask(s: "Schedule") -> bool:
    """Whether s's calls take a mask of active ranks (docs/robustness.md, "Masked ranks"): the MoE
    dispatches and combines. Their kernels get an `active` argument; every barrier and every loop
    over ranks is over the live ranks only, and the routing drops the entries of masked ranks'
    experts. (AllToAllV, routed the same way, does not take one.)"""
    return s.contract.kind in MASKED_KINDS


MASKED_KINDS = (ContractKind.MOE_DISPATCH, ContractKind.MOE_COMBINE)   # takes_mask, by contract kind


# A window row `place` writes from other ranks is a whole number of 32-byte blocks, so that no
# two ranks' (or cores') DMA writes land in one 32-byte block of a peer's heap: byte-exact remote
# writes from several sources into one block are not documented for HCCS (docs/npu.md, "Peer
# window rows"; the production MoE dispatch pads the same way, its scale inside a padded row).
WINDOW_ROW_ALIGN = 32


def padded_row(cols: int, dtype: "DType") -> int:
    """The least number of columns >= cols whose row of dtype is a whole number of
    WINDOW_ROW_ALIGN-byte blocks."""
    per = WINDOW_ROW_ALIGN // dtype.nbytes
    return -(-cols // per) * per


def unmet_requirement(s: "Schedule", world: int) -> "Requirement | None":
    """The first world constraint of s that `world` violates, if any (those of its callees
    included: sema adds them to s.requires, read on the team each is called on)."""
    return next((r for r in s.requires if not r.holds(world)), None)


@dataclass(frozen=True)
class CallSite:
    """`call callee(args) on team`: the callee's body, inlined, is the caller's top-level ops
    body[start:end] (the passes map the body op by op, so the range holds after them). Its flags,
    loop variables and asynchronous handles carry `prefix`; its `rank` is the team's rank, its
    `world` the team's size, its ranks after @ and in signals the team's members. `requires` are
    the callee's world constraints with world read as the team's size, conditions on the caller's
    world that every instance checks (E0201)."""

    callee: str
    team: str | None          # None: `on world`
    args: str                 # the arguments as written
    span: Span
    start: int
    end: int
    prefix: str
    requires: tuple[Requirement, ...] = ()
    # (callee buffer, the length of the region passed, the size the callee declares for it, both
    # in the caller's names, the declaration as text) where the two are not one expression: equal
    # at every instance (E0202)
    shapes: tuple[tuple[str, IExpr, IExpr, str], ...] = ()

    def __str__(self) -> str:
        return f"call {self.callee}({self.args}) on {self.team or 'world'}"


@dataclass(frozen=True)
class Scalar:
    name: str
    kind: ScalarKind
    span: Span


@dataclass(frozen=True)
class Schedule:
    name: str
    source_name: str
    params: tuple[Buffer, ...]
    sizes: tuple[str, ...]          # size symbols, each the whole size of some parameter
    flags: tuple[Flag, ...]
    contract: Contract
    body: tuple[Node, ...]
    span: Span
    sync_ops: int = 0               # stamps one call uses (the most barriers a rank passes, plus
                                    # one per flag; the epoch pass sets it)
    kernel: KernelPlan | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the stamps one call uses when barriers in step loops make them depend on world, sizes and
    # rank parameters (then sync_ops is its constant part); None: sync_ops
    sync_expr: IExpr | None = None

    scalars: tuple[Scalar, ...] = ()
    requires: tuple[Requirement, ...] = ()
    teams: tuple[Team, ...] = ()
    calls: tuple[CallSite, ...] = ()
    elem: bool = False              # its expressions name ELEM (`sizeof(T)` of its type variable)

    def stamps(self, env: dict) -> int:
        """The stamps one call uses (how far the epoch advances) at world, sizes and rank
        parameters env."""
        return self.sync_ops if self.sync_expr is None else int(self.sync_expr.eval(env))

    @property
    def leads_with_barrier(self) -> bool:
        """Whether the first statement (lets aside: they only name values) is a world barrier,
        which the kernel fuses into the ranks' agreement on the call (strata::Agree, itself a
        barrier of the live ranks): then the two are one barrier, not two."""
        first = next((op for op in self.body if not (isinstance(op, Local) and op.inline)), None)
        return isinstance(first, Barrier) and first.team is None

    def param(self, name: str) -> Buffer:
        return next(p for p in self.params if p.name == name)

    @property
    def tensors(self) -> tuple[Buffer, ...]:
        """The buffers a caller passes (parameters that are not scratch)."""
        return tuple(p for p in self.params if not p.scratch)

    @property
    def scratch(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if p.scratch)

    @property
    def lowered(self) -> bool:
        """Whether the pass pipeline ran (it ends by planning the kernel): then barriers and flags
        carry the stamps the kernel uses."""
        return self.kernel is not None

    @property
    def op_param(self) -> Scalar | None:
        return next((x for x in self.scalars if x.kind is ScalarKind.REDOP), None)

    @property
    def rank_params(self) -> tuple[Scalar, ...]:
        return tuple(x for x in self.scalars if x.kind is ScalarKind.RANK)

    @property
    def int_params(self) -> tuple[Scalar, ...]:
        """The integers a call gives (rank and divisor parameters), in the order declared: the
        kernel's arguments after the sizes."""
        return tuple(x for x in self.scalars if x.kind is not ScalarKind.REDOP)

    @property
    def typevars(self) -> tuple[str, ...]:
        seen: list[str] = []
        for p in self.params:
            if p.typevar and p.typevar not in seen:
                seen.append(p.typevar)
        return tuple(seen)


def elem_sizes(s: Schedule) -> tuple[int, ...]:
    """The values ELEM takes in s's instances: the element sizes of the types its type variable is
    compiled for (f32 and i32: 4, f16 and bf16: 2; codegen.abi.dtypes), largest first; () when s
    does not name it."""
    return (4, 2) if s.elem else ()


def elem_env(s: Schedule, nbytes: int) -> dict[str, int]:
    """What an instance of s at an element size of nbytes binds besides its sizes: ELEM, when s
    names it."""
    return {ELEM: nbytes} if s.elem else {}


@dataclass(frozen=True)
class SizeRule:
    """Size symbol `sym` is dimension `dim` of parameter `param` divided by `scale`."""

    sym: str
    param: str
    dim: int
    scale: IExpr


def size_rules(params: tuple[Buffer, ...], syms: tuple[str, ...]) -> tuple[list[SizeRule], list[str]]:
    """How the size symbols are read off the shapes of the caller's tensors, in an order where each
    rule's scale uses only world and symbols read before it; and the symbols that cannot be read."""
    known, rules = {"world"}, []
    progress = True
    while progress:
        progress = False
        for p in params:
            if p.scratch:
                continue
            for i, d in enumerate(p.dims):
                todo = d.names() - known
                if len(todo) != 1:
                    continue
                sym = next(iter(todo))
                k = size_scale(d, sym, frozenset(known))
                if sym in syms and k is not None:
                    rules.append(SizeRule(sym, p.name, i, k))
                    known.add(sym)
                    progress = True
    return rules, [x for x in syms if x not in known]
