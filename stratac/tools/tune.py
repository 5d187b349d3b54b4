"""`stratac tune`: rank the schedules of a file that implement one contract, per message size and
world, and write the selection table the selecting entry points use (stratac.host.select).

In: a .strata file, a world, sizes, and either nothing (MEASURE on the CPU build, through the
bench's sweep: stratac.tools.bench.sweep, real rank processes, every result checked against torch)
or a machine description (PREDICT with `stratac simulate`'s model: stratac.tools.simulate).
Out: per contract, the candidates' times at every size, the crossover points (where the fastest
changes), and the table: rows of sizes (up to the geometric mean of two measured sizes) with the
candidates fastest first, with provenance (machine, world, date, command, method), merged into
the table file (entries of other contracts, worlds or dtypes are kept).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from pathlib import Path

from stratac.host import select
from stratac.tools.options import MAX_RUN_WORLD

DEFAULT_SIZES = "4K:64M:4"


class TuneError(Exception):
    """What tune cannot do, in one message (the CLI prints it: exit status 2)."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def this_machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} CPUs, {_cpu_model()}, CPU build of stratac (the CPU model)"


# Sizes up to SMALL take SMALL_FACTOR times the calls: a call there costs microseconds, so the
# median needs many of them to rise above the machine's noise (a few descheduled calls), and they
# cost little.
SMALL, SMALL_FACTOR = 256 << 10, 10


def measure(file: str, world: int, sizes: list[int], dtype: str, iters: int, warmup: int,
            timeout: float, echo) -> dict[str, dict[str, dict[int, float]]]:
    """kind -> schedule -> size -> median time (us), measured by the bench's sweep (no peers): one
    sweep of the sizes up to SMALL with SMALL_FACTOR x iters and warmup calls, one of the others."""
    from stratac.tools.bench import benchspec, sweep
    out: dict = {}
    small = [s for s in sizes if s <= SMALL]
    for group, factor in ((small, SMALL_FACTOR), ([s for s in sizes if s > SMALL], 1)):
        if not group:
            continue
        spec = benchspec.BenchSpec(file=file, world=world, sizes=group, dtype=dtype, iters=iters * factor,
                                   warmup=warmup * factor, timeout=timeout, ceiling=False)
        try:
            res = sweep.run(spec, echo=echo)
        except benchspec.BenchError as exc:
            raise TuneError(str(exc)) from None
        if res.failures or res.exit_code:
            raise TuneError("the measurement failed: " + "; ".join(res.failures or ["a result was wrong"]))
        for r in res.records:
            if r["system"] == "stratac" and r["time_us"] is not None:
                out.setdefault(r["kind"], {}).setdefault(r["schedule"], {})[r["size"]] = r["time_us"]
    return out


def predict(file: str, machine_file: str, world: int, sizes: list[int], dtype: str) -> tuple[dict, str]:
    """The same from `stratac simulate`'s model of machine_file; and the machine's name."""
    from stratac.tools.simulate.driver import simulate_file
    from stratac.tools.simulate.machine import SimulateError, load_machine
    try:
        m = load_machine(machine_file)
        res = simulate_file(file, m, world, sizes, dtype)
    except SimulateError as exc:
        raise TuneError(str(exc)) from None
    out: dict = {}
    for p in res.predictions:
        if not p.moe:
            out.setdefault(p.kind, {}).setdefault(p.schedule, {})[p.size] = p.time_us
    return out, m.name


def entry(kind: str, world: int, dtype: str, times: dict[str, dict[int, float]], method: str) -> dict:
    """The table entry of one contract: rows of sizes with the candidates fastest first."""
    sizes = sorted(set.intersection(*(set(t) for t in times.values())))
    ranked = [sorted(times, key=lambda n: (times[n][s], n)) for s in sizes]
    rows = []
    for i, s in enumerate(sizes):
        upto = int(math.sqrt(s * sizes[i + 1])) if i + 1 < len(sizes) else None
        if rows and rows[-1]["order"] == ranked[i]:
            rows[-1]["upto"] = upto
        else:
            rows.append({"upto": upto, "order": ranked[i]})
    crossovers = [{"between": [sizes[i], sizes[i + 1]], "from": ranked[i][0], "to": ranked[i + 1][0]}
                  for i in range(len(sizes) - 1) if ranked[i][0] != ranked[i + 1][0]]
    return {"kind": kind, "world": world, "dtype": dtype, "method": method, "rows": rows,
            "crossovers": crossovers, "sizes": sizes,
            "time_us": {n: [round(times[n][s], 2) for s in sizes] for n in sorted(times)}}


