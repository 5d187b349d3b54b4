"""The command line as a user meets it: real subprocesses, exit codes, messages, no tracebacks."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stratac import verify
from stratac.lang import frontend

ROOT = Path(__file__).resolve().parents[2]


def stratac(*args, env=None, cwd=None, timeout=300):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "stratac", *map(str, args)], capture_output=True,
                          text=True, env=e, cwd=cwd or ROOT, timeout=timeout)


def no_traceback(p):
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr


def test_check_accepts_examples():
    for ex in ("allreduce_twoshot", "allgather_push"):
        p = stratac("check", f"examples/{ex}.strata", "--world", "2,3,4,8")
        assert p.returncode == 0, p.stderr
        assert f"{ex}: verified" in p.stdout and "world 2-4,8" in p.stdout


def test_check_jobs_prove_side_by_side_with_the_same_output(tmp_path):
    """-j 2 (worker processes) and --jobs 1 print the same verdicts, and the same first error with
    the same exit status for a schedule that fails at a later instance; -j 0 is refused."""
    bad = tmp_path / "late.strata"
    bad.write_text("""schedule s(x: sym T[n]) implements allreduce(x, sum) {
  part = split(x, world)
  barrier
  on aiv: part[rank] = sum(part[rank]@p for p in ranks)
  on sdma: for p in peers: part[rank]@p = part[rank]
}
""")

    def lines(p):
        return [line.split(" (")[0] if "verified" in line else line for line in p.stdout.splitlines()]
    for args in (("examples/allreduce_ring.strata", "--world", "2-6"), (str(bad), "--world", "1-3")):
        one = stratac("check", *args, "--jobs", "1")
        two = stratac("check", *args, "-j", "2")
        no_traceback(two)
        assert (one.returncode, lines(one), one.stderr) == (two.returncode, lines(two), two.stderr)
    assert one.returncode == 1 and "E0304" in one.stderr + one.stdout
    p = stratac("check", "examples/allreduce_ring.strata", "-j", "0")
    assert p.returncode == 2 and "-j" in p.stderr, p.stderr
    no_traceback(p)


def test_check_proves_every_mask_of_a_moe_schedule():
    p = stratac("check", "examples/moe_decode.strata", "--world", "2,3")
    assert p.returncode == 0, p.stderr
    # worlds 2 and 3: 2 + 6 proper non-empty masks, each under every sample of its world once
    # (not once per instance of the unmasked check, as it was)
    for s in frontend.schedules(frontend.load_source(str(ROOT / "examples" / "moe_decode.strata"))):
        n = sum((2 ** w - 2) * len(verify.default_samples(s, w)) for w in (2, 3))
        assert f"{s.name}: verified every mask of active ranks for world 2,3 (8 masks, {n} instances," \
            in p.stdout, p.stdout


def test_syntax_error_points_at_line_and_column(tmp_path):
    f = tmp_path / "bad.strata"
    f.write_text("schedule s(x: sym T[n]) implements allreduce(x, sum) {\n  barrier\n  on aiv x = x\n}\n")
    p = stratac("check", f)
    assert p.returncode == 1
    assert f"{f}:3:10: error[E0001]: unexpected 'x'" in p.stderr
    assert "   3 |   on aiv x = x" in p.stderr and "^" in p.stderr
    no_traceback(p)


def test_unknown_name(tmp_path):
    f = tmp_path / "bad.strata"
    f.write_text("schedule s(x: sym T[n]) implements allreduce(x, sum) {\n"
                 "  barrier\n  on aiv: y[0:1] = x[0:1]\n  barrier\n}\n")
    p = stratac("check", f)
    assert p.returncode == 1
    assert f"{f}:3:11: error[E0101]: 'y' is not defined" in p.stderr
    no_traceback(p)


def test_world_size_the_schedule_cannot_handle(tmp_path):
    f = tmp_path / "ag.strata"
    f.write_text("schedule ag(x: sym T[n], out: sym T[2 * n]) implements allgather(x -> out) {\n"
                 "  blk = split(out, world)\n  barrier\n"
                 "  on sdma: for p in ranks: blk[rank]@p = x\n  barrier\n}\n")
    assert stratac("check", f, "--world", "2").returncode == 0
    p = stratac("check", f, "--world", "3")
    assert p.returncode == 1
    assert "error[E0202]" in p.stderr
    no_traceback(p)


@pytest.mark.parametrize("args,code,text", [
    (("check", "no/such.strata"), 1, "no such file: no/such.strata"),
    (("check", "examples/allgather_push.strata", "--world", "0"), 2, "--world"),
    (("run", "examples/allgather_push.strata", "--world", "2", "--size", "12Q"), 2, "not a size"),
    (("run", "examples/allgather_push.strata"), 2, "--world"),
    (("run", "examples/allgather_push.strata", "examples/allgather_push.strata", "--world", "2"), 1,
     "error[E0102]: schedule allgather_push is defined in both examples/allgather_push.strata and "
     "examples/allgather_push.strata: the files of one run must name their schedules apart"),
    (("compile", "examples/allgather_push.strata", "-o", "x", "--cores", "99"), 1,
     "--cores must be between 1 and 40"),
    (("compile", "examples/allgather_push.strata", "-o", "x", "--soc", "Ascend310"), 2, "--soc"),
])
def test_bad_files_and_flags(args, code, text):
    p = stratac(*args)
    assert p.returncode == code
    assert text in p.stderr
    no_traceback(p)


def test_compile_writes_the_four_files(tmp_path):
    p = stratac("compile", "examples/allreduce_twoshot.strata", "-o", tmp_path, "--dump-ir",
                "--soc", "Ascend910B1", "--cores", "48")
    assert p.returncode == 0, p.stderr
    d = tmp_path / "allreduce_twoshot"
    assert sorted(x.name for x in d.iterdir()) == ["CMakeLists.txt", "kernel.cpp", "launch.cpp",
                                                   "manifest.json"]
    assert "stage 1 on aiv" in p.stdout and "48 cores (Ascend910B1)" in p.stdout


def test_run_takes_several_files_in_one_job():
    """Each file its own module: every schedule of each runs, checked, in the files' order."""
    p = stratac("run", "examples/allgather_push.strata", "examples/allreduce_ring.strata", "--world", "2",
                "--count", "1001", "--op", "max")
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines()[1:] if line.strip()]
    assert [(r[0], r[-1]) for r in rows] == [("allgather_push", "OK"), ("allreduce_ring", "OK")]


