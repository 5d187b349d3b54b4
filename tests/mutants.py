"""The mutation check (issue 16), run on demand, not by `pytest`:

    python tests/mutants.py                 every mutation
    python tests/mutants.py --list          the mutations and the tests that must catch them
    python tests/mutants.py NAME [NAME...]  some of them
    python tests/mutants.py --no-baseline   skip the run of the listed tests on the unmutated copy

Each mutation is a small, plausible bug in the source: (name, file, exact old text, new text, the
pytest node ids that must fail), plus, where one bug spans files (a constant the device library and
the host both hold), further (file, old text, new text) edits applied with it. For each one the
tracked tree (`git ls-files`) is copied to a temporary directory, the mutation's edits are applied
there (never in the checkout), and the listed tests are run in that copy with PYTHONPATH and
STRATAC_CACHE_DIR pointing into it, so that the copy's stratac, runtime/ and templates/ are the ones
built and run (the editable install points at the checkout).
A mutation is "caught" when every listed test fails, "SURVIVED" otherwise (the tests that passed are
named). The exit status is 1 if any mutation survived, 2 if the list itself is broken or the
baseline fails.

Why every listed test must fail, not just one: each test is listed because it is meant to pin the
mutated behaviour; one that passes on the mutant is a test that does not do what it is listed for.
Why a baseline: a test that fails on the unmutated copy (a missing tool, a broken checkout) would
otherwise count as a catch.

Why the old text must occur exactly once: a mutation whose text moved or changed would otherwise
mutate nothing (or the wrong place) and survive or pass for the wrong reason; the list cannot rot
silently. tests/test_mutants.py checks the same, and that every node id exists, on every suite run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str            # relative to the repository root
    old: str             # must occur exactly once in file
    new: str
    tests: tuple[str, ...]   # pytest node ids, every one of which must fail on the mutant
    why: str
    # further edits of the same bug, each (file, exact old text, new text), applied with the first
    # (a constant the device library and the host both hold changes in both)
    more: tuple[tuple[str, str, str], ...] = ()

    def edits(self) -> tuple[tuple[str, str, str], ...]:
        return ((self.file, self.old, self.new),) + self.more


CHECKS = "tests/e2e/test_checks_fail.py::"
FACTORS = "tests/bench/test_factors.py::"
BALANCE = "tests/e2e/test_balance.py::"
READABLE = "tests/codegen/test_readable.py::"
DEVICE = "runtime/device/strata_device.h"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "compare-case-always-equal", "stratac/tools/run/worker.py",
        '    first difference named (parameter, flat index, value, expected)."""\n    import torch\n',
        '    first difference named (parameter, flat index, value, expected)."""\n'
        '    return True, ""  # mutant\n    import torch\n',
        (CHECKS + "test_the_collective_check_names_a_changed_or_unwritten_element[allreduce_twoshot]",
         CHECKS + "test_the_collective_check_catches_a_clobbered_input",
         CHECKS + "test_run_says_wrong_names_the_element_and_exits_1",
         CHECKS + "test_bench_counts_corrupted_ranks_in_the_wrong_column"),
        "the rank worker calls every collective result equal: the end-to-end verdict is blind"),
    Mutation(
        "compare-moe-always-passes", "stratac/tools/run/worker.py",
        '    step applied), and y, each against torch."""\n    import torch\n',
        '    step applied), and y, each against torch."""\n    return True, ""  # mutant\n    import torch\n',
        (CHECKS + "test_the_moe_checks_name_a_changed_count_window_row_and_token[0-moe_prefill]",
         CHECKS + "test_the_moe_checks_name_a_changed_count_window_row_and_token[1-alltoallv]",
         CHECKS + "test_run_moe_says_wrong_for_a_count_a_window_row_and_a_combined_token",
         CHECKS + "test_bench_moe_counts_corrupted_ranks_in_the_wrong_column"),
        "the MoE counts, window and combine checks always pass"),
    Mutation(
        "busbw-factor-one", "stratac/tools/run/workload.py",
        "    def busbw_factor(self) -> float:\n        n, kind",
        "    def busbw_factor(self) -> float:\n        return 1.0  # mutant\n        n, kind",
        (FACTORS + "test_workload_factor_and_size_match_nccl_tests[allreduce_twoshot-3]",
         FACTORS + "test_workload_factor_and_size_match_nccl_tests[allgather_push-4]",
         FACTORS + "test_run_reports_nccl_size_and_factor[3]",
         FACTORS + "test_bench_records_algbw_and_busbw_by_nccl_tests[3]"),
        "busbw = algbw for every collective (only AllReduce at world 2 has factor 1)"),
    Mutation(
        "report-busbw-is-algbw", "stratac/tools/run/runner.py",
        '        busbw = algbw * r["busbw_factor"]\n',
        "        busbw = algbw  # mutant\n",
        (FACTORS + "test_run_table_prints_algbw_and_busbw_by_nccl_tests[3]",
         FACTORS + "test_run_table_prints_algbw_and_busbw_by_nccl_tests[4]"),
        "`stratac run`'s table drops the factor (Workload and the JSON keep it)"),
    Mutation(
        "partition-quadratic", "runtime/device/strata_device.h",
        "    lo_ = Min(total, blocks * c / n * per);\n    hi_ = Min(total, blocks * (c + 1) / n * per);\n",
        # core c gets blocks [B c^2/n^2, B (c+1)^2/n^2): every byte still covered once, results
        # right, but core c's share grows like 2c + 1 (max/mean 1.86 at 7 cores)
        "    lo_ = Min(total, blocks * c * c / (n * n) * per);  // mutant\n"
        "    hi_ = Min(total, blocks * (c + 1) * (c + 1) / (n * n) * per);\n",
        (BALANCE + "test_sdma_copies_split_evenly[0-f32-4099]",
         BALANCE + "test_aiv_copies_split_evenly[0-f32-4099]",
         BALANCE + "test_reductions_split_evenly[0-f32-4099-allreduce_oneshot]",
         BALANCE + "test_call_balance_is_the_ideal_one[f32-4099]"),
        "the kernels split a stage's bytes unevenly over the cores; every result stays right"),
    Mutation(
        "race-check-disabled", "stratac/verify/races.py",
        "            if conflict:\n                b, bev = conflict\n",
        "            if False and conflict:  # mutant\n                b, bev = conflict\n",
        ("tests/verify/test_corpus.py::test_corpus_file[verify/race_two_writers]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_same_part]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_read_write_across_ranks]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_within_stage]"),
        "the verifier never reports a race (entry/exit checks stay)"),
    Mutation(
        "async-closed-at-barrier", "stratac/verify/races.py",
        "                for e in range(epoch, last + 1):\n",
        "                for e in range(epoch, epoch + 1):  # mutant\n",
        ("tests/verify/test_corpus.py::test_corpus_file[verify/race_async_allreduce_out_of_place]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_async_allgather_ring_overlap]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_async_fetch_one_rank]",
         "tests/verify/test_corpus.py::test_corpus_file[verify/race_async_moe_counts]",
         "tests/verify/test_async_races.py::test_masked_moe_variants_race_with_two_live_ranks"),
        "a world barrier completes the asynchronous copies in flight across it (issue 23's bug)"),
    Mutation(
        "barriers-under-if-unstamped", "stratac/ir/passes.py",
        "            op = replace(op, then=then, orelse=orelse)\n",
        # the arms keep the stamp 0 the front end gives every barrier (the old bug that
        # test_stamps.py's todays_epoch_pass re-creates); the counts of barriers passed, and so
        # the stamps after the if, stay right
        "            pass  # mutant: barriers under ifs keep stamp 0\n",
        ("tests/verify/test_stamps.py::test_the_stamps_the_pass_makes_verify_in_full_and_against_the_source",
         "tests/e2e/test_sync_under_if.py::test_sync_under_if_runs_correctly[3-good_barriers_under_if.strata]",
         "tests/e2e/test_sync_under_if.py::test_sync_under_if_runs_correctly[2-good_ring_steps_under_if.strata]"),
        "the epoch pass leaves barriers under ifs at stamp 0: a barrier that waits for nobody"),
    # issue 15's "Done when": five regressions of the real device library the CPU build must refuse
    Mutation(
        "mover-reduces-bf16-in-bf16", DEVICE,
        "  static constexpr bool value = sizeof(T) == 2;   // half, bfloat16_t\n};\n",
        "  static constexpr bool value = sizeof(T) == 2;   // half, bfloat16_t\n};\n"
        "template <> struct IsWideAcc<bfloat16_t> {  // mutant: bfloat16_t reduced in bfloat16_t\n"
        "  static constexpr bool value = false;\n};\n",
        (READABLE + "test_kernels_compile_without_warnings",
         BALANCE + "test_reductions_split_evenly[0-bf16-1001-allreduce_oneshot]",
         BALANCE + "test_call_balance_is_the_ideal_one[bf16-1001]"),
        "the Mover's bf16 reductions skip the float accumulator: Muls/Add/Max/Min on bfloat16_t, "
        "which A2/A3 lack (a compile error of the model's dtype tables)"),
    Mutation(
        "sync-slots-unpadded", DEVICE,
        "constexpr int64_t kSyncSlotBytes = 64;\n"
        "constexpr int64_t kSyncSlotInts = kSyncSlotBytes / static_cast<int64_t>(sizeof(int32_t));\n"
        "#ifdef STRATA_CPU_MODEL\n"
        "static_assert(static_cast<uint64_t>(kSyncSlotBytes) == ::strata_cpu::kCacheLineBytes, "
        "\"one sync slot per D-cache line\");\n#endif\n",
        "constexpr int64_t kSyncSlotBytes = 4;  // mutant: packed 4-byte flags\n"
        "constexpr int64_t kSyncSlotInts = kSyncSlotBytes / static_cast<int64_t>(sizeof(int32_t));\n",
        ("tests/e2e/test_sync_under_if.py::test_sync_under_if_runs_correctly[2-good_barriers_under_if.strata]",
         "tests/e2e/test_sync_under_if.py::test_sync_under_if_runs_correctly[3-good_ring_steps_under_if.strata]",
         "tests/api/test_comm.py::test_scenario_process_group[interleaved]"),
        "barrier and flag slots packed 4 bytes apart again, in the device library and the host's "
        "sync-area size alike (the static_assert tying the slot to a D-cache line dropped): "
        "signals share a 64-byte line",
        more=(("stratac/codegen/abi.py", "SYNC_SLOT_BYTES = 64\n", "SYNC_SLOT_BYTES = 4  # mutant\n"),)),
    Mutation(
        "exscan-counts-scalar-gm", DEVICE,
        "        Fetch(row_s, counts + s * experts + a, m);\n"
        "        for (int64_t j = 0; j < m; ++j) {\n"
        "          const int32_t n = row_s.GetValue(static_cast<uint32_t>(j));\n",
        "        AscendC::GlobalTensor<int32_t> cs;  // mutant: counts read by scalar from GM, no flush\n"
        "        cs.SetGlobalBuffer(counts + s * experts + a, m);\n"
        "        for (int64_t j = 0; j < m; ++j) {\n"
        "          const int32_t n = cs.GetValue(j);\n",
        ("tests/api/test_comm.py::test_scenario_process_group[moe_interleaved]",
         "tests/e2e/test_moe.py::test_every_moe_example_runs_correctly[2]"),
        "the Router's Exscan reads the count table by scalar GetValue from GM (no DMA into UB, no "
        "flush): the second dispatch with another routing reads the first one's counts from the "
        "core's D-cache"),
    Mutation(
        "sdma-sqe-limit-past-depth", DEVICE,
        "constexpr uint32_t kSdmaSqeLimit = 192;    // outstanding SQEs per core before a quiet\n",
        "constexpr uint32_t kSdmaSqeLimit = 100000;  // mutant: past the queue depth\n",
        ("tests/e2e/test_moe.py::test_place_on_sdma_quiets_within_the_queue_depth",
         "tests/simulate/test_sdma.py::test_constants_match_the_kernel_and_the_cpu_model"),
        "the Mover no longer quiets before its SDMA queue fills: a place on sdma posts one tiny SQE "
        "per row, past the queue depth"),
    Mutation(
        "mover-store-cast-none", DEVICE,
        "      AscendC::Cast(acc_, accBuf_.template Get<float>(), AscendC::RoundMode::CAST_RINT, m);\n",
        "      AscendC::Cast(acc_, accBuf_.template Get<float>(), AscendC::RoundMode::CAST_NONE, m);  // mutant\n",
        (READABLE + "test_kernels_compile_without_warnings",
         BALANCE + "test_reductions_split_evenly[0-bf16-1001-allreduce_oneshot]",
         BALANCE + "test_call_balance_is_the_ideal_one[bf16-1001]"),
        "the Mover stores a 16-bit reduction with Cast(CAST_NONE): float -> bfloat16_t has no "
        "CAST_NONE on A2/A3 (Cast.md)"),
    Mutation(
        "await-h0-without-quiet", "templates/kernel.cpp.j2",
        "{{ pad }}strata::Await(mv_);\n",
        '{% if st.handle == "h0" %}{{ pad }}AscendC::SyncAll<true>();  // mutant: no quiet\n'
        "{% else %}{{ pad }}strata::Await(mv_);\n{% endif %}",
        ("tests/e2e/test_run.py::test_every_example_runs_correctly[3]",),
        "`await h0` no longer quiets (`await h1` still does): the ring's flag for h0's chunk is raised "
        "before the quiet of the SDMA copy it announces; the model's SDMA ledger refuses the next rank's "
        "SDMA read of it (audit 2 #7: this mutant survived a uniform SDMA delay)"),
)


