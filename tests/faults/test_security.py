"""Security: private, unguessable shared-memory segments; a segment someone else made is refused;
nothing from a .strata file or its name reaches a shell or the generated code."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import ROOT

from stratac.diagnostics import StrataError
from stratac.host import comm as C
from stratac.host import errors
from stratac.lang import frontend
from stratac.tools.run import runner

AR = ROOT / "examples" / "allreduce_twoshot.strata"


def test_segment_names_are_unguessable_and_private(monkeypatch):
    names = {C._segment_name() for _ in range(2000)}
    assert len(names) == 2000
    for n in list(names)[:50]:
        assert re.fullmatch(rf"/stratac-{os.getuid()}-[0-9a-f]{{24}}", n), n   # 96 random bits
    name = C._segment_name()
    old = os.umask(0)   # the pool is 0600 whatever the umask
    try:
        comm = C.Communicator(0, 1, segment=name, create=True, heap_bytes=1 << 20, timeout=5)
    finally:
        os.umask(old)
    try:
        st = os.stat("/dev/shm" + name)
        assert st.st_mode & 0o7777 == 0o600 and st.st_uid == os.geteuid()
    finally:
        comm.close(unlink=True, collective=False)
    assert not os.path.exists("/dev/shm" + name)


def _plant(name: str, mode: int, uid: int | None = None) -> Path:
    """A segment of the right size that someone else could have made."""
    path = Path("/dev/shm" + name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
    os.ftruncate(fd, 128 * 1024 + (1 << 20))
    os.close(fd)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


@pytest.mark.parametrize("mode,uid,why", [
    (0o644, None, r"owned by uid \d+ with mode 0644"),
    (0o666, None, r"owned by uid \d+ with mode 0666"),
    (0o600, 4242, r"owned by uid 4242 with mode 0600"),
])
def test_a_segment_not_made_privately_by_this_user_is_refused(mode, uid, why):
    if uid is not None and os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    name = C._segment_name()
    path = _plant(name, mode, uid)
    try:
        with pytest.raises(errors.StrataRuntimeError) as exc:
            C.Communicator(0, 1, segment=name, create=False, heap_bytes=1 << 20, timeout=5)
        msg = str(exc.value)
        assert re.search(rf"cannot map the symmetric heap: strata_cpu_init: refusing segment {name}: it is "
                         rf"{why}, but a pool must belong to this user \(uid {os.geteuid()}\) with mode 0600",
                         msg), msg
        # creating one under a name that exists fails too (O_EXCL), whoever made it
        with pytest.raises(errors.StrataRuntimeError, match="File exists"):
            C.Communicator(0, 1, segment=name, create=True, heap_bytes=1 << 20, timeout=5)
    finally:
        path.unlink()


def _subprocess_calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f"{getattr(f.value, 'id', '?')}.{f.attr}" if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            yield name, node


def _stringish(node: ast.AST) -> bool:
    """A string, an f-string, or strings joined with + or formatted with %: a command line."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _stringish(node.left) or _stringish(node.right)
    return False


def test_nothing_reaches_a_shell():
    """Every process stratac starts gets an argument list; no shell=True, os.system or popen."""
    seen = 0
    for path in sorted((ROOT / "stratac").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for name, call in _subprocess_calls(tree):
            assert name not in ("os.system", "os.popen", "subprocess.getoutput",
                                "subprocess.getstatusoutput", "os.execl", "os.execlp", "os.spawnl"), \
                f"{path.name}:{call.lineno}: {name}"
            if name.startswith("subprocess."):
                seen += 1
                for kw in call.keywords:
                    assert not (kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                           and kw.value.value is False)), \
                        f"{path.name}:{call.lineno}: shell="
                if call.args:
                    assert not _stringish(call.args[0]), f"{path.name}:{call.lineno}: a command string"
    assert seen >= 3


def test_a_file_name_full_of_shell_characters_runs_and_injects_nothing(tmp_path, monkeypatch):
    """Spaces, quotes, $(...), backticks, ; and & in the file name: it runs like any other, and
    no command hidden in it is executed anywhere (cwd, cache, build directories)."""
    monkeypatch.chdir(tmp_path)
    weird = tmp_path / """my "sched" 'x' $(touch PWNED1) `touch PWNED2`; touch PWNED3 & a.strata"""
    shutil.copy(AR, weird)
    out = runner.run(runner.RunSpec(file=str(weird), world=1, cases=[runner.Case(count=100)], iters=1,
                                    warmup=0, cores=2, timeout=30), echo=lambda s: None)
    assert out.exit_code == 0 and out.failures == [] and [r["ok"] for r in out.results] == [True]
    from stratac.targets import cpu as build
    for where in (tmp_path, build.cache_root(), Path.cwd()):
        assert not [p for p in where.rglob("PWNED*")], where


def test_a_line_break_in_a_source_name_is_refused(tmp_path):
    """The source name is written into comments of kernel.cpp, launch.cpp and CMakeLists.txt: a line
    break there would make the rest of the name C++ or CMake. Refused before anything is written."""
    bad = tmp_path / "x\nexecute_process(COMMAND touch PWNED)\n#.strata"
    shutil.copy(AR, bad)
    with pytest.raises(StrataError) as exc:
        frontend.load_source(bad)
    assert "error[E0001]" in str(exc.value) and "contains the control character '\\n'" in str(exc.value)
    p = subprocess.run([sys.executable, "-m", "stratac", "compile", str(bad), "-o", str(tmp_path / "gen"),
                        "--world", "2"], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 1 and "contains the control character" in p.stderr
    assert not (tmp_path / "gen").exists()
    # the Python API's source text with a made-up name goes through the same check at build time
    from stratac import codegen
    from stratac.ir import passes
    from stratac.targets import cpu as build
    s = frontend.schedules(frontend.Source("evil\n#include </etc/passwd>\n", AR.read_text()))[0]
    with pytest.raises(StrataError, match="control character"):
        build.build_cpu(codegen.generate(passes.pipeline(s, passes.Options(cores=2))))


def test_a_schedule_name_is_an_identifier():
    text = AR.read_text().replace("schedule allreduce_twoshot(", "schedule allreduce$(touch x)(")
    with pytest.raises(StrataError) as exc:
        frontend.schedules(frontend.Source("t.strata", text))
    assert "error[E0001]" in str(exc.value)
