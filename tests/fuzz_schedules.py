"""The schedule fuzzer (issue 23): random well-formed schedules through the whole pipeline.

Each schedule tests/fuzz_gen.py generates goes through the front end, the verifier at worlds 1-4
(stratac.verify.verify_worlds, as `compile` proves them), then `stratac run` on the CPU build:

* at a world where it is VERIFIED, the ordinary run (the call's own proof included) must say OK
  against torch, or refuse the call before anything is written, or reject it while compiling
  (the IR after the passes). WRONG, a hang or a crashed rank is a DISAGREEMENT.
* at a world where it is REJECTED, it is built and run without the verifier
  (tests/verify/unverified_worker.py, as tests/verify/test_mutations.py's oracle test does). It
  should fail for the reason the verifier gave: a deadlock (E0302) hangs (the kernel's wait
  timeout), a race, exit or contract error (E0301, E0304, E0305) runs WRONG, a shape or
  world error (E02xx) is refused by the CPU model or the passes. A rejected schedule that runs OK
  at that world is recorded as "rejected but ran OK" (the verifier stricter than the run's inputs
  show, or a race the run did not lose): looked at, not a failure. One that fails otherwise
  (a race that hangs) is recorded as "rejected, failed otherwise".

A front-end rejection is a bug of the generator (it writes well-formed schedules only), and
counts as a disagreement.

Costs: building a kernel is the expensive step (g++, seconds per schedule); builds are cached by
their content (STRATAC_CACHE_DIR; the fuzzer keeps its own cache, STRATAC_FUZZ_CACHE, default
~/.cache/stratac-fuzz, so that the same derandomized cases are built once), and every case runs
at ONE verified world and ONE rejected world of 2-4 (taken in turn), one rank process per rank
for all of its dtypes and sizes.

    python tests/fuzz_schedules.py --cases 500 --seed 1        # a long run, with a report
    python tests/fuzz_schedules.py --cases 20 --no-run         # generate and verify only
    STRATAC_FUZZ_CASES=200 python -m pytest tests/verify/test_fuzz_schedules.py -m slow

A disagreement is minimised (choices set back to their correct option one at a time while the
disagreement stays) and printed with its source; save it in tests/verify/corpus/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz_gen  # noqa: E402
from stratac import verify  # noqa: E402
from stratac.diagnostics import Severity, Source, StrataError  # noqa: E402
from stratac.lang import frontend  # noqa: E402
from stratac.tools.run import runner  # noqa: E402

VERIFY_WORLDS = [1, 2, 3, 4]
RUN_WORLDS = [2, 3, 4]


def _mutations():
    spec = importlib.util.spec_from_file_location("fuzz_mutations", HERE / "verify" / "test_mutations.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


M = _mutations()   # run_mutant (the classifier), the unverified ranks


@dataclass
class Verdict:
    accepted: bool
    code: str = ""
    message: str = ""

    def __str__(self):
        return "verified" if self.accepted else f"{self.code}"


@dataclass
class Case:
    spec: fuzz_gen.Spec
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    frontend_error: str = ""
    runs: dict[tuple[int, bool], M.Outcome] = field(default_factory=dict)   # (world, verified) -> outcome
    findings: list[tuple[str, str]] = field(default_factory=list)            # (kind, detail)


def verdicts(text: str, name: str = "fuzz.strata") -> tuple[dict[int, Verdict], str]:
    try:
        scheds = frontend.schedules(Source(name, text))
    except StrataError as exc:
        return {}, exc.diagnostics[0].render()
    out = {}
    for w in VERIFY_WORLDS:
        out[w] = Verdict(True)
        for s in scheds:
            results = verify.verify_worlds(s, [w])
            if any(r.skipped for r in results):
                out[w] = Verdict(False, "requires", results[0].skipped)
                break
            bad = [r for r in results if not r.ok]
            if bad:
                d = next(d for d in bad[0].diagnostics if d.severity is Severity.ERROR)
                out[w] = Verdict(False, d.code, d.render())
                break
    return out, ""


@contextmanager
def unverified():
    """runner.run builds and starts ranks without the verifier (tests/verify/unverified_worker.py)."""
    saved = runner.compile_schedules, runner.Rank
    runner.compile_schedules = M._unverified_worker().compile_unverified
    runner.Rank = M._UnverifiedRanks()
    try:
        yield
    finally:
        runner.compile_schedules, runner.Rank = saved


# what a run of a rejected schedule should say, by the verifier's code
EXPECTED = {"E0302": ("HANG",), "E0301": ("WRONG", "FAILED"),
            "E0304": ("WRONG", "FAILED"), "E0305": ("WRONG", "FAILED"), "E0306": ("WRONG", "FAILED", "HANG")}


def collective_cases(world: int) -> list[runner.Case]:
    """Fewer than test_mutations' (a build is per schedule, but every case is a check of every
    rank): one element (fewer than ranks, a root at the end) and an uneven split above the UB tile
    in i32 (exact under any order of additions, a root in the middle)."""
    return [runner.Case("f32", count=1, op="sum", root=world - 1),
            runner.Case("i32", count=4099, op="max", root=world // 2)]


MOE_CASES = [runner.Case("f32", tokens=37, hidden=33, topk=2, routing="uniform"),
             runner.Case("bf16", tokens=29, hidden=7, topk=4, routing="sparse")]


def run(text: str, name: str, world: int, verified: bool, tmp: Path) -> M.Outcome:
    """test_mutations.run_mutant with the cases above; without the verifier when not `verified`."""
    saved = M.collective_cases, M.MOE_CASES
    M.collective_cases, M.MOE_CASES = collective_cases, MOE_CASES
    try:
        if verified:
            got = M.run_mutant(text, name, world, tmp, timeout=30.0)
        else:
            with unverified():
                got = M.run_mutant(text, name, world, tmp, timeout=3.0)
    finally:
        M.collective_cases, M.MOE_CASES = saved
    return refused(got)


REFUSAL = ("nothing was written", "refused before anything was written")


def refused(got: M.Outcome) -> M.Outcome:
    """A rank stopped at the run's overall deadline is a hang (run_mutant's HANG looks for the
    kernel's "timed out" only; on a loaded machine the deadline can come first). run_mutant's
    REFUSED looks for "nothing was written" only; the proof of a call's instance says "refused
    before anything was written" (stratac/host/instance.py). Every failed rank saying either is
    a refusal."""
    if got.kind != "FAILED":
        return got
    if "still running at the run's deadline" in got.detail:   # the runner's deadline caught a hang
        return M.Outcome("HANG", got.detail)
    blocks = re.split(r"\n(?=rank \d+ (?:exited|was killed)|rank \d+: .*; stopped)", got.detail)
    if blocks and all(any(p in b for p in REFUSAL) for b in blocks):
        return M.Outcome("REFUSED", got.detail)
    return got


def worlds_to_run(case: Case, index: int) -> tuple[int | None, int | None]:
    """The verified world and the rejected world (of RUN_WORLDS) the case runs at, taken in turn
    by `index`; None where there is none."""
    good = [w for w in RUN_WORLDS if case.verdicts[w].accepted]
    bad = [w for w in RUN_WORLDS if not case.verdicts[w].accepted and case.verdicts[w].code != "requires"]
    return (good[index % len(good)] if good else None, bad[index % len(bad)] if bad else None)


def judge(case: Case, tmp: Path, index: int, do_run: bool = True,
          verified_run: M.Outcome | None = None) -> Case:
    """Verdicts, then one run at a verified world and one at a rejected world (worlds_to_run),
    and the findings. `verified_run`: the verified world's outcome, when a batch ran it."""
    case.verdicts, case.frontend_error = verdicts(case.spec.text)
    if case.frontend_error:
        case.findings.append(("generator: front-end rejection", case.frontend_error))
        return case
    if not do_run:
        return case
    name = f"fz{index}-{case.spec.family}"
    good, bad = worlds_to_run(case, index)
    if good is not None:
        w = good
        got = verified_run or run(case.spec.text, name, w, True, tmp)
        case.runs[(w, True)] = got
        if got.kind not in M.FINE:
            case.findings.append(("DISAGREEMENT: verified, then " + got.kind, f"world {w}:\n{got.detail}"))
        elif got.kind != "OK":   # `check`'s samples missed what the call's own instance shows
            case.findings.append((f"verified at the samples, {got.kind} at the call", f"world {w}:\n{got.detail}"))
    if bad is not None:
        w = bad
        v = case.verdicts[w]
        got = run(case.spec.text, name, w, False, tmp)
        case.runs[(w, False)] = got
        want = EXPECTED.get(v.code)
        if got.kind == "OK":
            case.findings.append(("rejected but ran OK", f"world {w}: {v.code}\n{v.message}"))
        elif want is not None and got.kind not in want:
            case.findings.append((f"rejected ({v.code}), failed otherwise ({got.kind})",
                                  f"world {w}: {v.message}\n{got.detail}"))
    return case


