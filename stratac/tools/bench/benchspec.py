"""What a `stratac bench` call is asked and what it answers, shared by every module of the bench.

In: the command line's values, as a BenchSpec. Out: a BenchResult (meta, one record per system,
schedule and size, failures, exit status), which the report, the plot and the JSON read; and
BenchError / BenchUsageError for what the bench cannot do, in one message with its exit status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stratac.ir import passes
from stratac.tools.options import parse_sizes

PEERS = ("gloo", "mpi", "backend")   # backend: dist.* over torch.distributed backend "stratac"
DEFAULT_SIZES = "8:256M"
MOE_TOKENS = "16:1024"   # the default --tokens sweep of a MoE file


class BenchError(Exception):
    """Something the bench cannot do, said in one message (the CLI prints it, no traceback).
    `status` is the exit status it calls for."""

    status = 1


class BenchUsageError(BenchError):
    """Options that do not fit the file (e.g. --vs for MoE schedules): exit status 2."""

    status = 2


@dataclass
class BenchSpec:
    file: str
    world: int
    sizes: list[int] | None = field(default_factory=lambda: parse_sizes(DEFAULT_SIZES))
    dtype: str = "f32"
    op: str = "sum"
    root: int = 0
    iters: int = 20
    warmup: int = 5
    cores: int | None = None
    peers: list[str] = field(default_factory=list)
    timeout: float = 120.0
    seed: int = 0
    soc: str = passes.DEFAULT_SOC
    progress: bool = False
    ceiling_bytes: int = 256 << 20
    trace: str | None = None      # write a Chrome/Perfetto trace of one call per schedule and size
    selected: bool = False        # bench each contract's selecting entry point (stratac.host.select)
    selection: str | None = None  # its table (None: this machine's, if `stratac tune` wrote one)
    ceiling: bool = True          # measure the copy ceiling (stratac tune does not)
    # also bench every schedule built without the ranks' agreement on each call (strata::Agree),
    # "NAME (no agreement)", alternating with it: what the check costs, measured in one run
    agreement_cost: bool = False
    # also bench every MoE pair built with its places not joined (passes.Options(join_places=False)),
    # "NAME (two passes)", right after it: what one pass over the ids for rows and scales saves
    two_pass_places: bool = False
    # MoE dispatch/combine files (None: the defaults below, or workload.MOE_DEFAULTS)
    tokens: list[int] | None = None     # tokens per rank, swept (default MOE_TOKENS)
    hidden: int | None = None
    topk: int | None = None
    experts: int | None = None
    routings: list[str] | None = None   # default ["uniform"]
    max_recv: int | None = None         # a bounded window's rows (default world x tokens x topk)
    capacity: int | None = None         # a slotted layout's slots per (expert, source) (default tokens)


@dataclass
class BenchResult:
    meta: dict
    records: list[dict]          # every system, every size (the JSON's "results")
    failures: list[str]
    exit_code: int
