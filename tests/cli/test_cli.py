"""The command line as a user meets it: real subprocesses, exit codes, messages, no tracebacks."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
