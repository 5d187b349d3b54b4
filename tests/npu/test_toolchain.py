"""Toolchain discovery against fake install trees: what is found, and the exact words when not."""

import os

import pytest

from stratac.diagnostics import Codes, StrataError
from stratac.targets import npu

PATH = os.environ.get("PATH", os.defpath)


def test_cann_unset_names_the_variable_and_set_env():
    m = npu.find_cann({"PATH": PATH}, default_roots=())
    assert isinstance(m, npu.Missing)
    assert m.what == "CANN toolkit: ASCEND_HOME_PATH is not set"
    assert "source <CANN>/set_env.sh" in m.fix and "export ASCEND_HOME_PATH=" in m.fix


def test_cann_unset_but_installed_in_a_default_place_says_which_set_env(tmp_path, fake):
    home = fake.cann(tmp_path / "Ascend" / "ascend-toolkit" / "latest")
    m = npu.find_cann({}, default_roots=(str(tmp_path / "nowhere"), str(home)))
    assert isinstance(m, npu.Missing)
    assert f"a CANN toolkit is installed at {home}" in m.what
    assert m.fix == f"run `source {home}/set_env.sh`, or export ASCEND_HOME_PATH={home}"


def test_cann_path_that_does_not_exist(tmp_path):
    m = npu.find_cann({"ASCEND_HOME_PATH": str(tmp_path / "gone")}, default_roots=())
    assert isinstance(m, npu.Missing)
    assert m.what == f"CANN toolkit: ASCEND_HOME_PATH={tmp_path / 'gone'} does not exist"


def test_cann_dir_without_ascendc_cmake_lists_where_it_looked(tmp_path):
    (tmp_path / "compiler").mkdir()
    m = npu.find_cann({"ASCEND_HOME_PATH": str(tmp_path)}, default_roots=())
    assert isinstance(m, npu.Missing)
    assert m.what == (f"CANN toolkit: ASCEND_HOME_PATH={tmp_path} has no ascendc.cmake under "
                      "tools/tikcpp/ascendc_kernel_cmake, compiler/tikcpp/ascendc_kernel_cmake, "
                      "ascendc_devkit/tikcpp/samples/cmake")
    assert "point ASCEND_HOME_PATH at the CANN toolkit install" in m.fix


@pytest.mark.parametrize("where", npu.ASCENDC_CMAKE_DIRS)
def test_cann_found_in_each_documented_place_with_its_version(tmp_path, fake, where):
    home = fake.cann(tmp_path / "cann", cmake_dir=where, version="8.3.RC1")
    c = npu.find_cann({"ASCEND_HOME_PATH": str(home)}, default_roots=())
    assert isinstance(c, npu.Cann)
    assert c.home == home and c.cmake_dir == home / where
    assert c.version == "8.3.RC1"
    assert c.version_file == home / "x86_64-linux" / "ascend_toolkit_install.info"


def test_cann_search_order_prefers_tools_over_compiler(tmp_path, fake):
    home = fake.cann(tmp_path / "cann", cmake_dir=npu.ASCENDC_CMAKE_DIRS[1])
    (home / npu.ASCENDC_CMAKE_DIRS[0]).mkdir(parents=True)
    (home / npu.ASCENDC_CMAKE_DIRS[0] / "ascendc.cmake").write_text("")
    c = npu.find_cann({"ASCEND_HOME_PATH": str(home)}, default_roots=())
    assert c.cmake_dir == home / npu.ASCENDC_CMAKE_DIRS[0]


def test_cann_version_from_compiler_version_info_or_unknown(tmp_path, fake):
    home = fake.cann(tmp_path / "cann", version=None)
    assert npu.find_cann({"ASCEND_HOME_PATH": str(home)}, default_roots=()).version == "unknown"
    (home / "compiler" / "version.info").write_text("Version=7.0.0.alpha003\n")
    c = npu.find_cann({"ASCEND_HOME_PATH": str(home)}, default_roots=())
    assert (c.version, c.version_file) == ("7.0.0.alpha003", home / "compiler" / "version.info")


def test_ascend_toolkit_home_is_the_fallback_variable(tmp_path, fake):
    home = fake.cann(tmp_path / "cann")
    c = npu.find_cann({"ASCEND_TOOLKIT_HOME": str(home)}, default_roots=())
    assert isinstance(c, npu.Cann) and c.home == home


def test_shmem_unset_names_both_variables():
    m = npu.find_shmem({})
    assert isinstance(m, npu.Missing)
    assert m.what == "SHMEM for Ascend: neither SHMEM_HOME nor SHMEM_HOME_PATH is set"
    assert "export SHMEM_HOME=<prefix with include/shmem.h and lib/libshmem.so>" in m.fix
    assert "shmem/latest/set_env.sh" in m.fix


