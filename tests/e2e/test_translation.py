"""Translation validation: every example and every corpus schedule the verifier accepts, at every
world from 1 to 9, runs on rank processes of the CPU build for every instance the verifier samples
there (its sizes, rank parameters, sample routings and masks), with the verifier's tags as inputs,
and every buffer of every rank (scratch too) must end as the verifier's simulated memory says,
element for element (tvkit.py says how tags become numbers). A kernel that differs from its proof
fails here, at the world where the two disagree.

One job of rank processes runs every selected world in turn (tv_ranks.py): as many processes as the
largest world, world w on a communicator over the first w of them, all its instances on that
communicator. The kernels are compiled, proven and built once, before the job starts, each
world's plan in a worker process (one per CPU: tvkit.plan_all). Every world is `slow` (tests/tiers.py).
"""

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tvkit  # noqa: E402

TEST = "test_every_accepted_schedule_runs_as_its_proof"


def _problems(plan: tvkit.Plan, out_dir: Path, errors: dict[int, str]) -> list[str]:
    """The disagreements of one world's ranks with the proof, one line each (errors: a rank's
    failure outside the instances, by rank)."""
    problems = [f"rank {r}: {e}" for r, e in sorted(errors.items())]
    for r in range(plan.world):
        out = out_dir / f"rank{r}.jsonl"
        seen = set()
        for line in out.read_text().splitlines() if out.exists() else ():
            rec = json.loads(line)
            seen.add(rec["k"])
            inst = plan.instances[rec["k"]]
            where = f"{plan.files[inst.file][0]}: {inst.schedule} ({inst.key}), rank {r}"
            if rec["error"]:
                problems.append(f"{where}: the call raised {rec['error']}")
            for w in rec["wrong"]:
                problems.append(
                    f"{where}: {'scratch ' if w['scratch'] else ''}buffer {w['buffer']}[{w['index']}] "
                    f"is {w['got']:g}, the verifier's simulated memory holds {w['expected']} "
                    f"({w['count']} elements of {w['buffer']} differ)")
        missing = len(plan.instances) - len(seen)
        if missing:
            problems.append(f"rank {r} reported {len(seen)} of {len(plan.instances)} instances")
    return problems


def run_job(parts: list[tuple[int, bool | None]], paths: list[Path], tmp: Path) -> dict:
    """Plans every part (world, masked) of `paths`, runs them all in one job of rank processes and
    returns, per part, (the disagreements, the plan, the seconds its ranks took)."""
    plans, job = {}, []
    for world, masked in parts:
        d = tmp / f"w{world}-{masked}"
        d.mkdir()
        job.append({"part": (world, masked), "world": world, "plan": str(d / "plan.pkl"), "out": str(d)})
    tvkit.plan_all([(*item["part"], Path(item["plan"])) for item in job], paths)
    for item in job:
        plans[item["part"]] = tvkit.read(Path(item["plan"]))
    with open(tmp / "job.pkl", "wb") as f:
        pickle.dump(job, f)
    size = max(world for world, _ in parts)
    # each rank's output goes to its own file, not a pipe: a pipe read one process after another
    # would stall the job once a rank not yet read filled its pipe while the others waited for it
    logs = [open(tmp / f"rank{r}.log", "w") for r in range(size)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "tv_ranks.py"), str(tmp / "job.pkl"), str(r),
                               str(tmp / "store")], stdout=logs[r], stderr=subprocess.STDOUT)
             for r in range(size)]
    budget = 600 + 2 * sum(len(p.instances) for p in plans.values())
    failed: dict[int, str] = {}
    deadline = time.monotonic() + budget
    try:
        for r, p in enumerate(procs):
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                err = (tmp / f"rank{r}.log").read_text(errors="replace")
                failed[r] = f"exited with {p.returncode}: {err.strip()[-2000:]}"
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        raise
    finally:
        for f in logs:
            f.close()
    out = {}
    for item in job:
        d = Path(item["out"])
        plan = plans[item["part"]]
        errors = {}
        for r in range(plan.world):
            if (d / f"rank{r}.error").exists():
                errors[r] = (d / f"rank{r}.error").read_text()
            elif not (d / f"rank{r}.started").exists():
                errors[r] = "did not run this part: the job had stopped in an earlier one"
            elif not (d / f"rank{r}.done").exists():
                errors[r] = f"stopped in this part: {failed.get(r, 'its process had not ended')}"
        for r in errors:
            failed.pop(r, None)      # said where it happened
        if item is job[-1]:          # a rank that failed after its last part: said there
            errors.update({r: f"failed after its last part: {e}" for r, e in failed.items()})
        times = d / "seconds"
        seconds = float(times.read_text()) if times.exists() else float("nan")
        out[item["part"]] = (_problems(plan, d, errors), plan, seconds)
    return out


def _report(plan: tvkit.Plan, seconds: float, masked: bool | None) -> None:
    part = {None: "", False: " (unmasked)", True: " (masked)"}[masked]
    line = (f"translation validation: world {plan.world}{part}: {len(plan.instances)} instances of "
            f"{sum(len(c) for _, c in plan.files)} schedules, run in {seconds:.1f} s (proofs, builds "
            f"and simulation before the job: {plan.seconds:.1f} s); {len(plan.empty)} "
            "instances with an empty tensor not run")
    print(line)
    log = os.environ.get("STRATAC_TV_LOG")   # the instance counts, for a report
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")


# (world, masked): the instances of a world, or (None) all of them; world 4 in two parts (its
# masked instances, every MoE sample under each of 14 masks, are three quarters of it)
PARTS = [(1, None), (2, None), (3, None), (4, False), (4, True)] + [(w, None) for w in range(5, 10)]


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    """The one job of rank processes for every part the session selected of this test."""
    parts = [(it.callspec.params["world"], it.callspec.params["masked"]) for it in request.session.items
             if getattr(it, "originalname", None) == TEST and it.module is request.module]
    return run_job(sorted(set(parts), key=PARTS.index), tvkit.EXAMPLES + tvkit.CORPUS,
                   tmp_path_factory.mktemp("tv"))


@pytest.mark.parametrize("world, masked", PARTS)
def test_every_accepted_schedule_runs_as_its_proof(world, masked, job):
    # every file, none left out: a disagreement found is fixed (or, while its fix is elsewhere, a
    # strict xfail naming its issue)
    problems, plan, seconds = job[(world, masked)]
    _report(plan, seconds, masked)
    assert plan.instances
    assert not problems, f"{len(problems)} disagreements with the proof at world {world}:\n" + \
        "\n".join(problems[:40])
