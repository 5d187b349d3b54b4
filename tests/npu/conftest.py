"""Fake CANN / SHMEM / cmake installs for the NPU driver's tests, and the `npu` marker: tests
that need a real Ascend NPU are skipped, with the reason, wherever one is not available."""

import os
import stat
import types
from pathlib import Path

import pytest

from stratac.targets import npu


def pytest_runtest_setup(item):
    if item.get_closest_marker("npu") is not None:
        ok, why = npu.npu_available()
        if not ok:
            pytest.skip(f"needs an Ascend NPU with CANN, SHMEM for Ascend and torch_npu: {why}")


def make_cann(root: Path, cmake_dir: str = npu.ASCENDC_CMAKE_DIRS[1], version: str | None = "8.3.RC1",
              ) -> Path:
    """A directory shaped like a CANN toolkit install: ascendc.cmake, and the version record
    CANN's install guide points to (<arch>-linux/ascend_toolkit_install.info)."""
    (root / cmake_dir).mkdir(parents=True)
    (root / cmake_dir / "ascendc.cmake").write_text("# fake\n")
    if version is not None:
        info = root / "x86_64-linux" / "ascend_toolkit_install.info"
        info.parent.mkdir(parents=True)
        info.write_text(f"package_name=Ascend-cann-toolkit\nversion={version}\narch=x86_64\n")
    return root


def make_shmem(root: Path, lib: bool = True) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "shmem.h").write_text("// fake\n")
    if lib:
        (root / "lib").mkdir()
        (root / "lib" / "libshmem.so").write_bytes(b"\x7fELF fake")
    return root


def make_cmake(directory: Path, version: str = "3.27.4") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "cmake"
    exe.write_text(f"#!/bin/sh\necho 'cmake version {version}'\necho\n"
                   "echo 'CMake suite maintained and supported by Kitware (kitware.com/cmake).'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


@pytest.fixture
def fake():
    """Factories of fake installs: fake.cann(dir), fake.shmem(dir), fake.cmake(dir)."""
    return types.SimpleNamespace(cann=make_cann, shmem=make_shmem, cmake=make_cmake)


@pytest.fixture
def npu_env(tmp_path):
    """An environment in which the whole toolchain is found (fakes under tmp_path)."""
    cann = make_cann(tmp_path / "cann")
    shmem = make_shmem(tmp_path / "shmem")
    cmake = make_cmake(tmp_path / "bin")
    return {"PATH": os.environ.get("PATH", os.defpath), "ASCEND_HOME_PATH": str(cann),
            "SHMEM_HOME": str(shmem), "CMAKE": str(cmake)}
