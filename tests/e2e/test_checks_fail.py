"""The oracles fed wrong answers (issue 16): every check that end-to-end tests trust (`ok`, `OK`,
`#wrong`) is shown to say WRONG when a result is wrong, and to name what is wrong.

Two ways in, both through the code `stratac run` and `stratac bench` use:
  * in-process: the rank worker's own comparisons (worker._compare_case for collectives,
    worker._compare_moe for MoE) called on what a correct kernel leaves, then on the same tensors
    with one element changed;
  * end to end: the test hook STRATAC_TEST_CORRUPT=RANK[,RANK...]:NAME:INDEX (tests/README.md),
    read only by the worker, adds 1 to one element of one rank's tensor after the kernel and before
    the check; the real CLI must then print WRONG for that schedule, name the element (rank,
    index, got, expected) and exit 1, and the bench must count the corrupted ranks in #wrong.
The expected values in the assertions come from stratac.tools.run.workload at the run's seed (0),
so a message naming the wrong element or the wrong value fails the test. Small counts, worlds 2
and 3, two cores: no timing anywhere.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stratac.lang.frontend import load_source, schedules
from stratac.tools.run import worker
from stratac.tools.run.workload import SENTINEL, MoeWorkload, Workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
COLLECTIVES = [p for p in sorted(EXAMPLES.glob("*.strata"))
               if not any(s.contract.kind.moe for s in schedules(load_source(str(p))))]
SEED = 0   # what `stratac run` and `stratac bench` use without --seed


def _sched(path: Path, name: str | None = None):
    ss = schedules(load_source(str(path)))
    return ss[0] if name is None else next(s for s in ss if s.name == name)


def _cli(*args: str, corrupt: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != worker.TEST_CORRUPT_ENV}
    if corrupt is not None:
        env[worker.TEST_CORRUPT_ENV] = corrupt
    return subprocess.run([sys.executable, "-m", "stratac", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env, check=False)


# ---- the collective check, in process ----

def _correct(wl: Workload, rank: int) -> dict[str, torch.Tensor]:
    """What a correct kernel leaves on `rank`: the reference where the contract defines a value
    (`Workload.defined`: all of a parameter, but block `rank` of an in-place ReduceScatter's x),
    the sentinel where it says nothing (an unchecked element must not matter)."""
    out = {}
    for p in wl.schedule.tensors:
        out[p.name] = torch.full((wl.numel(p),), float(SENTINEL))
        want = wl.expected(p.name, rank, SEED, torch.float32)
        if want is not None:
            out[p.name][wl.defined(p.name, rank)] = want
    return out


@pytest.mark.parametrize("path", COLLECTIVES, ids=lambda p: p.stem)
def test_the_collective_check_names_a_changed_or_unwritten_element(path):
    """Every collective example at world 3 (root 1, so a rooted contract has ranks on both sides of
    the root): the check passes what a correct kernel leaves, then fails on one changed element of
    the output and on one element left at the sentinel, naming parameter, index, rank and values."""
    s = _sched(path)
    world, count = 3, 37
    wl = Workload(s, world, count, op="sum", root=1)
    out_name = s.contract.outputs[0]
    checked_ranks = [r for r in range(world) if wl.expected(out_name, r, SEED, torch.float32) is not None]
    assert checked_ranks, "the contract defines the output on some rank"
    for rank in checked_ranks:
        tensors = _correct(wl, rank)
        assert worker._compare_case(wl, tensors, rank, SEED, torch.float32) == (True, "")
        want = tensors[out_name].clone()
        # the elements the contract defines (an in-place ReduceScatter: block `rank` of x alone),
        # by their index in the whole parameter, which the message names
        where = torch.arange(want.numel())[wl.defined(out_name, rank)]
        i = int(where[-2])   # not the first element: the index in the message must be the real one
        tensors[out_name][i] += 1
        ok, why = worker._compare_case(wl, tensors, rank, SEED, torch.float32)
        assert not ok
        assert why == (f"{out_name}[{i}] = {want[i].item() + 1} on rank {rank}, expected "
                       f"{want[i].item()} (1 elements differ)")
        tensors[out_name].copy_(want)
        j = int(where[3])
        tensors[out_name][j] = SENTINEL   # an element the kernel never wrote
        if want[j].item() != SENTINEL:
            ok, why = worker._compare_case(wl, tensors, rank, SEED, torch.float32)
            assert not ok and why.startswith(f"{out_name}[{j}] = {float(SENTINEL)} on rank {rank}"), why


IN_PLACE_RS = """
schedule rs(x: sym T[n * world], op: redop) implements reducescatter(x, op) {
  blk = split(x, world)
  barrier
  on aiv: blk[rank] = op(blk[rank]@p for p in ranks)
  barrier
}
"""


def test_an_in_place_reducescatter_is_checked_in_its_block_and_nowhere_else():
    """In place, ReduceScatter defines block `rank` of x alone: a change there is named with its
    index in x, anything elsewhere (the schedule's to use) passes."""
    from stratac.diagnostics import Source
    s, = schedules(Source("rs.strata", IN_PLACE_RS))
    world, n = 3, 5
    wl = Workload(s, world, n, op="sum")
    for rank in range(world):
        x = torch.full((world * n,), float(SENTINEL))
        x[rank * n:(rank + 1) * n] = wl.expected("x", rank, SEED, torch.float32)
        assert worker._compare_case(wl, {"x": x}, rank, SEED, torch.float32) == (True, "")
        x[rank * n + 2] += 1
        ok, why = worker._compare_case(wl, {"x": x}, rank, SEED, torch.float32)
        assert not ok and why.startswith(f"x[{rank * n + 2}] = "), why


def test_the_collective_check_catches_a_clobbered_input():
    """An out-of-place AllGather must leave its input as it was: the check compares inputs too."""
    s = _sched(EXAMPLES / "allgather_push.strata")
    wl = Workload(s, 2, 16)
    tensors = _correct(wl, 0)
    tensors["x"][7] += 1
    ok, why = worker._compare_case(wl, tensors, 0, SEED, torch.float32)
    want = wl.expected("x", 0, SEED, torch.float32)[7].item()
    assert not ok and why == f"x[7] = {want + 1} on rank 0, expected {want} (1 elements differ)"


# ---- the MoE checks, in process ----

MOE = [("moe_prefill", "moe_prefill_dispatch", "moe_prefill_combine"),
       ("moe_decode", "moe_decode_dispatch", "moe_decode_combine"),
       ("alltoallv", "alltoallv", None)]


def _moe(file: str, disp: str, comb: str | None, world=2) -> tuple[MoeWorkload, int]:
    d = _sched(EXAMPLES / f"{file}.strata", disp)
    c = _sched(EXAMPLES / f"{file}.strata", comb) if comb else None
    wl = MoeWorkload.make(d, c, world, tokens=16, hidden=8, topk=2, experts=4)
    win_param = d.param(d.contract.outputs[0])
    return wl, wl.shape(d, win_param)[0]


def _moe_correct(wl: MoeWorkload, rank: int, rows: int) -> tuple[dict, torch.Tensor]:
    """What a correct dispatch, expert step and combine leave on `rank`, and the window's mask.
    Undefined window rows hold a value no defined row holds, as a real window's leftovers may."""
    counts = wl.counts(SEED)
    win, mask = wl.window(rank, SEED, torch.float32, rows)
    if wl.combine is not None:
        wl.expert_step(win, rank, counts)
    win[~mask] = 99.0
    t = {"counts": counts.clone(), "win": win}
    if wl.combine is not None:
        t["y"] = wl.combined(rank, SEED, torch.float32)
    return t, mask


@pytest.mark.parametrize("file,disp,comb", MOE, ids=[m[0] for m in MOE])
@pytest.mark.parametrize("rank", [0, 1])
def test_the_moe_checks_name_a_changed_count_window_row_and_token(file, disp, comb, rank):
    wl, rows = _moe(file, disp, comb)
    t, mask = _moe_correct(wl, rank, rows)
    compare = lambda: worker._compare_moe(wl, t, rank, SEED, torch.float32, rows, wl.counts(SEED))
    assert compare() == (True, "")

    # a count: the message names the [source, expert] entry, what it holds and what it should
    want = int(t["counts"][1, 1])
    t["counts"][1, 1] += 1
    assert compare() == (False, f"counts[1, 1] = {want + 1} on rank {rank}, expected {want}")
    t["counts"][1, 1] -= 1

    # a row the layout defines: named by its row index
    defined = mask.nonzero().flatten().tolist()
    assert len(defined) >= 2, "the routing sends this rank at least two rows"
    r = defined[1]
    t["win"][r, 3] += 1
    ok, why = compare()
    assert not ok and why.startswith(f"window row {r} on rank {rank} does not hold the row the layout "
                                     f"puts there (seed {SEED}: "), why
    t["win"][r, 3] -= 1

    # a row the layout leaves undefined is nobody's business (the mask is what makes rows checked)
    undefined = (~mask).nonzero().flatten().tolist()
    if undefined:
        t["win"][undefined[0]] += 1
        assert compare() == (True, "")
        t["win"][undefined[0]] -= 1

    if comb is None:
        return
    # a combined token: the message names [token, element], the value, the expected value
    want_y = t["y"][5, 6].item()
    t["y"][5, 6] += 1
    assert compare() == (False, (f"y[5, 6] = {want_y + 1} on rank {rank}, expected {want_y} "
                                 "(1 elements differ)"))



@pytest.mark.parametrize("rank", [0, 1])
def test_the_quantised_moe_checks_name_a_count_scale_row_expert_output_and_token(rank):
    """moe_prefill_int8: what a correct run leaves passes; a count, a row of the scale window, the
    expert step's output and a combined token, each changed, are named."""
    wl, rows = _moe("moe_prefill_int8", "moe_prefill_int8_dispatch", "moe_prefill_int8_combine")
    assert wl.quantized
    counts = wl.counts(SEED)
    wq, ws, mask = wl.window_quantized(rank, SEED, torch.bfloat16, rows)
    cwin = torch.zeros(rows, wl.hidden, dtype=torch.bfloat16)
    wl.expert_step_quantized(wq, ws, cwin, rank, counts)
    t = {"counts": counts.clone(), "win": wq, "ws": ws, "cwin": cwin,
         "y": wl.combined_quantized(rank, SEED, torch.bfloat16)}
    compare = lambda: worker._compare_moe(wl, t, rank, SEED, torch.bfloat16, rows, wl.counts(SEED))
    assert compare() == (True, "")

    t["counts"][0, 1] += 1
    assert compare()[1].startswith(f"counts[0, 1] = {int(counts[0, 1]) + 1} on rank {rank}, expected")
    t["counts"][0, 1] -= 1

    r = mask.nonzero().flatten().tolist()[0]
    t["ws"][r, 0] *= 2
    ok, why = compare()
    assert not ok and why.startswith(f"scale window row {r} on rank {rank} does not hold the row"), why
    t["ws"][r, 0] /= 2

    good = t["cwin"].clone()
    t["cwin"][r, 0] += 1
    assert compare() == (False, f"the expert step's output on rank {rank} differs from torch's (seed {SEED})")
    t["cwin"] = good

    t["y"][2, 3] += 64
    ok, why = compare()
    assert not ok and why.startswith("y[2, 3] = ") and why.endswith("(1 elements differ)"), why


# ---- end to end: `stratac run` and `stratac bench` through the test hook ----

def test_run_says_wrong_names_the_element_and_exits_1(tmp_path):
    """Two schedules in one file, one element of one rank's AllGather output corrupted: that
    schedule's line says WRONG (1 ranks), the element is named with what it held and what torch
    expected, the other schedule stays OK, and the exit status is 1."""
    src = tmp_path / "two.strata"
    src.write_text((EXAMPLES / "allreduce_twoshot.strata").read_text() + "\n"
                   + (EXAMPLES / "allgather_push.strata").read_text())
    p = _cli("run", str(src), "--world", "2", "--count", "64", "--iters", "1", "--cores", "2",
             corrupt="1:out:77")
    assert p.returncode == 1, p.stdout + p.stderr
    want = Workload(_sched(EXAMPLES / "allgather_push.strata"), 2, 64).expected(
        "out", 1, SEED, torch.float32)[77].item()
    lines = p.stdout.splitlines()
    verdict = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in
               ("allreduce_twoshot", "allgather_push") and " 2 " in line}
    assert verdict["allgather_push"].endswith("WRONG (1 ranks)"), p.stdout
    assert verdict["allreduce_twoshot"].endswith("OK"), p.stdout   # the hook touched only `out`
    assert (f"  allgather_push rank 1: out[77] = {want + 1} on rank 1, expected {want} "
            "(1 elements differ)") in lines, p.stdout
    # the hook announced itself (a run it touched never looks like an ordinary one)
    assert f"STRATAC_TEST_CORRUPT: rank 1 changed out[77] from {want} to {want + 1}" in p.stdout + p.stderr


def test_no_check_turns_the_same_wrong_result_into_exit_0():
    """The exit status follows --check: with --no-check the corrupted run (the hook's line shows
    the corruption happened) reports `unchecked` and exits 0, where the test above exits 1."""
    p = _cli("run", str(EXAMPLES / "allreduce_twoshot.strata"), "--world", "2", "--count", "8",
             "--iters", "1", "--cores", "2", "--no-check", corrupt="1:x:0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "STRATAC_TEST_CORRUPT: rank 1 changed x[0]" in p.stdout + p.stderr
    line, = [line for line in p.stdout.splitlines() if line.startswith("allreduce_twoshot ")]
    assert line.endswith("unchecked"), p.stdout


def test_a_malformed_hook_value_is_refused():
    """A typo in the hook must not quietly corrupt nothing (and so 'pass' a run that tests WRONG)."""
    p = _cli("run", str(EXAMPLES / "allreduce_twoshot.strata"), "--world", "2", "--count", "8",
             "--iters", "1", "--cores", "2", corrupt="1:x")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "STRATAC_TEST_CORRUPT='1:x': '1:x' is not RANK[,RANK...]:NAME:INDEX" in p.stdout + p.stderr


def test_run_moe_says_wrong_for_a_count_a_window_row_and_a_combined_token():
    """World 3, one corruption per rank: rank 0's count table, a defined row of rank 1's window,
    one element of rank 2's combined tokens. Each rank's check names its own corruption."""
    world, tokens, hidden, topk, experts = 3, 16, 32, 2, 6
    d = _sched(EXAMPLES / "moe_prefill.strata", "moe_prefill_dispatch")
    c = _sched(EXAMPLES / "moe_prefill.strata", "moe_prefill_combine")
    wl = MoeWorkload.make(d, c, world, tokens, hidden, topk, experts)
    rows = wl.shape(d, d.param(d.contract.outputs[0]))[0]
    counts = wl.counts(SEED)
    _, mask = wl.window(1, SEED, torch.float32, rows)
    row = int(mask.nonzero()[1])                  # rank 1's second defined row
    y = wl.combined(2, SEED, torch.float32)
    p = _cli("run", str(EXAMPLES / "moe_prefill.strata"), "--world", str(world), "--tokens", str(tokens),
             "--hidden", str(hidden), "--topk", str(topk), "--experts", str(experts), "--iters", "1",
             "--cores", "2", corrupt=f"0:counts:{experts + 4};1:win:{row * hidden + 5};2:y:{hidden + 3}")
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert any(line.startswith("moe_prefill_dispatch ") and line.endswith("WRONG (3 ranks)")
               for line in lines), p.stdout
    want = int(counts[1, 4])
    assert f"  moe_prefill_dispatch rank 0: counts[1, 4] = {want + 1} on rank 0, expected {want}" in lines
    assert any(line.startswith(f"  moe_prefill_dispatch rank 1: window row {row} on rank 1 does not hold")
               for line in lines), p.stdout
    v = y[1, 3].item()
    assert (f"  moe_prefill_dispatch rank 2: y[1, 3] = {v + 1} on rank 2, expected {v} "
            "(1 elements differ)") in lines, p.stdout


def _bench_json(tmp_path, corrupt, *args) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "bench.json"
    p = _cli("bench", *args, "--iters", "1", "--warmup", "0", "--cores", "2", "--no-progress",
             "--json", str(out), corrupt=corrupt)
    return p, json.loads(out.read_text()) if out.exists() else {}


def _wrong_column(stdout: str, first_field: str, column: int) -> int:
    """The #wrong cell of the table row whose first field is first_field."""
    rows = [line.split() for line in stdout.splitlines()
            if not line.startswith("#") and line.split()[:1] == [first_field]]
    assert len(rows) == 1, stdout
    return int(rows[0][column])


def test_bench_counts_corrupted_ranks_in_the_wrong_column(tmp_path):
    """World 3, ranks 0 and 2 corrupted: #wrong is 2 (a count, not a flag), the JSON says why for
    each, and the bench exits 1."""
    p, data = _bench_json(tmp_path, "0,2:x:0", str(EXAMPLES / "allreduce_twoshot.strata"),
                          "--world", "3", "--sizes", "1536")
    assert p.returncode == 1, p.stdout + p.stderr
    # columns: size count type redop root time(us) algbw busbw #wrong
    assert _wrong_column(p.stdout, "1536", 8) == 2, p.stdout
    rec, = [r for r in data["results"] if r["system"] == "stratac"]
    assert rec["errors"] == 2
    want = Workload(_sched(EXAMPLES / "allreduce_twoshot.strata"), 3, 384).expected(
        "x", 0, SEED, torch.float32)[0].item()
    assert sorted(rec["why"]) == [f"x[0] = {want + 1} on rank {r}, expected {want} (1 elements differ)"
                                  for r in (0, 2)]


def test_bench_moe_counts_corrupted_ranks_in_the_wrong_column(tmp_path):
    """Both ranks' combined tokens corrupted: #wrong is 2 (every rank's verdict counted, not only
    rank 0's), each rank's reason is printed, and the bench exits 1."""
    p, data = _bench_json(tmp_path, "0,1:y:0", str(EXAMPLES / "moe_prefill.strata"), "--world", "2",
                          "--tokens", "16", "--hidden", "32", "--topk", "2", "--experts", "4")
    assert p.returncode == 1, p.stdout + p.stderr
    # columns: tokens hidden topk experts routing recv | time algbw max/mean | time algbw max/mean
    # | op(us) | #wrong
    rows = [line.split() for line in p.stdout.splitlines()
            if not line.startswith("#") and line.split()[:2] == ["16", "32"]]
    assert len(rows) == 1 and rows[0][-1] == "2", p.stdout
    rec, = [r for r in data["results"] if r.get("dispatch") == "moe_prefill_dispatch"]
    assert rec["errors"] == 2
    for rank in (0, 1):
        v = MoeWorkload.make(_sched(EXAMPLES / "moe_prefill.strata", "moe_prefill_dispatch"),
                             _sched(EXAMPLES / "moe_prefill.strata", "moe_prefill_combine"), 2, 16, 32,
                             2, 4).combined(rank, SEED, torch.float32)[0, 0].item()
        assert (f"# wrong: moe_prefill_dispatch tokens 16 uniform: y[0, 0] = {v + 1} on rank {rank}, "
                f"expected {v} (1 elements differ)") in p.stdout.splitlines(), p.stdout
