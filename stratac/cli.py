"""The stratac command line. The only place that prints diagnostics or exits."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from stratac import codegen, ir, verify
from stratac.codegen.pipeline import compile_schedules
from stratac.diagnostics import Codes, StrataError, error
from stratac.ir import passes
from stratac.lang import frontend
from stratac.tools import options
from stratac.tools.simulate.command import add_parser as add_simulate_parser
from stratac.verify.routing import DESCRIPTIONS, ROUTINGS

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own exits with 2 and a usage line: keep that, no traceback
        self.print_usage(sys.stderr)
        print(f"stratac: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _options(args) -> passes.Options:
    return passes.Options(soc=args.soc, cores=args.cores)


def cmd_check(args) -> int:
    args.jobs = args.jobs or verify.default_jobs()
    source = frontend.load_source(args.file)
    schedules = frontend.schedules(source)
    status = EXIT_OK
    for s in schedules:
        t0 = time.perf_counter()
        results = verify.verify_worlds(s, args.world, jobs=args.jobs)
        for r in results:
            if r.skipped:
                print(f"{s.name}: world {r.world}: skipped ({r.skipped})")
        results = [r for r in results if not r.skipped]
        if not results:
            print(f"{s.name}: no world to verify (every world asked for is skipped)")
            continue
        if _first_failure(results):
            status = EXIT_FAIL
            continue
        print(f"{s.name}: verified {s.contract} for world {options.ranges_text(sorted({r.world for r in results}))} "
              f"({len(results)} instances, {sum(r.events for r in results)} events, "
              f"{time.perf_counter() - t0:.2f} s)")
        if not ir.takes_mask(s):
            continue
        t0 = time.perf_counter()
        masked = verify.verify_masks(s, [r.world for r in results])
        if _first_failure(masked):
            status = EXIT_FAIL
            continue
        if masked:
            worlds = sorted({r.world for r in masked})
            print(f"{s.name}: verified every mask of active ranks for world {options.ranges_text(worlds)} "
                  f"({len({(r.world, r.active) for r in masked})} masks, {len(masked)} instances, "
                  f"{time.perf_counter() - t0:.2f} s)")
    return status


def _first_failure(results) -> bool:
    """Prints the diagnostics of the first failed result, if any; whether there was one."""
    bad = next((r for r in results if not r.ok), None)
    for d in bad.diagnostics if bad else ():
        print(d.render(), file=sys.stderr)
    return bad is not None


def _output_dir(path: str) -> Path:
    """-o names a directory that compile creates or adds to. Checked before any verification, so
    that a wrong path costs nothing and leaves nothing half written."""
    out = Path(path)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        where = f"-o {out}" if existing == out else f"-o {out}: {existing}"
        raise StrataError(error(Codes.OUTPUT, f"{where} is a file, not a directory (compile writes "
                                "DIR/<schedule>/kernel.cpp, ...)"))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StrataError(error(Codes.OUTPUT, f"-o {out}: cannot write into {existing} (permission "
                                "denied)"))
    return out


def _write(out: codegen.Output, directory: Path) -> Path:
    try:
        return codegen.write(out, directory)
    except FileExistsError as exc:   # DIR/<schedule> is a file
        raise StrataError(error(Codes.OUTPUT, f"cannot write {exc.filename}/: a file of that name is in "
                                "the way")) from None
    except OSError as exc:   # what the check above cannot see: a read-only or special file system
        raise StrataError(error(Codes.OUTPUT, f"cannot write {exc.filename or directory}: "
                                f"{exc.strerror or exc}")) from None


def cmd_compile(args) -> int:
    opts = _options(args)
    opts.check()
    out_dir = _output_dir(args.output)
    schedules = [s for f in args.files for s in frontend.schedules(frontend.load_source(f))]
    for c in compile_schedules(schedules, opts, args.world):
        if args.dump_ir:
            print(ir.dump(c.schedule), end="")
        target = _write(c.output, out_dir)
        print(f"{c.schedule.name}: wrote {target}/{{kernel.cpp,launch.cpp,CMakeLists.txt,manifest.json}}",
              file=sys.stderr)
    return EXIT_OK


def cmd_run(args) -> int:
    from stratac.tools.run import runner
    if args.count is not None and args.size is not None:
        print("stratac: error: give --count or --size, not both", file=sys.stderr)
        return EXIT_USAGE
    elem = ir.DType.parse(args.dtype).nbytes
    if args.size is not None and (args.size == 0 or args.size % elem):
        # rounded to whole elements, the run would move other than the bytes asked and still say OK
        print(f"stratac: error: --size {args.size} is not a positive multiple of the {args.dtype} element "
              f"size ({elem} bytes): give a multiple of {elem}, e.g. "
              f"{max(elem, args.size - args.size % elem)}, or --count", file=sys.stderr)
        return EXIT_USAGE
    case = runner.Case(dtype=args.dtype, count=args.count,
                       size=args.size if args.size is not None else (None if args.count else 1 << 20),
                       op=args.op, root=args.root, tokens=args.tokens, hidden=args.hidden,
                       topk=args.topk, experts=args.experts, routing=args.routing,
                       max_recv=args.max_recv, capacity=args.capacity, params=dict(args.param))
    spec = runner.RunSpec(file=args.files, world=args.world, cases=[case], iters=args.iters,
                          timeout=args.timeout, check=args.check, seed=args.seed, soc=args.soc,
                          cores=args.cores, target=args.target, selected=args.selected,
                          selection=args.selection)
    outcome = runner.run(spec, echo=lambda line: print(line, file=sys.stderr))
    for line in runner.report(outcome, args.check):
        print(line)
    for f in outcome.failures:
        print(f"stratac: {f}", file=sys.stderr)
    return outcome.exit_code


def _bench_serving(args) -> int:
    """`stratac bench --moe`: the serving-shaped MoE sweep (stratac.tools.bench.serving)."""
    from stratac.tools.bench import serving
    if args.file is not None:
        print(f"stratac: error: --moe runs stratac's own decode and prefill schedules at serving shapes; "
              f"it takes no FILE (got {args.file}): for a file's MoE schedules drop --moe", file=sys.stderr)
        return EXIT_USAGE
    given = [o for o, v in (("--sizes", args.sizes), ("--hidden", args.hidden), ("--topk", args.topk),
                            ("--experts", args.experts), ("--vs", args.vs)) if v]
    if given:
        print(f"stratac: error: --moe fixes the shapes (hidden 7168 shrunk to fit, top-8, 256 experts) "
              f"and its peer (torch all_to_all_single); {', '.join(given)} do not apply", file=sys.stderr)
        return EXIT_USAGE
    if args.world is None:
        print("stratac: error: bench --moe needs --world", file=sys.stderr)
        return EXIT_USAGE
    sv = serving.Serving(world=args.world, iters=args.iters, warmup=args.warmup, seed=args.seed,
                         decode_tokens=args.tokens)
    lines, status = serving.run(sv, echo=lambda line: print(line, file=sys.stderr))
    for line in lines:
        print(line)
    return status


# the bench's flags --breakdown cannot honour: each names what it would need
_NOT_WITH_BREAKDOWN = (
    ("plot", "--plot", "the breakdown has no busbw curve to plot"),
    ("trace", "--trace", "the breakdown reads the model's cost accounting, not its trace"),
    ("selected", "--selected", "the breakdown measures every schedule of the file"),
    ("selection", "--selection", "the breakdown measures every schedule of the file"),
    ("agreement_cost", "--agreement-cost", "the breakdown builds each schedule once"),
    ("two_pass_places", "--two-pass-places", "the breakdown measures collectives only"),
    ("moe", "--moe", "the breakdown measures collectives only"),
    ("tokens", "--tokens", "the breakdown measures collectives at --sizes"),
    ("hidden", "--hidden", "the breakdown measures collectives at --sizes"),
    ("topk", "--topk", "the breakdown measures collectives at --sizes"),
    ("experts", "--experts", "the breakdown measures collectives at --sizes"),
    ("routing", "--routing", "the breakdown measures collectives at --sizes"),
    ("max_recv", "--max-recv", "the breakdown measures collectives at --sizes"),
    ("capacity", "--capacity", "the breakdown measures collectives at --sizes"),
    ("progress", "--progress", "the breakdown prints no progress bar"),
)
BREAKDOWN_SIZES = "4K,1M,64M"


def _bench_breakdown(args) -> int:
    """`stratac bench FILE --breakdown`: where a call's time goes (stratac.tools.bench.breakdown)."""
    from stratac.tools.bench import breakdown
    for key, flag, why in _NOT_WITH_BREAKDOWN:
        v = getattr(args, key, None)
        if v not in (None, False, [], ""):
            print(f"stratac: error: --breakdown cannot honour {flag}: {why}", file=sys.stderr)
            return EXIT_USAGE
    if args.file is None or args.world is None:
        print("stratac: error: bench --breakdown needs a FILE and --world", file=sys.stderr)
        return EXIT_USAGE
    peers = tuple(p.strip() for p in (args.vs or "").split(",") if p.strip())
    sizes = args.sizes or options.size_sweep(BREAKDOWN_SIZES)
    large = 16 << 20
    iters_large = max(3, args.iters // 4)
    try:
        bd = breakdown.run(args.file, args.world, sizes, dtype=args.dtype, op=args.op, root=args.root,
                           cores=args.cores, iters=args.iters, warmup=args.warmup, iters_large=iters_large,
                           large=large, timeout=args.timeout, soc=args.soc, peers=peers,
                           echo=lambda line: print(line, file=sys.stderr))
    except breakdown.BreakdownError as exc:
        print(f"stratac bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in breakdown.table(bd, all_ranks=args.all_ranks):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(breakdown.to_json(bd), indent=1))
        print(f"# wrote {args.json}")
    for f in bd.failures:
        print(f"stratac: {f}", file=sys.stderr)
    return bd.status


def cmd_bench(args) -> int:
    from stratac.tools.bench import benchspec, mpi, plot, report, sweep
    echo = lambda line: print(line, file=sys.stderr)
    if args.all_ranks and not args.breakdown:
        print("stratac: error: --all-ranks goes with --breakdown (the sweep's times are already the "
              "slowest rank's)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.setup_mpi:
            version = mpi.setup_mpi(echo)
            if args.file is None:
                print(f"MPI ready: {version}")
                return EXIT_OK
        if args.breakdown:
            return _bench_breakdown(args)
        if args.moe:
            return _bench_serving(args)
        if args.file is None:
            print("stratac: error: bench needs a FILE (or --moe, or --setup-mpi alone)", file=sys.stderr)
            return EXIT_USAGE
        if args.world is None:
            print("stratac: error: bench needs --world", file=sys.stderr)
            return EXIT_USAGE
        peers = [p.strip() for p in args.vs.split(",") if p.strip()] if args.vs else []
        progress = sys.stderr.isatty() if args.progress is None else args.progress
        spec = benchspec.BenchSpec(file=args.file, world=args.world, sizes=args.sizes, dtype=args.dtype,
                                   op=args.op, root=args.root, iters=args.iters, warmup=args.warmup,
                                   cores=args.cores, peers=peers, timeout=args.timeout, seed=args.seed,
                                   soc=args.soc, progress=progress, trace=args.trace,
                                   tokens=args.tokens, hidden=args.hidden, topk=args.topk,
                                   experts=args.experts, routings=args.routing,
                                   max_recv=args.max_recv, capacity=args.capacity,
                                   selected=args.selected, selection=args.selection,
                                   agreement_cost=args.agreement_cost,
                                   two_pass_places=args.two_pass_places)
        res = sweep.run(spec, echo=echo)
        for line in report.table(res):
            print(line)
        if args.json:
            report.write_json(res, args.json)
            print(f"# wrote {args.json}")
        if args.plot:
            plot.plot(res, args.plot)
            print(f"# wrote {args.plot}")
        if args.trace:
            print(f"# wrote {args.trace} ({res.meta['trace']['events']} spans; open it in "
                  "ui.perfetto.dev or chrome://tracing)")
    except benchspec.BenchError as exc:
        print(f"stratac bench: error: {exc}", file=sys.stderr)
        return exc.status
    for f in res.failures:
        print(f"stratac: {f}", file=sys.stderr)
    return res.exit_code


def cmd_tune(args) -> int:
    from stratac.tools import tune
    from stratac.tools.options import parse_sizes
    command = "stratac " + " ".join(args.argv)
    try:
        result, path = tune.run(args.file, args.world, args.sizes or parse_sizes(tune.DEFAULT_SIZES),
                                args.dtype, args.out, args.machine, args.iters, args.warmup, args.timeout,
                                command, echo=lambda line: print(line, file=sys.stderr))
    except tune.TuneError as exc:
        print(f"stratac tune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for line in tune.report(result, path):
        print(line)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from stratac.tools import doctor
    text, status = doctor.report()
    print(text)
    return status


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stratac", description="Verify .strata communication schedules and compile "
                "them to Ascend C kernels (and run them on the CPU model).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="verify every schedule of a file for some world sizes")
    c.add_argument("file")
    c.add_argument("--world", type=options.world_list, default=list(range(1, 17)),
                   help="world sizes: a list and ranges, e.g. 2,3,4,8 or 1-16 (default 1-16; at most "
                   f"{options.MAX_WORLD})")
    c.add_argument("-j", "--jobs", type=options.positive_int, default=None,
                   help="instances proven side by side, each in a worker process (default: one per "
                   "CPU, as many as the free memory holds at 6 GiB each)")
    c.set_defaults(fn=cmd_check)

    def selection_opts(q):
        q.add_argument("--selected", action="store_true",
                       help="call each contract's selecting entry point (mod.allreduce, ...), which "
                       "picks a schedule by size and world, instead of every schedule")
        q.add_argument("--selection", metavar="TABLE", help="the selection table (default: this machine's, "
                       "written by stratac tune, else the default rule)")

    def target_opts(q):
        q.add_argument("--soc", default=passes.DEFAULT_SOC, choices=sorted(passes.SOCS),
                       help=f"Ascend SoC (default {passes.DEFAULT_SOC})")
        q.add_argument("--cores", type=options.positive_int, default=None,
                       help="vector cores per launch (default: all of the SoC)")

    k = sub.add_parser("compile", help="verify, then generate Ascend C into DIR/<schedule>/")
    k.add_argument("files", nargs="+", metavar="FILE")
    k.add_argument("-o", "--output", required=True, metavar="DIR")
    k.add_argument("--world", type=options.world_list, default=list(range(1, 9)),
                   help="world sizes verified before generating code (default 1-8; at most "
                   f"{options.MAX_WORLD})")
    k.add_argument("--dump-ir", action="store_true", help="print the IR after the passes")
    target_opts(k)
    k.set_defaults(fn=cmd_compile)

    r = sub.add_parser("run", help="run every schedule of the files on WORLD local ranks")
    r.add_argument("files", nargs="+", metavar="file", help="one or more .strata files, run in one job")
    r.add_argument("--world", type=options.world_size, required=True)
    r.add_argument("--target", choices=["cpu", "npu"], default="cpu")
    r.add_argument("--count", type=options.positive_int, help="elements per rank of the input")
    r.add_argument("--size", type=options.byte_size, help="bytes (nccl-tests' S), e.g. 64M (default 1M)")
    r.add_argument("--dtype", choices=[d.short for d in ir.DType], default="f32")
    r.add_argument("--op", choices=["sum", "max", "min"], default="sum",
                   help="the reduction, for schedules with a redop parameter (default sum)")
    r.add_argument("--root", type=int, default=0, help="the root rank, for broadcast and reduce")
    r.add_argument("--param", type=options.param_value, action="append", default=[], metavar="NAME=D",
                   help="the value of a divisor parameter (a team's size, e.g. node=4), for the "
                        "schedules that take one; repeat for several")
    moe = r.add_argument_group("MoE dispatch/combine")
    moe.add_argument("--tokens", type=options.positive_int, help="tokens per rank (default 64)")
    moe.add_argument("--hidden", type=options.positive_int, help="elements per token (default 512)")
    moe.add_argument("--topk", type=options.positive_int, help="experts per token (default 4)")
    moe.add_argument("--experts", type=options.positive_int, help="experts in all, a multiple of --world "
                     "(default 4 per rank)")
    moe.add_argument("--max-recv", type=options.positive_int, help="rows per rank of a bounded "
                     "window (a schedule whose window's rows are a size of their own, e.g. "
                     "examples/moe_prefill_bounded.strata; default world x tokens x topk, any routing), "
                     "or rows per expert of a window in regions (per_expert(ROWS), e.g. "
                     "examples/moe_prefill_experts.strata; default world x tokens); "
                     "a routing past it is reported on every rank; refused for a file without one")
    moe.add_argument("--capacity", type=options.positive_int, help="slots per (expert, source rank) of "
                     "a slotted layout (a contract with a capacity, e.g. examples/moe_decode.strata; "
                     "default --tokens, any routing); a routing past it is refused before anything is "
                     "written; refused for a file without one")
    moe.add_argument("--routing", choices=list(ROUTINGS), default="uniform",
                     help="; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
    r.add_argument("--iters", type=options.positive_int, default=5)
    r.add_argument("--timeout", type=options.seconds, default=60.0,
                   help="seconds any wait may take (default 60); the whole run gets 60 s plus a few "
                   "timeouts per schedule")
    r.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare every result with torch (default on)")
    r.add_argument("--seed", type=int, default=0)
    selection_opts(r)
    target_opts(r)
    r.set_defaults(fn=cmd_run)

    b = sub.add_parser("bench", help="sweep sizes for every schedule of a file; nccl-tests style "
                       "figures, optionally against gloo and MPI, and the copies each engine made")
    b.add_argument("file", nargs="?")
    b.add_argument("--world", type=options.world_size)
    b.add_argument("--sizes", type=options.size_sweep, default=None,
                   help="MIN:MAX doubling (MIN:MAX:FACTOR, or a comma list) of S in bytes "
                   "(default 8:256M)")
    b.add_argument("--dtype", choices=[d.short for d in ir.DType], default="f32")
    b.add_argument("--op", choices=["sum", "max", "min"], default="sum")
    b.add_argument("--root", type=int, default=0, help="the root, for broadcast and reduce")
    b.add_argument("--iters", type=options.positive_int, default=20, help="timed calls per size (default 20)")
    b.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    b.add_argument("--vs", metavar="PEERS", help="also measure gloo, mpi and/or backend (dist.* over "
                   "the torch.distributed backend stratac against its direct call), e.g. --vs gloo,backend")
    b.add_argument("--setup-mpi", action="store_true",
                   help="install Open MPI (apt-get) and mpi4py (pip) if missing, then go on")
    b.add_argument("--json", metavar="OUT", help="write every figure as JSON")
    b.add_argument("--plot", metavar="OUT.png", help="busbw against size, one line per system")
    b.add_argument("--trace", metavar="OUT.json", help="a Chrome/Perfetto trace of one extra call per "
                   "schedule and size (ranks, cores, SDMA queues, stages, flag waits)")
    b.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (default: when stderr is a terminal)")
    b.add_argument("--timeout", type=float, default=120.0, help="seconds any wait may take")
    b.add_argument("--breakdown", action="store_true",
                   help="where a call's time goes, per schedule and size (default sizes "
                   f"{BREAKDOWN_SIZES}; from 16M a quarter of --iters): python, launch, core start, waits, "
                   "copies per engine, the model's deliberate costs as named terms, join; with --vs mpi, MPI's time "
                   "of the same collective beside it, as run and less those terms (docs/bench.md)")
    b.add_argument("--all-ranks", action="store_true",
                   help="with --breakdown: every rank's breakdown, not only rank 0's")
    b.add_argument("--seed", type=int, default=0)
    twin = b.add_mutually_exclusive_group()   # each builds every schedule once more, another way
    twin.add_argument("--agreement-cost", action="store_true",
                   help="also bench each schedule built without the ranks' agreement on every call, "
                   "as 'NAME (no agreement)', alternating with it: what the check costs (docs/bench.md)")
    twin.add_argument("--two-pass-places", action="store_true",
                   help="also bench each MoE pair built with the places of a dispatch's rows and of their "
                   "scales as two passes over the ids (not joined), as 'NAME (two passes)', right after "
                   "it: what joining them saves (docs/bench.md)")
    bm = b.add_argument_group("MoE dispatch/combine (a file of moe_dispatch/moe_combine or alltoallv "
                              "schedules sweeps tokens instead of --sizes)")
    bm.add_argument("--moe", action="store_true",
                    help="no FILE: dispatch and combine at serving shapes (decode 1-256 tokens per rank, "
                    "prefill 4096; hidden 7168 shrunk to fit, top-8, 256 experts) against torch's "
                    "all_to_all_single in the same run; --tokens sets the decode batches")
    bm.add_argument("--tokens", type=options.token_sweep, help="tokens per rank: MIN:MAX doubling, MIN:MAX:FACTOR "
                    "or a comma list (default 16:1024)")
    bm.add_argument("--hidden", type=options.positive_int, help="elements per token (default 512)")
    bm.add_argument("--topk", type=options.positive_int, help="experts per token (default 4)")
    bm.add_argument("--experts", type=options.positive_int, help="experts in all, a multiple of --world "
                    "(default 4 per rank)")
    bm.add_argument("--max-recv", type=options.positive_int, help="rows per rank of a bounded window "
                    "(default world x tokens x topk), or per expert of a window in regions "
                    "(per_expert(ROWS); default world x tokens); refused for a file without one")
    bm.add_argument("--capacity", type=options.positive_int, help="slots per (expert, source rank) of a "
                    "slotted layout (default: the tokens of each sweep point; refused for a file "
                    "without one)")
    bm.add_argument("--routing", type=options.routing_list, metavar="ROUTINGS",
                    help="a routing, a comma list, or all (default uniform): "
                    + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
    selection_opts(b)
    target_opts(b)
    b.set_defaults(fn=cmd_bench)

    t = sub.add_parser("tune", help="rank the schedules of each contract per message size (measured on "
                       "the CPU build, or predicted with --machine) and write the selection table the "
                       "selecting entry points (mod.allreduce, run/bench --selected) use")
    t.add_argument("file")
    t.add_argument("--world", type=options.world_verified, required=True,
                   help="measured: at most 384 ranks on this machine; predicted (--machine): at most 16,384")
    t.add_argument("--sizes", type=options.size_sweep, default=None,
                   help="sizes to rank the candidates at, in --sizes syntax (default 4K:64M:4)")
    t.add_argument("--dtype", choices=[d.short for d in ir.DType], default="f32")
    t.add_argument("--out", metavar="TABLE", help="the table to write or update (default: this machine's, "
                   "$STRATAC_CACHE_DIR/selection.json, which the Python API and run/bench read)")
    t.add_argument("--machine", metavar="TOML", help="predict with stratac simulate's model of this machine "
                   "description instead of measuring")
    t.add_argument("--iters", type=options.positive_int, default=20, help="timed calls per size (default 20; "
                   "sizes up to 256K take 10x as many, and 10x the warm-up calls)")
    t.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    t.add_argument("--timeout", type=options.seconds, default=120.0, help="seconds any wait may take")
    t.set_defaults(fn=cmd_tune)

    d = sub.add_parser("doctor", help="what this machine can build and run, and what is missing")
    d.set_defaults(fn=cmd_doctor)
    add_simulate_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        return args.fn(args)
    except StrataError as exc:
        for d in exc.diagnostics:
            print(d.render(), file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("stratac: interrupted", file=sys.stderr)
        return 130
