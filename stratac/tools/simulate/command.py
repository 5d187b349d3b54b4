"""`stratac simulate` on the command line. In: the argparse subparsers of stratac/cli.py, then the
parsed arguments. Out: the table on stdout (and the JSON file with --json), exit status 0; or one
`stratac simulate: error:` line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import sys

from stratac import ir
from stratac.tools import options
from stratac.tools.simulate.driver import DEFAULT_SIZES, simulate_file
from stratac.tools.simulate.machine import SimulateError, load_machine
from stratac.tools.simulate.moe import (
    MOE_DTYPE,
    MOE_EXPERTS_PER_RANK,
    MOE_HIDDEN,
    MOE_TOKENS,
    MOE_TOPK,
    MoeSpec,
)
from stratac.tools.simulate.report import table, write_json


def _routings() -> tuple[str, ...]:
    from stratac.verify.routing import ROUTINGS
    return ROUTINGS


def cmd_simulate(args) -> int:
    try:
        machine = load_machine(args.machine)
        given = [v for v in (args.hidden, args.topk, args.experts, args.routing, args.max_recv,
                             args.capacity) if v is not None]
        moe = None
        if given:
            moe = MoeSpec(hidden=args.hidden or MOE_HIDDEN, topk=args.topk or MOE_TOPK,
                          experts=args.experts, routing=args.routing or "uniform", seed=args.seed,
                          max_recv=args.max_recv, capacity=args.capacity)
        elif args.seed:
            moe = MoeSpec(seed=args.seed)
        res = simulate_file(args.file, machine, args.world, args.sizes, args.dtype, args.root,
                            args.cores, args.tokens, moe)
    except SimulateError as exc:
        print(f"stratac simulate: error: {exc}", file=sys.stderr)
        return 1
    for line in table(res):
        print(line)
    if args.json:
        write_json(res, args.json)
        print(f"# wrote {args.json}")
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """Registers `stratac simulate` on an argparse subparsers object; the command is args.fn."""
    p = sub.add_parser("simulate", help="predict time and bus bandwidth of every schedule of a file "
                       "on a machine description (an analytic model, not a measurement)")
    p.add_argument("file")
    p.add_argument("--machine", required=True, metavar="TOML",
                   help="the machine description, e.g. machines/cloudmatrix384.toml")
    p.add_argument("--world", type=options.world_verified, required=True,
                   help=f"ranks (one die each; at most {options.MAX_WORLD:,})")
    p.add_argument("--sizes", type=options.size_sweep, default=None,
                   help="collectives: MIN:MAX doubling (MIN:MAX:FACTOR, or a comma list) of S in bytes "
                   f"(default {DEFAULT_SIZES})")
    p.add_argument("--dtype", choices=[d.short for d in ir.DType], default=None,
                   help=f"element type (default f32; MoE and AllToAllV: {MOE_DTYPE})")
    p.add_argument("--tokens", type=options.token_sweep, default=None, metavar="SPEC",
                   help=f"MoE/AllToAllV: tokens (rows) per rank, MIN:MAX doubling, MIN:MAX:FACTOR or a "
                   f"comma list (default {MOE_TOKENS})")
    p.add_argument("--hidden", type=options.positive_int, default=None,
                   help=f"MoE/AllToAllV: elements per token row (default {MOE_HIDDEN}, DeepSeek-V3)")
    p.add_argument("--topk", type=options.positive_int, default=None,
                   help=f"MoE: experts per token (default {MOE_TOPK}, DeepSeek-V3)")
    p.add_argument("--experts", type=options.positive_int, default=None,
                   help=f"MoE: experts over the whole world, a multiple of it (default "
                   f"{MOE_EXPERTS_PER_RANK} per rank: DeepSeek-V3's 256 at world 32)")
    p.add_argument("--max-recv", type=options.positive_int, default=None, metavar="ROWS",
                   help="MoE: rows per rank of a bounded window (e.g. examples/moe_prefill_bounded.strata; "
                   "default world x tokens x topk, any routing), or per expert of a window in regions "
                   "(per_expert(ROWS), e.g. examples/moe_prefill_experts.strata; default world x tokens); "
                   "a sample routing past it is an error")
    p.add_argument("--capacity", type=options.positive_int, default=None, metavar="SLOTS",
                   help="MoE: slots per (expert, source rank) of a slotted layout (e.g. "
                   "examples/moe_decode.strata; default the token count); a sample routing past it is "
                   "an error")
    p.add_argument("--routing", choices=_routings(), default=None,
                   help="MoE/AllToAllV: the sample routing (default uniform)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample routing (default 0)")
    p.add_argument("--root", type=int, default=0, help="the root, for broadcast and reduce")
    p.add_argument("--cores", type=options.positive_int, default=None,
                   help="vector cores per rank (default: all of the machine's)")
    p.add_argument("--json", metavar="OUT", help="write every prediction as JSON")
    p.set_defaults(fn=cmd_simulate)
    return p