def run(file: str, world: int, sizes: list[int], dtype: str, out: str | None, machine: str | None,
        iters: int, warmup: int, timeout: float, command: str, echo=print) -> tuple[dict, Path]:
    from stratac.lang.frontend import load_source, schedules
    kinds = [s.contract.kind for s in schedules(load_source(file))]
    if all(k.moe for k in kinds):
        raise TuneError(f"{file} has no collective schedule to rank (MoE dispatch/combine and AllToAllV "
                        "are called by name)")
    if any(k.moe for k in kinds) and not machine:
        raise TuneError(f"{file} mixes collectives with MoE or AllToAllV schedules, which the bench sweeps "
                        "by tokens, not sizes: tune a file of the collectives alone")
    if not machine and world > MAX_RUN_WORLD:
        raise TuneError(f"world {world} is above {MAX_RUN_WORLD}, the most ranks stratac starts on this "
                        "machine: rank the schedules at that world by prediction (--machine TOML)")
    if machine:
        times, name = predict(file, machine, world, sizes, dtype)
        method, where = f"predicted by stratac simulate --machine {machine}", name
    else:
        times = measure(file, world, sizes, dtype, iters, warmup, timeout, echo)
        method, where = "measured on the CPU build (stratac bench's sweep, median of the slowest rank)", \
            this_machine()
    if not times:
        raise TuneError(f"{file} has no collective schedule to rank (MoE dispatch/combine and AllToAllV "
                        "are called by name)")
    entries = [entry(kind, world, dtype, t, method) for kind, t in sorted(times.items())]
    path = Path(out) if out else select.default_table_path()
    old = None
    if path.exists():
        try:
            old = select.load_table(path)
        except Exception as exc:   # noqa: BLE001 - a table we cannot read is replaced, said so
            echo(f"stratac tune: replacing {path}: {exc}")
    prov = {"machine": where, "world": world, "date": datetime.datetime.now().astimezone().isoformat(
        timespec="seconds"), "command": command, "method": method, "file": str(file)}
    for e in entries:
        e["provenance"] = prov
    table = select.merge(old, entries, prov)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return {"entries": entries, "provenance": prov}, path


def fmt_size(n: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return str(n)


def report(result: dict, path: Path) -> list[str]:
    lines = []
    prov = result["provenance"]
    lines.append(f"# stratac tune: {prov['method']}; {prov['machine']}; world {prov['world']}")
    for e in result["entries"]:
        names = sorted(e["time_us"])
        lines.append(f"# {e['kind']}, world {e['world']}, {e['dtype']}: time (us) per candidate, fastest marked *")
        lines.append(f"  {'size':>8} " + " ".join(f"{n:>28}" for n in names))
        for i, s in enumerate(e["sizes"]):
            best = min(names, key=lambda n: (e["time_us"][n][i], n))
            cells = [f"{e['time_us'][n][i]:>27.1f}{'*' if n == best else ' '}" for n in names]
            lines.append(f"  {fmt_size(s):>8} " + " ".join(cells))
        if e["crossovers"]:
            for c in e["crossovers"]:
                lines.append(f"  crossover between {fmt_size(c['between'][0])} and {fmt_size(c['between'][1])}: "
                             f"{c['from']} -> {c['to']}")
        else:
            lines.append(f"  no crossover: {e['rows'][0]['order'][0]} is fastest at every size")
        for r in e["rows"]:
            upto = f"<= {fmt_size(r['upto'])}" if r["upto"] is not None else "larger"
            lines.append(f"  row {upto:>10}: {', '.join(r['order'])}")
    lines.append(f"# wrote {path}")
    return lines
