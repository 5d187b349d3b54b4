"""Every diagnostic code of stratac.diagnostics.Codes provoked through the real entry point,
stratac.cli.main (the function `python -m stratac` calls), and rendered where it belongs.

The front-end and verifier codes come from one file of the corpus each (tests/frontend/corpus,
tests/verify/corpus): `stratac check` on it must exit 1 and print `FILE:LINE:COL: error[CODE]` on the
line the file's `# expect-error[CODE]` marker names. E0307 (a stamp the kernel cannot synchronise
with) comes only from a bug in stratac's own passes, so `stratac compile` runs with the epoch pass
broken as it once was; E0401 (a failed build) from a real g++ on a copy of stratac whose CPU model
source is broken. E0402 and E0403 are provoked in tests/cli/test_cli.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from old_passes import epoch_pass_before_ifs

from stratac import cli
from stratac.diagnostics import Codes
from stratac.ir import passes

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "tests" / "frontend" / "corpus"
VERIFY = ROOT / "tests" / "verify" / "corpus"

# code -> the corpus file that provokes it under `stratac check`
BY_CHECK = {
    Codes.SYNTAX: FRONT / "syntax_bad_token.strata",
    Codes.UNKNOWN_NAME: FRONT / "unknown_name.strata",
    Codes.DUPLICATE_NAME: FRONT / "duplicate_param.strata",
    Codes.BAD_TYPE: FRONT / "allgather_type_mismatch.strata",
    Codes.BAD_CONTRACT: FRONT / "contract_missing_root.strata",
    Codes.BAD_ENGINE: FRONT / "accumulate_on_sdma.strata",
    Codes.BAD_REF: FRONT / "index_unsplit.strata",
    Codes.BAD_SIZE: FRONT / "size_not_inferable.strata",
    Codes.NOT_SYMMETRIC: FRONT / "remote_non_symmetric.strata",
    Codes.CALL: FRONT / "call_errors.strata",
    Codes.IMPORT: FRONT / "import_missing.strata",
    Codes.BAD_WORLD: VERIFY / "world_division_by_zero.strata",
    Codes.SHAPE: VERIFY / "shape_allgather_output_size.strata",
    Codes.RACE: VERIFY / "race_read_write_across_ranks.strata",
    Codes.DEADLOCK: VERIFY / "deadlock_cycle.strata",
    Codes.EXIT: VERIFY / "exit_missing_last_barrier.strata",
    Codes.CONTRACT: VERIFY / "contract_accumulate_op_mismatch.strata",
    Codes.DOUBLE_SIGNAL: VERIFY / "double_signal.strata",
}


def all_codes() -> set[str]:
    return {v for k, v in vars(Codes).items() if k.isupper()}


def worlds_of(path: Path) -> str:
    first = path.read_text().splitlines()[:1]
    m = re.match(r"#\s*worlds:\s*(\S+)", first[0]) if first else None
    return m.group(1) if m else "1-8"


def marked_lines(path: Path, code: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if f"expect-error[{code}]" in line]


def test_every_code_is_provoked_here_or_in_test_cli():
    elsewhere = {Codes.SYNC_STAMP, Codes.BUILD}            # below
    in_test_cli = {Codes.TOOLCHAIN, Codes.OUTPUT}          # test_missing_compiler..., test_compile_output...
    assert set(BY_CHECK) | elsewhere | in_test_cli == all_codes()
    text = (ROOT / "tests" / "cli" / "test_cli.py").read_text()
    assert all(f"error[{c}]" in text for c in in_test_cli)


@pytest.mark.parametrize("code", sorted(BY_CHECK))
def test_check_reports_the_code_on_the_marked_line(code, capsys):
    path = BY_CHECK[code]
    lines = marked_lines(path, code)
    assert lines, f"{path.name} has no expect-error[{code}] marker"
    rc = cli.main(["check", str(path), "--world", worlds_of(path)])
    err = capsys.readouterr().err
    assert rc == 1, err
    found = [int(m.group(1)) for m in re.finditer(rf"^{re.escape(str(path))}:(\d+):\d+: error\[{code}\]: ",
                                                   err, re.M)]
    assert found and set(found) <= set(lines), (lines, err)
    assert "Traceback" not in err


def test_sync_stamp_from_a_broken_pass_through_compile(tmp_path, monkeypatch, capsys):
    """`stratac compile` with the epoch pass of old (barriers under ifs left at stamp 0): the source
    verifies, the IR after the passes does not, E0307 names the barrier and nothing is written."""

    monkeypatch.setattr(passes, "flag_epochs", epoch_pass_before_ifs)
    src = VERIFY / "good_barriers_under_if.strata"
    rc = cli.main(["compile", str(src), "-o", str(tmp_path / "out"), "--world", "2"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert re.search(rf"^{re.escape(str(src))}:10:\d+: error\[E0307\]: ", err, re.M), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_build_failure_from_a_real_compiler_on_a_broken_runtime_copy(tmp_path):
    """A copy of stratac (package, dsl/, templates/, runtime/) whose CPU model source has an
    `#error`: `stratac run` there builds the model with the real g++, which fails; the run stops
    with E0401 naming what was built, the command and the compiler's message, exit 1."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ (E0402 then; tests/cli/test_cli.py)")
    copy = tmp_path / "copy"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("stratac", "dsl", "templates", "runtime"):
        shutil.copytree(ROOT / d, copy / d, ignore=skip)
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    model = copy / "runtime" / "cpu" / "src" / "pool.cpp"
    model.write_text("#error strata-test: a broken copy of the CPU model\n" + model.read_text())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(copy),
           "STRATAC_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "stratac", "run", str(ROOT / "examples" / "allgather_push.strata"),
                        "--world", "1", "--count", "8", "--iters", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "error[E0401]: building the CPU model (libstratacpu.so) failed (exit 1):" in p.stderr, p.stderr
    assert "#error strata-test: a broken copy of the CPU model" in p.stderr
    assert "Traceback" not in p.stderr