class ListError(Exception):
    """The mutation list does not match the source (text not found, or found more than once)."""


def apply(m: Mutation, root: Path) -> None:
    """Every edit of m, each old text checked to occur exactly once before anything is written."""
    texts = {}
    for file, old, _new in m.edits():
        text = texts.get(file) or (root / file).read_text()
        n = text.count(old)
        if n != 1:
            raise ListError(f"{m.name}: the old text occurs {n} times in {file} (must be exactly once)")
        texts[file] = text.replace(old, _new)
    for file, text in texts.items():
        (root / file).write_text(text)


def tracked_files(root: Path = ROOT) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    return [f for f in out.stdout.decode().split("\0") if f]


def copy_tree(dst: Path) -> None:
    for rel in tracked_files():
        src = ROOT / rel
        if not src.is_file():   # deleted in the work tree but still tracked
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)


# A pytest plugin written into the copy: records each node id's outcome (failed if any phase failed),
# so the verdict does not depend on parsing pytest's text output.
PLUGIN = '''
import json, os
_out = {}
def pytest_runtest_logreport(report):
    prev = _out.get(report.nodeid)
    if report.failed:
        _out[report.nodeid] = "failed"
    elif report.skipped and prev is None:
        _out[report.nodeid] = "skipped"
    elif report.when == "call" and report.passed and prev is None:
        _out[report.nodeid] = "passed"
def pytest_collectreport(report):
    if report.failed:
        _out["collect-error:" + report.nodeid] = "failed"
def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["STRATAC_MUTANT_REPORT"], "w") as f:
        json.dump(_out, f)
'''


