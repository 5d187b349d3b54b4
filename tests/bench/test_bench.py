"""`stratac bench`: the output format (table columns, JSON keys, the PNG), the ratio column from a
real gloo run, and the copies per payload byte against hand-computed values. Never timing.

One bench job (world 2, two sizes, gloo peer) serves most tests; the MPI peer is in the slow tier
(it may install Open MPI and mpi4py, and runs mpirun)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stratac import cli
from stratac.tools import options
from stratac.tools.bench import (
    benchpeer,
    benchspec,
    machine,
    mpi,
    progress,
    report,
    sweep,
)
from stratac.tools.run import runner

ROOT = Path(__file__).resolve().parents[2]
SIZES = (1024, 2048)


def _schedules(tmp_path) -> Path:
    path = tmp_path / "ar.strata"
    path.write_text((ROOT / "examples" / "allreduce_twoshot.strata").read_text() + "\n"
                    + (ROOT / "examples" / "allreduce_staging_baseline.strata").read_text())
    return path


def _bench(args, timeout=240):
    return subprocess.run([sys.executable, "-m", "stratac", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    src = _schedules(tmp)
    out_json, out_png, out_trace = tmp / "out.json", tmp / "out.png", tmp / "trace.json"
    p = _bench([str(src), "--world", "2", "--sizes", ",".join(map(str, SIZES)), "--vs", "gloo",
                "--iters", "2", "--warmup", "1", "--cores", "4", "--json", str(out_json),
                "--plot", str(out_png), "--trace", str(out_trace), "--no-progress"])
    assert p.returncode == 0, p.stdout + p.stderr
    return {"stdout": p.stdout, "stderr": p.stderr, "json": json.loads(out_json.read_text()),
            "png": out_png, "trace": json.loads(out_trace.read_text())}


def _rows(stdout: str, schedule: str) -> list[list[str]]:
    """The data rows of one schedule's table, split on whitespace ('|' kept as separators)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {schedule}:"))
    rows = []
    for line in lines[start + 3:]:
        if line.startswith("#"):
            break
        rows.append(line.split())
    return rows