def test_shmem_home_without_header(tmp_path):
    m = npu.find_shmem({"SHMEM_HOME": str(tmp_path)})
    assert m.what == f"SHMEM for Ascend: SHMEM_HOME={tmp_path} has no {tmp_path}/include/shmem.h"


def test_shmem_home_without_library(tmp_path, fake):
    home = fake.shmem(tmp_path / "shmem", lib=False)
    m = npu.find_shmem({"SHMEM_HOME": str(home)})
    assert m.what == f"SHMEM for Ascend: {home} has include/shmem.h but no lib/libshmem.so"


def test_shmem_found_from_shmem_home_and_from_its_own_set_env(tmp_path, fake):
    home = fake.shmem(tmp_path / "latest" / "shmem")
    for env in ({"SHMEM_HOME": str(home)}, {"SHMEM_HOME_PATH": str(tmp_path / "latest")}):
        s = npu.find_shmem(env)
        assert isinstance(s, npu.Shmem), env
        assert s.home == home and s.library == home / "lib" / "libshmem.so"


def test_cmake_missing_too_old_and_found(tmp_path, fake):
    m = npu.find_cmake({"PATH": str(tmp_path), "CMAKE": "no-such-cmake"})
    assert m.what == "cmake: CMAKE=no-such-cmake is not an executable" and "CMAKE=" in m.fix
    assert npu.find_cmake({"PATH": str(tmp_path)}).what == "cmake: not on PATH"
    old = fake.cmake(tmp_path / "old", version="3.10.2")
    m = npu.find_cmake({"PATH": str(tmp_path), "CMAKE": str(old)})
    assert m.what == f"cmake: {old} is version 3.10.2, older than 3.16"
    new = fake.cmake(tmp_path / "new", version="3.27.4")
    c = npu.find_cmake({"PATH": str(tmp_path / "new")})
    assert (c.path, c.version) == (str(new), "3.27.4")


def test_find_toolchain_raises_one_error_naming_everything_missing(tmp_path):
    with pytest.raises(StrataError) as exc:
        npu.find_toolchain({"PATH": str(tmp_path)}, default_roots=())
    [d] = exc.value.diagnostics
    assert d.code == Codes.TOOLCHAIN
    assert d.message == ("the npu target cannot build here: CANN toolkit: ASCEND_HOME_PATH is not "
                         "set; cmake: not on PATH; SHMEM for Ascend: neither SHMEM_HOME nor "
                         "SHMEM_HOME_PATH is set")
    notes = [n.message for n in d.notes]
    assert [n.split(":")[0] for n in notes] == ["CANN toolkit", "cmake", "SHMEM for Ascend"]
    text = d.render()
    for var in ("ASCEND_HOME_PATH", "CMAKE", "SHMEM_HOME", "SHMEM_HOME_PATH"):
        assert var in text
    assert "Traceback" not in text


def test_find_toolchain_with_everything(npu_env):
    tc = npu.find_toolchain(npu_env, default_roots=())
    assert tc.cann.version == "8.3.RC1" and tc.cmake.version == "3.27.4"
    assert str(tc.shmem.home) == npu_env["SHMEM_HOME"]
    ident = tc.identity()
    assert ident["cann_version"] == "8.3.RC1" and ident["shmem"] == npu_env["SHMEM_HOME"]


def test_missing_toolchain_message_names_each_piece_and_its_next_step(tmp_path, monkeypatch):
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "SHMEM_HOME", "SHMEM_HOME_PATH", "CMAKE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(npu, "DEFAULT_CANN_ROOTS", ())
    msg = npu.missing_toolchain_message()
    first = msg.splitlines()[0]
    assert first.startswith("the npu target cannot run here: CANN toolkit: ASCEND_HOME_PATH is not set")
    assert "SHMEM for Ascend: neither SHMEM_HOME nor SHMEM_HOME_PATH is set" in first
    if npu.torch_npu_installed() is None:
        assert "torch_npu: not installed" in first
        assert "note: torch_npu: pip install torch_npu" in msg
    assert "note: CANN toolkit: install the CANN toolkit and run `source <CANN>/set_env.sh`" in msg


def test_require_npu_adds_torch_npu_and_the_device(npu_env):
    if npu.npu_available(npu_env, default_roots=())[0]:
        pytest.skip("this machine has torch_npu and an NPU")
    with pytest.raises(StrataError) as exc:
        npu.require_npu(npu_env, default_roots=())
    d = exc.value.diagnostics[0]
    assert d.message.startswith("the npu target cannot run here: ")
    assert "CANN" not in d.message and "SHMEM" not in d.message    # those were found
    if npu.torch_npu_installed() is None:
        assert "torch_npu: not installed" in d.message
