"""`stratac doctor` on this machine and on a machine without a C++ compiler."""

import sys

import pytest

from stratac.targets import npu
from stratac.tools import doctor

ITEMS = ["Python", "torch", "torch_npu", "C++ compiler", "cmake", "CANN", "SHMEM", "cache",
         "target cpu", "target npu"]


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def rows_by_item(rows):
    return {r.item: r for r in rows}


def test_this_machine_can_build_and_run_the_cpu_target(cache):
    rows = doctor.collect()
    assert [r.item for r in rows] == ITEMS
    by = rows_by_item(rows)
    assert by["Python"].status == "ok" and sys.executable in by["Python"].detail
    assert by["torch"].status == "ok"
    assert by["C++ compiler"].status == "ok"
    assert by["target cpu"].status == "ok" and "builds and runs" in by["target cpu"].detail
    assert by["cache"].status == "ok" and str(cache) in by["cache"].detail
    assert doctor.exit_status(rows) == 0
    text = doctor.render(rows)
    for item in ITEMS:
        assert f"\n{item} " in text
    assert text.rstrip().endswith("exit status 0: the cpu target works here")
    if npu.torch_npu_installed() is None:
        assert by["torch_npu"].status == "missing"
        assert "pip install torch_npu" in by["torch_npu"].next_step
        assert "torch_npu" not in sys.modules          # looked up, never imported


def test_without_a_cxx_compiler_the_cpu_row_says_what_to_install(cache, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    rows = doctor.collect()
    by = rows_by_item(rows)
    assert by["C++ compiler"].status == "missing"
    assert by["C++ compiler"].detail == "CXX=no-such-compiler: not found"
    cpu = by["target cpu"]
    assert cpu.status == "FAIL" and "apt-get install g++" in cpu.next_step
    assert doctor.exit_status(rows) != 0
    text, code = doctor.report()
    assert code == 1
    assert "next: install g++: apt-get install g++" in text
    assert "exit status 1: the cpu target does not work here" in text


def test_npu_rows_name_each_missing_piece(cache, monkeypatch):
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "SHMEM_HOME", "SHMEM_HOME_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(npu, "DEFAULT_CANN_ROOTS", ())
    by = rows_by_item(doctor.collect())
    assert by["CANN"].status == "missing" and by["CANN"].detail == "ASCEND_HOME_PATH is not set"
    assert "export ASCEND_HOME_PATH=" in by["CANN"].next_step
    assert by["SHMEM"].status == "missing" and "SHMEM_HOME" in by["SHMEM"].next_step
    assert by["target npu"].status == "FAIL"
    assert by["target npu"].detail.startswith("cannot build: missing CANN toolkit")


def test_npu_toolchain_found_but_nothing_to_run_on(cache, monkeypatch, tmp_path):
    cann = tmp_path / "cann" / "compiler" / "tikcpp" / "ascendc_kernel_cmake"
    cann.mkdir(parents=True)
    (cann / "ascendc.cmake").write_text("")
    (tmp_path / "cann" / "compiler" / "version.info").write_text("Version=8.3.RC1\n")
    (tmp_path / "shmem" / "include").mkdir(parents=True)
    (tmp_path / "shmem" / "include" / "shmem.h").write_text("")
    (tmp_path / "shmem" / "lib").mkdir()
    (tmp_path / "shmem" / "lib" / "libshmem.so").write_bytes(b"")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "cann"))
    monkeypatch.setenv("SHMEM_HOME", str(tmp_path / "shmem"))
    by = rows_by_item(doctor.collect())
    assert by["CANN"].status == "ok" and by["CANN"].detail == f"8.3.RC1 ({tmp_path / 'cann'})"
    assert by["SHMEM"].status == "ok" and by["SHMEM"].detail == f"{tmp_path / 'shmem'} (libshmem.so)"
    if by["cmake"].status == "ok" and not npu.npu_available()[0]:
        row = by["target npu"]
        assert row.status == "FAIL" and row.detail.startswith("builds, cannot run: ")


def test_torch_npu_without_cann_warns_about_autoload():
    assert doctor.autoload_breaks_torch("2.7.1", cann_found=False, env={})
    assert not doctor.autoload_breaks_torch("2.7.1", cann_found=False,
                                            env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert not doctor.autoload_breaks_torch("2.7.1", cann_found=True, env={})
    assert not doctor.autoload_breaks_torch(None, cann_found=False, env={})