# the schedule names the generator uses; a batch renames them apart
GENERATED_NAMES = re.compile(r"\b(fz|fz_dispatch|fz_combine|ring_allreduce)\b")
BATCH = 6


def run_batch(items: list[tuple[int, Case]], world: int, tmp: Path) -> dict[int, M.Outcome]:
    """The verified runs of several collective cases at one world in ONE `stratac run` (one set of
    rank processes, one file of every case's schedules, renamed `NAME_bI`). OK: every case is OK;
    WRONG: the cases none of whose schedules is wrong are OK. Every other case (a wrong one, or
    all of them after a hang, a crash or a refusal) gets nothing here, and runs alone: a finding
    is always a run of its own schedule alone."""
    text = "\n".join(GENERATED_NAMES.sub(lambda m: f"{m.group(1)}_b{i}", c.spec.text) for i, c in items)
    got = run(text, f"batch{items[0][0]}-w{world}", world, True, tmp)
    if got.kind == "OK":
        return {i: got for i, _ in items}
    if got.kind != "WRONG":
        return {}
    lines = got.detail.splitlines()
    return {i: M.Outcome("OK") for i, _ in items
            if not any(re.match(rf"\w+_b{i} rank ", ln) for ln in lines)}


def disagrees(case: Case) -> bool:
    return any(k.startswith(("DISAGREEMENT", "generator")) for k, _ in case.findings)


