"""An installed stratac works outside the checkout: dsl/, templates/ and runtime/ ship in the wheel."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_works_outside_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(wheels.glob("stratac-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("stratac/dsl/strata.lark", "stratac/templates/kernel.cpp.j2",
                     "stratac/runtime/device/strata_device.h", "stratac/runtime/cpu/src/model.cpp",
                     "stratac/runtime/cpu/include/kernel_operator.h"):
        assert required in names, required
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=600)
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "ar.strata").write_text((ROOT / "examples" / "allreduce_twoshot.strata").read_text())
    env = dict(os.environ, PYTHONPATH=str(site), STRATAC_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "stratac", "run", "ar.strata", "--world", "2",
                          "--count", "1000", "--cores", "2", "--iters", "1"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].endswith("OK")
    probe = subprocess.run([sys.executable, "-c", "import stratac.resources as r; "
                            "print(r.resource_dir('runtime'))"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip().startswith(str(site))
