"""busbw and algbw of `stratac run` and `stratac bench` against nccl-tests' definitions, for every
collective contract at worlds 2, 3 and 4 (issue 16).

The references are written out here, NOT taken from stratac (stratac.tools.run.workload computes
the factor and S; the worker copies them into each result; runner.report and bench's sweep turn
them into the printed and JSON figures). nccl-tests (src/*.cu, doc/PERFORMANCE.md):

  algbw = S / t, GB = 1e9 bytes
  AllReduce      busbw = algbw * 2(n-1)/n    S = the buffer
  AllGather      busbw = algbw * (n-1)/n     S = the whole gathered buffer (n * one rank's input)
  ReduceScatter  busbw = algbw * (n-1)/n     S = the whole scattered buffer (n * one rank's output)
  AllToAll       busbw = algbw * (n-1)/n     S = one rank's send buffer
  Broadcast      busbw = algbw * 1           S = the buffer
  Reduce         busbw = algbw * 1           S = the buffer

World 2 alone cannot tell a dropped factor (AllReduce's is 1 there, the others' 1/2 would at least
differ); worlds 3 and 4 give factors 4/3, 3/2, 2/3, 3/4 that no constant fits. MoE dispatch/combine
and AllToAllV have no nccl-tests factor: stratac reports busbw = algbw over the received bytes
(DeepEP's count), checked at the end.
"""

from fractions import Fraction
from pathlib import Path

import pytest
import runkit

from stratac.lang.frontend import load_source, schedules
from stratac.tools.bench import sweep
from stratac.tools.run import runner
from stratac.tools.run.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
WORLDS = [2, 3, 4]

# one example per contract kind (plus the second AllGather, whose S is also the output buffer)
EXAMPLES = {
    "allreduce_twoshot": "allreduce",
    "allreduce_oneshot": "allreduce",
    "allgather_push": "allgather",
    "allgather_pull": "allgather",
    "reducescatter": "reducescatter",
    "alltoall": "alltoall",
    "broadcast": "broadcast",
    "reduce": "reduce",
}


def nccl_factor(kind: str, n: int) -> Fraction:
    """nccl-tests' bus factor, from its definitions (exact fractions, no stratac code)."""
    if kind == "allreduce":
        return Fraction(2 * (n - 1), n)
    if kind in ("allgather", "reducescatter", "alltoall"):
        return Fraction(n - 1, n)
    if kind in ("broadcast", "reduce"):
        return Fraction(1)
    raise AssertionError(f"no nccl-tests factor for {kind}")


def nccl_size(kind: str, n: int, count: int, elem: int) -> int:
    """nccl-tests' S in bytes for the examples' signatures, read off the .strata headers:
    allgather (x: T[n], out: T[n*world]) -> the gathered out; reducescatter (x: T[n*world],
    out: T[n]) -> the scattered x; alltoall (x: T[n*world]) -> one rank's send buffer x;
    the others (x: T[n]) -> x."""
    if kind in ("allgather", "reducescatter", "alltoall"):
        return count * n * elem
    return count * elem


def _schedule(name):
    (s,) = schedules(load_source(str(ROOT / "examples" / f"{name}.strata")))
    assert s.contract.kind.value == EXAMPLES[name]   # the table above names the right contract
    return s


def test_reference_factors_are_not_a_constant():
    """The references themselves: at worlds 3 and 4 every kind but broadcast/reduce has a factor
    other than 1, so a dropped factor shows."""
    for n in (3, 4):
        for kind in ("allreduce", "allgather", "reducescatter", "alltoall"):
            assert nccl_factor(kind, n) != 1


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_workload_factor_and_size_match_nccl_tests(name, world):
    s = _schedule(name)
    kind = EXAMPLES[name]
    for count, elem in ((5, 4), (1001, 2)):
        wl = Workload(s, world, count)
        assert wl.busbw_factor() == pytest.approx(float(nccl_factor(kind, world)), rel=1e-12)
        assert wl.size_bytes(elem) == nccl_size(kind, world, count, elem)
    # `--size BYTES` picks the count whose S is BYTES (whole elements of one rank's share)
    nbytes = 4 * world * 96
    wl = Workload(s, world, Workload.count_for_bytes(s, world, nbytes, 4))
    assert wl.size_bytes(4) == nbytes


def _columns(line: str, head: str) -> dict[str, str]:
    """A table row by column name. Only the columns up to busbw are one word in both header and row
    ("aiv bytes" and "core max/mean" later are two in the header), which is all this file reads."""
    names = head.split()
    return dict(zip(names, line.split()))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One real `stratac run` job per world over every collective example (CPU model, 96
    elements): what the worker reports, per rank."""
    path = tmp_path_factory.mktemp("factors") / "all.strata"
    path.write_text(runkit.concat(ROOT / "examples" / f"{n}.strata" for n in EXAMPLES))
    out = {}
    for world in WORLDS:
        spec = runner.RunSpec(file=str(path), world=world, cases=[runner.Case("f32", count=96)],
                              iters=1, warmup=0, cores=2, timeout=60)
        o = runner.run(spec, echo=lambda line: None)
        assert o.exit_code == 0, o.failures
        assert all(r["ok"] for r in o.results)
        out[world] = o
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_run_reports_nccl_size_and_factor(runs, world):
    """The worker's records (what `stratac run` and `stratac bench` print from): S and the factor."""
    got = {}
    for r in runs[world].results:
        assert r["size"] == nccl_size(EXAMPLES[r["schedule"]], world, 96, 4), r["schedule"]
        assert r["busbw_factor"] == pytest.approx(float(nccl_factor(EXAMPLES[r["schedule"]], world)),
                                                  rel=1e-12), r["schedule"]
        got.setdefault(r["schedule"], set()).add(r["rank"])
    assert got == {name: set(range(world)) for name in EXAMPLES}