def minimise(case: Case, tmp: Path, index: int, still) -> fuzz_gen.Spec:
    """Set the case's choices back to 0 one at a time while `still(new case)` holds."""
    choices = dict(case.spec.choices)
    for k in sorted(choices, key=lambda k: (not k.startswith("~"), k)):
        if not choices.get(k):
            continue
        trial = dict(choices, **{k: 0})
        spec = fuzz_gen.replay(case.spec.family, trial)
        if still(judge(Case(spec), tmp, index)):
            choices = spec.choices
    return fuzz_gen.replay(case.spec.family, choices)


def summarise(cases: list[Case]) -> dict:
    s = {"cases": len(cases), "families": dict(Counter(c.spec.family for c in cases)),
         "frontend_rejected": sum(bool(c.frontend_error) for c in cases),
         "verified_at_every_world": sum(bool(c.verdicts) and all(v.accepted for v in c.verdicts.values())
                                        for c in cases),
         "rejected_at_some_world": sum(any(not v.accepted and v.code != "requires" for v in c.verdicts.values())
                                       for c in cases),
         "runs_total": sum(len(c.runs) for c in cases)}
    reasons = Counter()   # per case, each code it was rejected with at some world ("requires": skipped)
    for c in cases:
        codes = {v.code for v in c.verdicts.values() if not v.accepted}
        for code in codes:
            reasons[code] += 1
    s["rejected_by_code"] = dict(sorted(reasons.items()))
    runs = Counter()
    for c in cases:
        for (w, ok), o in c.runs.items():
            runs[("verified" if ok else "rejected") + " -> " + o.kind] += 1
    s["runs"] = dict(sorted(runs.items()))
    s["findings"] = dict(Counter(k for c in cases for k, _ in c.findings))
    return s