def test_missing_compiler_is_a_clear_error(tmp_path):
    p = stratac("run", "examples/allgather_push.strata", "--world", "1", "--count", "4",
                env={"CXX": "no-such-g++", "STRATAC_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 1
    assert "error[E0402]: C++ compiler 'no-such-g++' not found" in p.stderr
    no_traceback(p)


def test_size_the_heap_cannot_hold():
    p = stratac("run", "examples/allgather_push.strata", "--world", "2", "--size", "100000G")
    assert p.returncode == 1
    assert "shared memory" in p.stderr
    no_traceback(p)


def test_npu_target_says_what_is_missing():
    """`run --target npu` goes through the NPU runtime (stratac.host.npu_comm), which names what is missing."""
    p = stratac("run", "examples/allgather_push.strata", "--world", "2", "--target", "npu",
                env={"ASCEND_HOME_PATH": ""})
    assert p.returncode == 1
    assert "ASCEND_HOME_PATH is not set" in p.stderr
    no_traceback(p)


def test_run_prints_one_line_per_schedule():
    p = stratac("run", "examples/allreduce_twoshot.strata", "--world", "2", "--size", "64K",
                "--cores", "4", "--iters", "2")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["schedule", "world", "size"]
    assert lines[1].split()[:3] == ["allreduce_twoshot", "2", "64.0KiB"]
    assert lines[1].endswith("OK")


def test_world_above_the_verifiers_bound_is_refused_at_once(tmp_path):
    for args, said in ((("check", "examples/allgather_push.strata", "--world", "100000"),
                        "is above 16,384, the largest world stratac verifies"),
                       (("check", "examples/allgather_push.strata", "--world", "1-100000000000000"),
                        "is above 16,384, the largest world stratac verifies"),
                       (("check", "examples/allgather_push.strata", "--world", "1-16384"),
                        "'1-16384' asks for more than 512 world sizes, each a proof of its own"),
                       (("compile", "examples/allgather_push.strata", "--world", "2,8-600"),
                        "'2,8-600' asks for more than 512 world sizes"),
                       (("simulate", "examples/allgather_push.strata", "--machine",
                         "machines/atlas950.toml", "--world", "20000"),
                        "world 20000 is above 16,384, the largest world stratac verifies"),
                       (("run", "examples/allgather_push.strata", "--world", "385"),
                        "world 385 is above 384, the most ranks stratac starts on this machine"),
                       (("tune", "examples/allreduce_ring.strata", "--world", "385"),
                        "world 385 is above 384, the most ranks stratac starts on this machine: rank "
                        "the schedules at that world by prediction (--machine TOML)"),
                       (("tune", "examples/allreduce_ring.strata", "--world", "16385", "--machine",
                         "machines/atlas950.toml"), "world 16385 is above 16,384")):
        p = stratac(*args, timeout=30)
        assert p.returncode == 2
        assert said in p.stderr, p.stderr
        no_traceback(p)
    # a world the verifier cannot hold is refused before the instance is built, in seconds
    p = stratac("check", "examples/allreduce_ring.strata", "--world", "8192", timeout=120)
    assert p.returncode == 1 and "allreduce_ring at n=1, world=8192 would hold about 939,425,792 " \
        "events, moves, sources, signals and waits (up to 114,676 on a rank), more than the " \
        "4,000,000 the verifier holds: " \
        "refused before it is built" in p.stderr, p.stderr
    no_traceback(p)
    # 384 itself is verified (an empty AllReduce fails at once, for world 384)
    f = tmp_path / "empty.strata"
    f.write_text("schedule empty(x: sym T[n]) implements allreduce(x, sum) {\n}\n")
    p = stratac("check", f, "--world", "384", timeout=120)
    assert p.returncode == 1 and "(world=384, " in p.stderr
    no_traceback(p)


def test_size_that_is_not_whole_elements_is_refused():
    for size, dtype, elem, example in (("10", "f32", 4, 8), ("3", "bf16", 2, 2), ("0", "i32", 4, 4)):
        p = stratac("run", "examples/allgather_push.strata", "--world", "2", "--size", size, "--dtype", dtype)
        assert p.returncode == 2
        assert (f"stratac: error: --size {size} is not a positive multiple of the {dtype} element size "
                f"({elem} bytes): give a multiple of {elem}, e.g. {example}, or --count") in p.stderr
        assert p.stdout == ""   # refused before anything ran
        no_traceback(p)


def test_byte_order_mark_is_not_text(tmp_path):
    bom = "\ufeff"
    good = tmp_path / "good.strata"
    good.write_text(bom + (ROOT / "examples" / "allgather_push.strata").read_text(), encoding="utf-8")
    p = stratac("check", good, "--world", "2")
    assert p.returncode == 0, p.stderr
    # positions are those an editor shows, which hides the mark: on its line and after it
    for text, where in (("schedule 1s(x: sym T[n]) implements allreduce(x, sum) {\n}\n", "1:10"),
                        (("schedule s(x: sym T[n]) implements allreduce(x, sum) {\n  barrier\n"
                          "  on aiv x = x\n}\n"), "3:10")):
        f = tmp_path / "bad.strata"
        f.write_text(bom + text, encoding="utf-8")
        p = stratac("check", f)
        assert p.returncode == 1
        assert f"{f}:{where}: error[E0001]: unexpected" in p.stderr
        assert bom not in p.stderr
        no_traceback(p)


def test_compile_output_that_cannot_be_a_directory(tmp_path):
    ex = "examples/allgather_push.strata"
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    blocked = tmp_path / "out"
    blocked.mkdir()
    (blocked / "allgather_push").write_text("a file where the schedule's directory goes\n")
    for out, text in ((afile, f"error[E0403]: -o {afile} is a file, not a directory"),
                      (afile / "sub", (f"error[E0403]: -o {afile / 'sub'}: {afile} is a file, not a "
                                       "directory")),
                      (blocked, (f"error[E0403]: cannot write {blocked / 'allgather_push'}/: a file of "
                                 "that name is in the way")),
                      # a directory nobody can create in, root included (the message depends on who)
                      (Path("/proc/stratac-out"), "error[E0403]: ")):
        p = stratac("compile", ex, "-o", out)
        assert p.returncode == 1
        assert text in p.stderr and str(out) in p.stderr
        no_traceback(p)
    assert afile.read_text() == "keep me\n"


def test_compile_into_a_directory_without_write_permission(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    as_user = []
    if os.geteuid() == 0:   # root writes anywhere: drop the capability that lets it
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv writes into a read-only directory")
        as_user = ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override"]
    p = subprocess.run([*as_user, sys.executable, "-m", "stratac", "compile",
                        "examples/allgather_push.strata", "-o", str(ro / "gen")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 1
    assert f"error[E0403]: -o {ro / 'gen'}: cannot write into {ro} (permission denied)" in p.stderr
    no_traceback(p)


DIVISOR = ROOT / "tests" / "verify" / "corpus" / "good_divisor_team_size.strata"   # g: divisor


@pytest.mark.parametrize("args,text", [
    ((), "two_level takes a divisor parameter: give --param g=D, D a divisor of the world 6 (1, 2, 3, 6)"),
    (("--param", "g=4"), "--param g=4 does not divide the world 6 (its divisors: 1, 2, 3, 6)"),
    (("--param", "g=2", "--param", "h=3"), "--param h: no schedule of the file takes a divisor parameter h"),
    (("--param", "g"), "'g' is not NAME=VALUE"),
    (("--param", "g=two"), "'two' is not an integer"),
])
def test_run_names_a_divisor_parameter_missing_or_wrong(args, text):
    """`stratac run --param NAME=D`: every divisor parameter given, each a divisor of the world,
    each some schedule's; refused before any rank starts."""
    p = stratac("run", DIVISOR, "--world", "6", "--count", "8", *args)
    assert p.returncode in (1, 2) and text in p.stderr, p.stderr
    no_traceback(p)


def test_bench_and_simulate_say_they_cannot_give_a_divisor_parameter():
    p = stratac("bench", DIVISOR, "--world", "2", "--sizes", "4K")
    assert p.returncode != 0 and "which `stratac bench` cannot give yet: run it with `stratac run " \
        "--param g=D`" in p.stderr, p.stderr
    no_traceback(p)
    p = stratac("simulate", DIVISOR, "--world", "8", "--machine", ROOT / "machines" / "cloudmatrix384.toml")
    assert "two_level: skipped: not modelled: it takes a divisor parameter (g)" in p.stdout + p.stderr
    no_traceback(p)