def test_table_has_the_nccl_tests_columns_and_one_row_per_size(gloo_run):
    out = gloo_run["stdout"]
    assert "# copy ceiling (torch copy_ of 256MiB):" in out
    for name in ("allreduce_twoshot", "allreduce_staging_baseline"):
        lines = out.splitlines()
        i = next(i for i, line in enumerate(lines) if line.startswith(f"# {name}:"))
        systems, head = lines[i + 1], lines[i + 2]
        assert "stratac" in systems and "gloo" in systems and "engine bytes per rank and call" in systems
        cols = head.lstrip("#").split("|")
        assert cols[0].split() == ["size", "count", "type", "redop", "root", "time(us)", "algbw",
                                   "busbw", "#wrong"]
        assert cols[1].split() == ["time(us)", "busbw", "#wrong", "ratio"]
        assert cols[2].split() == ["aiv", "in", "aiv", "out", "sdma", "copies/B", "cores"]
        rows = _rows(out, name)
        assert [int(r[0]) for r in rows] == list(SIZES)
        for r in rows:
            assert r[1] == str(int(r[0]) // 4) and r[2] == "f32" and r[3] == "sum" and r[4] == "-"
            assert r[8] == "0"                         # no rank differed from torch
            assert r[9] == "|" and r[12] == "0"        # gloo's result checked too
            assert r[13].endswith("x")


def test_json_has_plain_keys_for_every_system_and_size(gloo_run):
    data = gloo_run["json"]
    assert data["meta"]["world"] == 2 and data["meta"]["peers"] == ["gloo"]
    assert data["meta"]["copy_ceiling"]["gbps_1_thread"] > 0
    got = {(r["system"], r["schedule"], r["size"]) for r in data["results"]}
    assert got == {(sys_, sched, s) for s in SIZES for sys_, sched in
                   (("stratac", "allreduce_twoshot"), ("stratac", "allreduce_staging_baseline"),
                    ("gloo", "all_reduce"))}
    for r in data["results"]:
        for key in ("busbw", "algbw", "time_us", "size", "dtype", "schedule", "world", "system"):
            assert key in r, key
        assert r["dtype"] == "f32" and r["world"] == 2 and r["errors"] == 0
        # nccl-tests: algbw = S / t; AllReduce busbw = algbw * 2(n-1)/n = algbw on 2 ranks
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"])


def test_plot_is_a_png(gloo_run):
    data = gloo_run["png"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_ratio_column_is_stratac_busbw_over_gloo_busbw(gloo_run):
    res = gloo_run["json"]["results"]
    gloo = {r["size"]: r for r in res if r["system"] == "gloo"}
    for name in ("allreduce_twoshot", "allreduce_staging_baseline"):
        rows = {int(r[0]): r for r in _rows(gloo_run["stdout"], name)}
        for r in (r for r in res if r["schedule"] == name):
            want = r["busbw"] / gloo[r["size"]]["busbw"]
            assert r["ratio"]["gloo"] == pytest.approx(want)
            assert rows[r["size"]][13] == report.fmt_ratio(want)


def test_copies_per_payload_byte_match_the_hand_count(gloo_run):
    """Two-shot on 2 ranks, S bytes: each rank reads its half from both ranks into UB (S), writes
    the reduced half (S/2) and pushes it to the peer by SDMA (S/2): S bytes landed, the minimum.
    The staging baseline adds x -> stage and stage -> x through UB: 2S more in and 2S more out."""
    res = {(r["schedule"], r["size"]): r for r in gloo_run["json"]["results"] if r["system"] == "stratac"}
    for s in SIZES:
        two, stage = res[("allreduce_twoshot", s)], res[("allreduce_staging_baseline", s)]
        for r, (aiv_in, aiv_out, sdma) in ((two, (s, s / 2, s / 2)), (stage, (3 * s, 2.5 * s, s / 2))):
            for p in r["per_rank"]:
                assert (p["aiv_in"], p["aiv_out"], p["sdma"]) == (aiv_in, aiv_out, sdma)
                assert p["remote_read"] == s / 2 and p["remote_write"] == s / 2
                assert sum(c["aiv_in"] + c["aiv_out"] + c["sdma"] for c in p["per_core"]) == \
                    aiv_in + aiv_out + sdma
                assert len(p["per_core"]) == 4
        assert two["copies_per_byte"] == 1.0 and stage["copies_per_byte"] == 3.0
        assert two["min_copies_per_byte"] == stage["min_copies_per_byte"] == 1.0
        assert two["fabric_per_byte"] == stage["fabric_per_byte"] == two["min_fabric_per_byte"] == 1.0
        assert not two["staging"] and stage["staging"]
    out = gloo_run["stdout"]
    assert "# copies and engines at 2KiB" in out
    line = next(l for l in out.splitlines() if l.split()[:1] == ["allreduce_staging_baseline"])
    assert line.split()[1:8] == ["3.00", "2.50", "0.50", "3.00", "1.00", "2.00", "1.00"]
    assert ("the staging copies are 2.00 B/B more (4096 bytes per rank and call at this size)"
            in out)


def test_trace_has_a_track_per_rank_core_and_sdma_queue(gloo_run):
    """One traced call per schedule and size: spans named by their .strata line, and SDMA copies
    that add up to the bytes the counters give (S/2 per rank for two-shot on 2 ranks)."""
    ev = gloo_run["trace"]["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"call (host)", "core 0", "core 3", "sdma queue 0"} <= threads
    spans = [e for e in ev if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    calls = sorted(e["name"] for e in spans if e["cat"] == "call" and e["pid"] == 0)
    assert calls == sorted(f"{n} {s} B" for n in ("allreduce_twoshot", "allreduce_staging_baseline")
                           for s in SIZES)
    stages = {e["name"] for e in spans if e["cat"] == "stage"}
    assert "L12: on aiv: part[rank] = op(part[rank]@p for p in ranks)" in stages
    assert any(e["name"] == "wait flag" for e in spans)
    kernels = {e["name"] for e in spans if e["cat"] == "kernel"}
    assert kernels == {"allreduce_twoshot_f32_sum", "allreduce_staging_baseline_f32_sum"}
    for rank in (0, 1):
        sdma = sum(e["args"]["bytes"] for e in spans if e["cat"] == "sdma" and e["pid"] == rank)
        assert sdma == 2 * sum(s // 2 for s in SIZES)   # both schedules, both sizes
        assert all(e["args"]["to_rank"] == 1 - rank for e in spans if e["cat"] == "sdma" and e["pid"] == rank)


def test_sizes_double_like_nccl_tests():
    s = options.parse_sizes("8:256M")
    assert s[0] == 8 and s[-1] == 256 << 20 and len(s) == 26
    assert all(b == 2 * a for a, b in zip(s, s[1:]))
    assert options.parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert options.parse_sizes("4K,1K,2K:4K") == [1024, 2048, 4096]
    for bad in ("", "0:8", "8:4", "1K:1M:1", "x", "1:2:3:4"):
        with pytest.raises(ValueError):
            options.parse_sizes(bad)


def test_minimum_copies_by_contract():
    assert sweep._min_copies("allreduce", 4, True) == 1.0
    assert sweep._min_copies("allgather", 4, False) == 1.0
    assert sweep._min_copies("reducescatter", 4, False) == 0.25
    assert sweep._min_copies("broadcast", 4, True) == 0.75
    assert sweep._min_copies("reduce", 4, True) == 0.25
    assert sweep._min_copies("alltoall", 4, False) == 1.0
    assert sweep._min_copies("allreduce", 1, True) == 0.0
    assert sweep._min_fabric("allreduce", 4) == 1.5 and sweep._min_fabric("alltoall", 4) == 0.75
    assert sweep._min_fabric("broadcast", 4) == sweep._min_fabric("reduce", 4) == 0.75


def test_peer_references():
    task = {"kind": "alltoall", "in_numel": 6, "out_numel": 6, "op": "sum", "root": 0}
    ins = [benchpeer.peer_input(task, r) for r in range(3)]
    got = benchpeer.peer_expected(task, 1, 3)
    assert list(got) == [*ins[0][2:4], *ins[1][2:4], *ins[2][2:4]]
    task = dict(task, kind="reducescatter", out_numel=2, op="max")
    assert list(benchpeer.peer_expected(task, 2, 3)) == [max(x[i] for x in ins) for i in (4, 5)]
    assert benchpeer.peer_expected(dict(task, kind="reduce", root=0), 1, 3) is None


def test_a_sweep_that_would_not_fit_in_memory_is_refused(tmp_path, monkeypatch):
    """An OOM kill would take other processes with it: the bench refuses first, and says why."""
    monkeypatch.setattr(machine, "mem_available", lambda: 1 << 30)
    spec = benchspec.BenchSpec(file=str(ROOT / "examples" / "allreduce_twoshot.strata"), world=4,
                           sizes=[256 << 20], ceiling_bytes=1 << 20)
    with pytest.raises(benchspec.BenchError, match=r"the largest size needs about 1\d\.\d GiB of memory "
                       r"\(4 ranks.*but 1\.0 GiB are available: lower the largest --sizes \(now 256MiB\)"):
        sweep.run(spec, echo=lambda line: None)


def test_progress_line_counts_marks(tmp_path):
    gate = benchpeer.Gate(tmp_path)
    cases = [runner.Case(size=1024), runner.Case(size=2048)]
    p = progress.Progress(gate, cases, mpi=True, enabled=False)
    assert " 0/4 measurements" in p.line() and "next 1KiB" in p.line()
    gate.mark("stratac-0")
    gate.mark("mpi-0")
    assert " 2/4 measurements" in p.line() and "next 2KiB" in p.line()
    assert gate.wait("mpi-0", 1) and not gate.wait("mpi-1", 0.01)
    gate.mark(gate.ABORT)
    assert not gate.wait("mpi-1", 10)   # an abort ends the wait at once


def test_mpi_setup_failure_is_one_clear_message(tmp_path, monkeypatch, capsys):
    def fail(echo=print):
        raise benchspec.BenchError("cannot set up MPI: `apt-get install -y -q openmpi-bin "
                               "libopenmpi-dev` failed with status 100:\nE: no such package")
    monkeypatch.setattr(mpi, "setup_mpi", fail)
    src = _schedules(tmp_path)
    assert cli.main(["bench", str(src), "--world", "2", "--vs", "mpi", "--sizes", "1K"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stratac bench: error: cannot set up MPI:") and "Traceback" not in err
    assert cli.main(["bench", "--setup-mpi"]) == 1


def test_a_failing_setup_step_names_the_command_and_its_output():
    with pytest.raises(benchspec.BenchError, match=r"`.*false` failed with status 1"):
        mpi._step([sys.executable, "-c", "import sys; print('boom'); sys.exit(1)", "false"],
                    echo=lambda line: None)
    with pytest.raises(benchspec.BenchError, match="no-such-tool-here is not installed"):
        mpi._step(["no-such-tool-here"], echo=lambda line: None)


def test_bench_usage_errors():
    p = _bench(["--world", "2"], timeout=60)
    assert p.returncode == 2 and "bench needs a FILE" in p.stderr
    p = _bench([str(ROOT / "examples" / "allreduce_twoshot.strata"), "--world", "2", "--vs", "nccl",
                "--sizes", "1K"], timeout=120)
    assert p.returncode == 1 and "--vs nccl: the peers are gloo, mpi" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_mpi_peer_interleaved_with_stratac(tmp_path):
    try:
        mpi.setup_mpi(echo=lambda line: None)
    except benchspec.BenchError as exc:
        pytest.skip(f"MPI cannot be installed here: {exc}")
    out_json = tmp_path / "mpi.json"
    p = _bench([str(ROOT / "examples" / "allgather_push.strata"), "--world", "2", "--sizes", "2K,4K",
                "--vs", "gloo,mpi", "--iters", "2", "--warmup", "1", "--cores", "4",
                "--json", str(out_json)], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out_json.read_text())["results"]
    by_size = {r["size"]: r for r in res if r["system"] == "mpi"}
    assert set(by_size) == {2048, 4096}
    assert all(r["schedule"] == "MPI_Allgather" and r["errors"] == 0 for r in by_size.values())
    for r in (r for r in res if r["system"] == "stratac"):
        assert r["ratio"]["mpi"] == pytest.approx(r["busbw"] / by_size[r["size"]]["busbw"])
        assert r["copies_per_byte"] == r["min_copies_per_byte"] == 1.0   # push: S landed, once
    assert "mpi4py" in p.stdout and "Open MPI" in p.stdout


def test_agreement_cost_benches_each_schedule_and_its_twin_without_the_check(tmp_path):
    """`--agreement-cost`: every schedule, then the same schedule built without the ranks'
    agreement (its kernel has no strata::Agree but keeps its barrier, strata::EntryBarrier, which
    the verifier relies on: every rank has entered before any statement), both checked against
    torch, in one run."""
    from stratac.codegen import pipeline
    from stratac.ir import passes
    from stratac.lang import frontend
    src = ROOT / "examples" / "allreduce_twoshot.strata"
    texts = {on: pipeline.compile_schedules(frontend.load_source(src), passes.Options(agreement=on),
                                            [2])[0].output.files["kernel.cpp"] for on in (True, False)}
    entry = "strata::EntryBarrier(sync_, epoch_, strata::Ranks());"
    assert "strata::Agree(" in texts[True] and entry not in texts[True]
    assert "strata::Agree(" not in texts[False] and entry in texts[False]
    for on in (True, False):   # the schedule's own barrier, at the end, is the same in both
        assert texts[on].count("strata::Barrier(sync_, epoch_ + 1);") == 1
    out_json = tmp_path / "out.json"
    p = _bench([str(src), "--world", "2", "--sizes", "4096", "--iters", "2", "--warmup", "1",
                "--agreement-cost", "--json", str(out_json), "--no-progress"])
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [r for r in json.loads(out_json.read_text())["results"] if r["system"] == "stratac"]
    assert [r["schedule"] for r in recs] == ["allreduce_twoshot", "allreduce_twoshot (no agreement)"]
    assert all(r["errors"] == 0 and r["size"] == 4096 for r in recs)
    # the agreement's record reads are sync traffic: the data counters are the same for both
    assert recs[0]["engines"] == recs[1]["engines"]
