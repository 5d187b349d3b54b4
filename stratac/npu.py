"""The NPU target: finds CANN and SHMEM for Ascend. Without them it says exactly what is missing."""

from __future__ import annotations

import os
from pathlib import Path

ASCENDC_CMAKE_DIRS = ("tools/tikcpp/ascendc_kernel_cmake", "compiler/tikcpp/ascendc_kernel_cmake",
                      "ascendc_devkit/tikcpp/samples/cmake")


def find_cann() -> tuple[Path | None, str]:
    home = os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None, ("CANN not found: ASCEND_HOME_PATH is not set. Install the CANN toolkit and run "
                      "`source <CANN>/set_env.sh`, or export ASCEND_HOME_PATH=<CANN install dir>")
    root = Path(home)
    for d in ASCENDC_CMAKE_DIRS:
        if (root / d / "ascendc.cmake").is_file():
            return root / d, ""
    return None, (f"ASCEND_HOME_PATH={home} has no ascendc.cmake under "
                  f"{', '.join(ASCENDC_CMAKE_DIRS)}: is it a CANN toolkit install?")


def missing_toolchain_message() -> str:
    cmake_dir, why = find_cann()
    if cmake_dir is None:
        return f"the npu target cannot build here: {why}"
    if not os.environ.get("SHMEM_HOME"):
        return ("the npu target needs SHMEM for Ascend: set SHMEM_HOME to its install prefix "
                "(include/shmem.h, lib/)")
    return "the npu target's build driver is not implemented yet; use `stratac compile` and the generated CMakeLists.txt"