@pytest.mark.parametrize("world", WORLDS)
def test_run_table_prints_algbw_and_busbw_by_nccl_tests(runs, world):
    """runner.report's algbw and busbw columns. The measured times are replaced by one fixed time
    so that the printed (2-decimal) figures are large enough to compare: t = 1 us, so algbw =
    S / 1e3 GB/s exactly."""
    outcome = runner.RunOutcome(results=[dict(r, time_s=1e-6) for r in runs[world].results])
    lines = runner.report(outcome, check=True)
    head = lines[0]
    seen = set()
    for line in lines[1:]:
        cols = _columns(line, head)
        name = cols.get("schedule")
        if name not in EXAMPLES:
            continue
        seen.add(name)
        kind = EXAMPLES[name]
        algbw = nccl_size(kind, world, 96, 4) / 1e-6 / 1e9
        assert float(cols["algbw"]) == pytest.approx(algbw, abs=0.006), line
        assert float(cols["busbw"]) == pytest.approx(algbw * float(nccl_factor(kind, world)), abs=0.006), line
    assert seen == set(EXAMPLES)


@pytest.mark.parametrize("world", WORLDS)
def test_bench_records_algbw_and_busbw_by_nccl_tests(runs, world):
    """bench's records (table, JSON, plot all read them): sweep._records over the real worker
    results, with the time fixed as above, gives algbw = S / t and busbw = algbw * factor."""
    results = [dict(r, time_s=2e-6) for r in runs[world].results]
    # _records reads only the schedules (compiled[i].schedule) of the plan and world/peers of the spec
    pl = sweep.Plan(compiled=[type("C", (), {"schedule": _schedule(n)})() for n in EXAMPLES],
                    cases=[], tasks=[], largest_numel=0, instances=[])
    spec = type("S", (), {"world": world, "peers": ()})()
    recs = sweep._records(results, pl, spec)
    assert {r["schedule"] for r in recs} == set(EXAMPLES)
    for r in recs:
        kind = EXAMPLES[r["schedule"]]
        S = nccl_size(kind, world, 96, 4)
        assert r["size"] == S
        assert r["algbw"] == pytest.approx(S / 2e-6 / 1e9, rel=1e-12)
        assert r["busbw"] == pytest.approx(S / 2e-6 / 1e9 * float(nccl_factor(kind, world)), rel=1e-12)


def test_moe_and_alltoallv_report_received_bytes_without_a_factor(tmp_path):
    """MoE dispatch/combine and AllToAllV have no nccl-tests definition: S is the bytes a rank
    receives (mean over ranks, DeepEP's count: routed entries x hidden x element bytes / world),
    busbw = algbw (factor 1). World 3, where a bus factor (n-1)/n would show."""
    from stratac.verify.routing import expert_ids
    world, tokens, hidden, topk = 3, 23, 17, 2
    path = tmp_path / "moe.strata"
    path.write_text((ROOT / "examples" / "moe_prefill.strata").read_text() + "\n"
                    + (ROOT / "examples" / "alltoallv.strata").read_text())
    case = runner.Case("bf16", tokens=tokens, hidden=hidden, topk=topk, experts=2 * world,
                       routing="skewed")
    out = runner.run(runner.RunSpec(file=str(path), world=world, cases=[case], iters=1, warmup=0,
                                    cores=2, timeout=60), echo=lambda line: None)
    assert out.exit_code == 0, out.failures
    seen = set()
    for r in out.results:
        v = r["moe"]["alltoallv"]
        k, experts = (1, world) if v else (topk, 2 * world)
        routed = sum(int(((ids >= 0) & (ids < experts)).sum())
                     for ids in (expert_ids("skewed", s, tokens, k, experts, 0) for s in range(world)))
        assert r["size"] == routed * hidden * 2 // world, r["schedule"]
        assert r["busbw_factor"] == 1.0
        seen.add(r["schedule"])
    assert len(seen) == 3   # dispatch, combine, alltoallv
    lines = runner.report(runner.RunOutcome(results=[dict(r, time_s=1e-6) for r in out.results]),
                          check=True)
    for line in lines[1:]:
        cols = _columns(line, lines[0])
        if cols.get("schedule") in seen:
            assert float(cols["busbw"]) == float(cols["algbw"]) > 0, line


def test_bench_cli_json_has_nccl_tests_figures_at_world_3(tmp_path):
    """`stratac bench` through the real entry point at world 3 (factors 4/3, 2/3, 1): in the JSON,
    size is nccl-tests' S and busbw / algbw is the factor, for every collective kind."""
    import json
    import subprocess
    import sys
    world, nbytes = 3, 4 * 3 * 64
    path = tmp_path / "all.strata"
    path.write_text(runkit.concat(ROOT / "examples" / f"{n}.strata" for n in EXAMPLES))
    out_json = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-m", "stratac", "bench", str(path), "--world", str(world),
                        "--sizes", str(nbytes), "--iters", "1", "--warmup", "0", "--cores", "2",
                        "--json", str(out_json), "--no-progress"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [r for r in json.loads(out_json.read_text())["results"] if r["system"] == "stratac"]
    assert {r["schedule"] for r in recs} == set(EXAMPLES)
    for r in recs:
        kind = EXAMPLES[r["schedule"]]
        assert r["kind"] == kind and r["world"] == world
        assert r["size"] == nbytes                        # --sizes is S, for every kind
        assert r["algbw"] > 0
        assert r["busbw"] / r["algbw"] == pytest.approx(float(nccl_factor(kind, world)), rel=1e-9)