def campaign(n: int, seed: int | None, do_run: bool, tmp: Path, log=print, families=None,
             deadline: float | None = None, batch: int = BATCH) -> list[Case]:
    """Up to `n` cases drawn by hypothesis (derandomized when seed is None, else seeded); a
    schedule drawn again is not judged again (the cases are the distinct ones). Cases are judged
    `batch` at a time: the verified runs of their collective schedules share one run per world
    (run_batch), the rest run alone."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    cases: list[Case] = []
    seen: set[str] = set()   # hypothesis draws some schedules more than once: judged once
    pending: list[Case] = []

    def flush():
        t0 = time.monotonic()
        first = len(cases)
        todo = [(first + k, c) for k, c in enumerate(pending)]
        pending.clear()
        shared: dict[int, M.Outcome] = {}
        if do_run and batch > 1:
            groups: dict[int, list] = {}
            for i, c in todo:
                c.verdicts, c.frontend_error = verdicts(c.spec.text)
                if c.frontend_error or c.spec.family.startswith("moe"):
                    continue
                good, _ = worlds_to_run(c, i)
                if good is not None:
                    groups.setdefault(good, []).append((i, c))
            for w, items in groups.items():
                if len(items) > 1:
                    shared.update(run_batch(items, w, tmp))
        for i, c in todo:
            judge(c, tmp, i, do_run, shared.get(i))
            cases.append(c)
            runs = ", ".join(f"w{w} {'verified' if ok else 'rejected'}: {o.kind}"
                             f"{' (batch)' if ok and i in shared else ''}" for (w, ok), o in c.runs.items())
            log(f"[{i + 1}] {c.spec.family} {dict(c.spec.mistakes)} verdicts "
                f"{ {w: str(v) for w, v in c.verdicts.items()} } {runs}")
            for k, d in c.findings:
                log(f"    {k}: {d.splitlines()[0] if d else ''}")
        if todo:
            log(f"    ({len(todo)} cases in {time.monotonic() - t0:.1f} s)")

    @settings(max_examples=n, deadline=None, database=None, derandomize=seed is None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(fuzz_gen.schedules(families))
    def one(spec):
        if deadline is not None and time.monotonic() > deadline:
            raise _Deadline   # ends hypothesis' loop (returning would draw every remaining case)
        if spec.text in seen:
            return
        seen.add(spec.text)
        pending.append(Case(spec))
        if len(pending) >= batch:
            flush()

    if seed is not None:
        one = hseed(seed)(one)
    try:
        one()
    except _Deadline:
        pass
    flush()
    return cases


class _Deadline(Exception):
    pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=int(os.environ.get("STRATAC_FUZZ_CASES", "50")))
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: derandomized)")
    ap.add_argument("--no-run", action="store_true", help="generate and verify only")
    ap.add_argument("--family", action="append", help="only these families (repeatable)")
    ap.add_argument("--minutes", type=float, default=None, help="stop drawing cases after this long")
    ap.add_argument("--json", help="write the summary and every finding here")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help=f"cases judged together, their verified runs sharing rank processes (default {BATCH})")
    args = ap.parse_args(argv)
    os.environ.setdefault("STRATAC_CACHE_DIR", os.environ.get(
        "STRATAC_FUZZ_CACHE", str(Path.home() / ".cache" / "stratac-fuzz")))
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    with tempfile.TemporaryDirectory(prefix="stratac-fuzz-") as tmp:
        t0 = time.monotonic()
        cases = campaign(args.cases, args.seed, not args.no_run, Path(tmp), families=args.family,
                         deadline=deadline, batch=args.batch)
        summary = summarise(cases)
        summary["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps(summary, indent=2))
        bad = [c for c in cases if disagrees(c)]
        report = []
        for i, c in enumerate(bad):
            kinds = {k for k, _ in c.findings}
            small = minimise(c, Path(tmp), i, lambda n: bool({k for k, _ in n.findings} & kinds))
            print(f"\n==== disagreement {i + 1}: {sorted(kinds)}; minimised choices {small.mistakes}")
            print(small.text)
            for k, d in c.findings:
                print(f"  {k}: {d}")
            report.append({"family": c.spec.family, "choices": small.choices, "text": small.text,
                           "findings": c.findings})
        others = [{"family": c.spec.family, "choices": c.spec.choices, "text": c.spec.text,
                   "findings": c.findings} for c in cases if c.findings and not disagrees(c)]
        if args.json:
            Path(args.json).write_text(json.dumps({"summary": summary, "disagreements": report,
                                                   "other_findings": others}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