def run_tests(root: Path, tests: tuple[str, ...], tmp: Path, timeout: float) -> tuple[dict, str]:
    """Outcome per node id ('failed', 'passed', 'skipped', 'missing' or 'timeout'), and pytest's
    output tail."""
    (root / "_stratac_mutant_report.py").write_text(PLUGIN)
    report = tmp / "report.json"
    cache = tmp / "cache"
    cache.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root)] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p]), STRATAC_CACHE_DIR=str(cache),
        STRATAC_MUTANT_REPORT=str(report), PYTHONDONTWRITEBYTECODE="1")
    env.pop("STRATAC_TEST_CORRUPT", None)
    # the copy's stratac must be the one imported (and so its runtime/ and templates/ used)
    where = subprocess.run([sys.executable, "-c", "import stratac; print(stratac.__file__)"], cwd=root,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(root.resolve()):
        raise ListError(f"the copy imports stratac from {where}, not from {root}")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_stratac_mutant_report",
           *tests]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout,
                           check=False)   # failures are what we look for
        tail = (p.stdout + p.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {t: "timeout" for t in tests}, out[-4000:]
    got = json.loads(report.read_text()) if report.exists() else {}
    # a test module the mutant breaks at import fails collection: its tests were not run, and
    # that is a failure of theirs ("collect-error"), not a stale node id ("missing")
    broken = {k.split(":", 1)[1] for k in got if k.startswith("collect-error:")}
    return {t: got.get(t, "collect-error" if t.split("::")[0] in broken else "missing")
            for t in tests}, tail


def check_one(m: Mutation | None, tests: tuple[str, ...], timeout: float) -> tuple[dict, str]:
    with tempfile.TemporaryDirectory(prefix="stratac-mutant-") as d:
        tmp = Path(d)
        tree = tmp / "tree"
        copy_tree(tree)
        if m is not None:
            apply(m, tree)
        return run_tests(tree, tests, tmp, timeout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the mutations and their tests")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not first run the listed tests on the unmutated copy")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    a = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTATIONS}
    unknown = [n for n in a.names if n not in by_name]
    if unknown:
        print(f"unknown mutation(s): {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    chosen = [by_name[n] for n in a.names] if a.names else list(MUTATIONS)
    if a.list:
        for m in chosen:
            print(f"{m.name}  ({m.file}): {m.why}")
            for t in m.tests:
                print(f"    {t}")
        return 0
    # every mutation's text is checked before anything runs, so a stale entry fails fast
    try:
        for m in chosen:
            for file, old, _new in m.edits():
                n = (ROOT / file).read_text().count(old)
                if n != 1:
                    raise ListError(f"{m.name}: the old text occurs {n} times in {file} (must be exactly once)")
    except ListError as e:
        print(f"mutation list broken: {e}", file=sys.stderr)
        return 2
    if not a.no_baseline:
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        t0 = time.monotonic()
        res, tail = check_one(None, tests, a.timeout)
        bad = {t: r for t, r in res.items() if r != "passed"}
        print(f"baseline (unmutated copy, {len(tests)} tests, {time.monotonic() - t0:.0f} s): "
              + ("all pass" if not bad else f"{len(bad)} do not pass"), flush=True)
        if bad:
            for t, r in bad.items():
                print(f"    {r}: {t}")
            print(tail)
            return 2
    survived = 0
    for m in chosen:
        t0 = time.monotonic()
        try:
            res, tail = check_one(m, m.tests, a.timeout)
        except ListError as e:
            print(f"mutation list broken: {e}", file=sys.stderr)
            return 2
        missing = [t for t, r in res.items() if r == "missing"]
        if missing:   # a node id pytest did not collect: the list is stale
            print(f"mutation list broken: {m.name}: not collected: {missing}\n{tail}", file=sys.stderr)
            return 2
        escaped = [t for t, r in res.items() if r in ("passed", "skipped")]
        verdict = "SURVIVED" if escaped else "caught"
        survived += bool(escaped)
        print(f"{m.name:<30} {verdict:<8} ({time.monotonic() - t0:.0f} s) "
              + ", ".join(f"{t.split('::')[-1]}: {r}" for t, r in res.items()), flush=True)
        if escaped:
            print(f"    not caught by: {', '.join(escaped)}")
    print(f"{len(chosen) - survived} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
