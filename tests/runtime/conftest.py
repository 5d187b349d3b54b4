"""Builds the CPU model (libstratacpu.so) and the C++ test programs once per session."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "runtime" / "cpu" / "include"
MODEL_SRCS = sorted((REPO / "runtime" / "cpu" / "src").glob("*.cpp"))   # one file per concept
CPP_DIR = Path(__file__).resolve().parent / "cpp"


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    return tmp_path_factory.mktemp("stratacpu_build")


@pytest.fixture(scope="session")
def libstratacpu(build_dir: Path) -> Path:
    """The model library, built with the documented command."""
    lib = build_dir / "libstratacpu.so"
    _run(["g++", "-std=c++17", "-O2", "-fPIC", "-shared", *map(str, MODEL_SRCS), f"-I{INCLUDE}",
          "-o", str(lib), "-pthread", "-lrt"])
    return lib


@pytest.fixture(scope="session")
def driver(build_dir: Path, libstratacpu: Path) -> Path:
    """Test kernels as a shared library linked against the model (as generated kernels are),
    plus the host driver that forks ranks and launches them."""
    kernels = build_dir / "libtestkernels.so"
    _run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
          str(CPP_DIR / "kernels.cpp"), f"-I{INCLUDE}", f"-L{build_dir}", "-lstratacpu",
          f"-Wl,-rpath,{build_dir}", "-o", str(kernels)])
    exe = build_dir / "driver"
    _run(["g++", "-std=c++17", "-O2", "-Wall", "-Werror", str(CPP_DIR / "driver.cpp"), f"-I{INCLUDE}",
          f"-L{build_dir}", "-ltestkernels", "-lstratacpu", f"-Wl,-rpath,{build_dir}", "-o", str(exe),
          "-pthread", "-lrt"])
    return exe
