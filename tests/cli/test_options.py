"""Command-line options no other test gives, through the real entry point (stratac.cli.main, what
`python -m stratac` calls), each seen to take effect: in what the command prints or writes, or in
the spec the real runner then runs with (a spy records it and calls through). The table in
tests/README.md ("Coverage") names the test of every option; tests/test_coverage_table.py keeps it
complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stratac import cli
from stratac.tools.bench import sweep
from stratac.tools.run import runner

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
MACHINE = ROOT / "machines" / "cloudmatrix384.toml"


@pytest.fixture
def spy(monkeypatch):
    """Records the spec every runner.run / sweep.run call gets, then runs it for real."""
    seen = []

    def wrap(module, name):
        real = getattr(module, name)

        def call(spec, *a, **kw):
            seen.append(spec)
            return real(spec, *a, **kw)
        monkeypatch.setattr(module, name, call)

    wrap(runner, "run")
    wrap(sweep, "run")
    return seen


def test_run_dtype_op_root_seed_check_soc(spy, capsys):
    """`stratac run` of Reduce with i32, max, root 1, seed 7: the ranks run that case (the root,
    and only the root, reduces on its vector cores), the table says i32 and max, the check is on."""
    rc = cli.main(["run", str(EX / "reduce.strata"), "--world", "2", "--dtype", "i32", "--op", "max",
                   "--root", "1", "--seed", "7", "--count", "64", "--iters", "1", "--timeout", "30",
                   "--cores", "2", "--soc", "Ascend910B1", "--check"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    spec, = spy
    case, = spec.cases
    assert (case.dtype, case.op, case.root, case.count) == ("i32", "max", 1, 64)
    assert (spec.seed, spec.check, spec.timeout, spec.soc, spec.cores) == (7, True, 30.0, "Ascend910B1", 2)
    row = next(line.split() for line in out.out.splitlines() if line.startswith("reduce "))
    assert row[4:6] == ["i32", "max"] and row[-1] == "OK", out.out


def test_run_no_check_and_seed(spy, capsys):
    """--no-check: the table says so instead of OK; --seed (which seeds the ranks' input fill)
    reaches the spec the ranks run."""
    for seed in ("1", "2"):
        rc = cli.main(["run", str(EX / "allgather_push.strata"), "--world", "2", "--count", "8",
                       "--iters", "1", "--cores", "2", "--seed", seed, "--no-check"])
        assert rc == 0
    out = capsys.readouterr().out
    assert [s.seed for s in spy] == [1, 2] and not any(s.check for s in spy)
    assert "OK" not in out and "unchecked" in out, out


def test_run_moe_options(spy, capsys):
    """MoE options of `stratac run` (tokens, hidden, topk, experts, routing) reach the ranks."""
    rc = cli.main(["run", str(EX / "moe_prefill.strata"), "--world", "2", "--tokens", "8", "--hidden", "32",
                   "--topk", "2", "--experts", "4", "--routing", "skewed", "--iters", "1", "--cores", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    case, = spy[0].cases
    assert (case.tokens, case.hidden, case.topk, case.experts, case.routing) == (8, 32, 2, 4, "skewed")
    assert "OK" in out.out and "WRONG" not in out.out


def test_bench_dtype_op_root_timeout_seed_progress(spy, tmp_path, capsys):
    """`stratac bench` of Broadcast with f16, root 1, --progress: the JSON says f16 and root 1, the
    root's SDMA engine moved the data, the progress bar is drawn; with --no-progress it is not."""
    out_json = tmp_path / "b.json"
    base = ["bench", str(EX / "broadcast.strata"), "--world", "2", "--sizes", "64", "--iters", "1",
            "--warmup", "0", "--cores", "2", "--soc", "Ascend910B1"]
    rc = cli.main(base + ["--dtype", "f16", "--op", "min", "--root", "1", "--timeout", "30", "--seed", "3",
                          "--progress", "--json", str(out_json)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "] 1/1 sizes" in err            # the bar, drawn on stderr
    spec = spy[0]
    assert (spec.dtype, spec.op, spec.root, spec.timeout, spec.seed, spec.progress) == ("f16", "min", 1, 30.0, 3, True)
    data = json.loads(out_json.read_text())
    assert (data["meta"]["dtype"], data["meta"]["op"], data["meta"]["root"]) == ("f16", "min", 1)
    res, = [r for r in data["results"] if r["system"] == "stratac"]
    assert [p["sdma"] for p in res["per_rank"]] == [0, 64]     # only the root (rank 1) pushes: 2 x 32 B
    rc = cli.main(base + ["--no-progress"])
    assert rc == 0 and "sizes" not in capsys.readouterr().err


def test_compile_long_output_world_soc_cores(tmp_path, capsys):
    """compile --output (the long form of -o), --soc and --cores: the manifest records them;
    --world: a schedule right only at world 2 compiles for 2 and is refused (E0202) for 2,3."""
    rc = cli.main(["compile", str(EX / "allgather_push.strata"), "--output", str(tmp_path / "gen"),
                   "--world", "2,3", "--soc", "Ascend910B1", "--cores", "7"])
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "gen" / "allgather_push" / "manifest.json").read_text())
    assert (manifest["soc"], manifest["cores"]) == ("Ascend910B1", 7), manifest
    two = tmp_path / "ag2.strata"
    two.write_text("schedule ag(x: sym T[n], out: sym T[2 * n]) implements allgather(x -> out) {\n"
                   "  blk = split(out, world)\n  barrier\n"
                   "  on sdma: for p in ranks: blk[rank]@p = x\n  barrier\n}\n")
    assert cli.main(["compile", str(two), "-o", str(tmp_path / "g2"), "--world", "2"]) == 0
    capsys.readouterr()
    assert cli.main(["compile", str(two), "-o", str(tmp_path / "g3"), "--world", "2,3"]) == 1
    assert "error[E0202]" in capsys.readouterr().err


def test_simulate_through_the_cli(tmp_path, capsys):
    """`stratac simulate` through stratac.cli.main: --dtype, --root (collectives), --routing and
    --seed (MoE) show in the header and the JSON."""
    out_json = tmp_path / "s.json"
    rc = cli.main(["simulate", str(EX / "broadcast.strata"), "--machine", str(MACHINE), "--world", "4",
                   "--sizes", "1K", "--dtype", "f16", "--root", "2", "--cores", "8", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith(f"# stratac simulate {EX / 'broadcast.strata'}  world 4  dtype f16  cores 8")
    meta = json.loads(out_json.read_text())["meta"]
    assert (meta["dtype"], meta["root"], meta["cores"]) == ("f16", 2, 8)
    rc = cli.main(["simulate", str(EX / "moe_decode.strata"), "--machine", str(MACHINE), "--world", "4",
                   "--tokens", "8", "--hidden", "64", "--topk", "2", "--experts", "8", "--routing", "skewed",
                   "--seed", "5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "routing skewed (" in out and "seed 5)" in out, out


def test_doctor_through_the_cli(capsys):
    """`stratac doctor` as a command: the report, and exit 0 on this machine (it builds and runs
    the CPU target; tests/doctor/ checks the rows)."""
    rc = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "cpu" in out.lower()


BOUNDED = EX / "moe_prefill_bounded.strata"


def test_run_max_recv_bounds_the_window_and_an_overflow_is_an_error(spy, capsys):
    """`stratac run --max-recv R`: the bounded window has R rows per rank, checked runs are OK within
    the bound; a routing that sends a rank more rows than R is reported, exit status 1."""
    common = [str(BOUNDED), "--world", "2", "--tokens", "8", "--hidden", "32", "--topk", "2", "--experts", "4",
              "--iters", "1", "--cores", "2"]
    for rows in (32, 24):    # 32 = world x tokens x topk, the most a rank can receive
        rc = cli.main(["run", *common, "--routing", "uniform", "--max-recv", str(rows)])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert spy[-1].cases[0].max_recv == rows and "OK" in out.out and "WRONG" not in out.out
    rc = cli.main(["run", *common, "--routing", "single", "--max-recv", "4"])
    out = capsys.readouterr()
    assert rc == 1, out.out + out.err
    text = out.out + out.err
    assert "more than the 4 rows of its window win (max_recv = 4)" in text and "Traceback" not in text


DECODE = EX / "moe_decode.strata"
# tokens 10, topk 2, 4 experts at world 2 under uniform, seeds 3 and 4 (the run checks --seed and
# --seed + 1): the most tokens one rank sends one expert is 7 (counted by hand from
# expert_ids("uniform", r, 10, 2, 4, seed) for r = 0, 1); every seed-0 sample routing the verifier
# had needs 8, so before routing.FULL a capacity of 7 was refused as unprovable
DECODE_RUN = [str(DECODE), "--world", "2", "--tokens", "10", "--hidden", "32", "--topk", "2",
              "--experts", "4", "--seed", "3", "--iters", "1", "--cores", "2"]


def test_run_capacity_an_exact_fit_runs_and_one_slot_less_is_refused(spy, capsys):
    """`stratac run --capacity C` of the decode layout: C = 7, exactly what the routing needs, is
    proven and runs OK with a window of experts x 7 rows; C = 6 is refused at the call, before
    anything is written, naming the rank, the expert and the capacity."""
    rc = cli.main(["run", *DECODE_RUN, "--capacity", "7"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert spy[-1].cases[0].capacity == 7
    assert "window 28 rows, capacity 7 slots per (expert, source)" in out.out
    assert "OK" in out.out and "WRONG" not in out.out and "cannot be proven" not in out.err
    rc = cli.main(["run", *DECODE_RUN, "--capacity", "6"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc == 1, text
    assert "more than the capacity of 6 slots per (expert, source rank); nothing was written" in text
    assert "Traceback" not in text


def test_bench_capacity_reaches_the_sweep(spy, tmp_path, capsys):
    """`stratac bench --capacity C` sweeps the slotted schedules with C slots per (expert, source)."""
    out = tmp_path / "b.json"
    rc = cli.main(["bench", str(DECODE), "--world", "2", "--tokens", "10", "--hidden", "32", "--topk", "2",
                   "--experts", "4", "--seed", "3", "--capacity", "7", "--iters", "1", "--warmup", "0",
                   "--cores", "2", "--no-progress", "--json", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert spy[0].capacity == 7 and all(c.capacity == 7 for s in spy[1:] for c in s.cases)
    recs = json.loads(out.read_text())["results"]
    assert recs and all(r["capacity"] == 7 and r["window_rows"] == 28 and r["errors"] == 0 for r in recs)


@pytest.mark.parametrize("argv, want", [
    # a slotted layout has no bound to size, a packed one no slots, a collective neither
    (["run", str(DECODE), "--world", "2", "--max-recv", "4"],
     "--max-recv 4 applies to a MoE dispatch/combine whose packed window's rows are a size of their "
     "own (e.g. examples/moe_prefill_bounded.strata) or that has a region per expert "
     "(per_expert(ROWS), e.g. examples/moe_prefill_experts.strata), and none of this file's schedules "
     "(moe_decode_dispatch, moe_decode_combine) has one; a slotted layout takes --capacity"),
    (["run", str(EX / "moe_prefill.strata"), "--world", "2", "--capacity", "4"],
     "--capacity 4 applies to a MoE dispatch/combine with slots per (expert, source rank)"),
    (["run", str(EX / "allreduce_oneshot.strata"), "--world", "2", "--capacity", "4"],
     "none of this file's schedules (allreduce_oneshot) has one"),
    (["bench", str(DECODE), "--world", "2", "--max-recv", "4", "--no-progress"],
     "--max-recv 4 applies to a MoE dispatch/combine whose packed window's rows"),
    (["bench", str(BOUNDED), "--world", "2", "--capacity", "4", "--no-progress"],
     "; a bounded packed window takes --max-recv: drop --capacity"),
])
def test_max_recv_and_capacity_are_refused_where_they_do_not_apply(spy, capsys, argv, want):
    """--max-recv and --capacity each size one kind of window; a file without one is refused with
    the option and the schedules named, before any rank starts (they used to be ignored)."""
    rc = cli.main(argv)
    out = capsys.readouterr()
    assert rc != 0 and want in out.err, out.out + out.err
    assert "Traceback" not in out.err and "[rank " not in out.err and out.out == ""


def test_bench_max_recv_reaches_the_sweep(spy, tmp_path, capsys):
    """`stratac bench --max-recv R` sweeps the bounded schedules with R window rows per rank."""
    out = tmp_path / "b.json"
    rc = cli.main(["bench", str(BOUNDED), "--world", "2", "--tokens", "8", "--hidden", "32", "--topk", "2",
                   "--experts", "4", "--max-recv", "24", "--iters", "1", "--warmup", "0", "--cores", "2",
                   "--no-progress", "--json", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert spy[0].max_recv == 24 and all(c.max_recv == 24 for s in spy[1:] for c in s.cases)
    recs = json.loads(out.read_text())["results"]
    assert recs and all(r["errors"] == 0 for r in recs if "errors" in r)
