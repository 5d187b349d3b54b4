"""What a cold CPU build of each schedule costs by the entry points it holds: every one (one library,
what the NPU build and a second entry point on demand build), the one a call of f32 (sum) launches
(what a first call builds), and the three of the mutation test's cases (f32 sum, bf16 max, i32 sum:
what `stratac run` builds for such cases). Each build runs in an empty cache of its own (the CPU
model's entry copied in, so only the kernel is compiled), one after the other.

    python -m stratac.tools.bench.builds [FILE.strata ...]     (default: examples/*.strata)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from stratac import codegen
from stratac.ir import passes
from stratac.lang import frontend
from stratac.targets import cpu

SETS = {"all": None, "one": [("f32", "sum")], "three": [("f32", "sum"), ("bf16", "max"), ("i32", "sum")]}


def cold_build(out: codegen.Output, entries, model: Path) -> float:
    """Seconds of build_cpu(out, entries) in an empty cache holding only the model's entry."""
    saved = os.environ.get("STRATAC_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="stratac-builds-") as tmp:
        cache = Path(tmp) / "cache"
        cache.mkdir(mode=0o700)
        shutil.copytree(model, cache / model.name)
        os.environ["STRATAC_CACHE_DIR"] = str(cache)
        try:
            t0 = time.perf_counter()
            cpu.build_cpu(out, entries)
            return time.perf_counter() - t0
        finally:
            if saved is None:
                os.environ.pop("STRATAC_CACHE_DIR", None)
            else:
                os.environ["STRATAC_CACHE_DIR"] = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stratac.tools.bench.builds", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="schedule files (default: examples/*.strata)")
    a = ap.parse_args(argv)
    files = a.files or sorted(str(f) for f in Path("examples").glob("*.strata"))
    model = cpu.runtime_library().parent
    totals = dict.fromkeys(SETS, 0.0)
    print(f"{'schedule':36s} {'entries':>7s} " + " ".join(f"{k:>6s}" for k in SETS))
    for f in files:
        for s in frontend.schedules(frontend.load_source(f)):
            out = codegen.generate(passes.pipeline(s, passes.Options()))
            row = {k: cold_build(out, cpu.entries_for(out, uses), model) for k, uses in SETS.items()}
            for k, v in row.items():
                totals[k] += v
            print(f"{s.name:36s} {len(cpu.kernel_names(out)):7d} " + " ".join(f"{v:6.2f}" for v in row.values()),
                  flush=True)
    print(f"{'total':36s} {'':7s} " + " ".join(f"{v:6.1f}" for v in totals.values())
          + "   all/" + ", all/".join(f"{k} {totals['all'] / v:.2f}x" for k, v in totals.items() if k != "all"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
