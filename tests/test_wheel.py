"""An installed stratac works outside the checkout: every module, dsl/, templates/, runtime/ and the
example schedules ship in the wheel; installing it keeps a torch the environment already has."""

import json
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
    modules = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "stratac").rglob("*.py"))
    assert [m for m in modules if m not in names] == [], "modules missing from the wheel (pyproject packages)"
    for required in ("stratac/dsl/strata.lark", "stratac/templates/kernel.cpp.j2",
                     "stratac/runtime/device/strata_device.h", "stratac/runtime/cpu/include/kernel_operator.h",
                     "stratac/examples/moe_prefill_bounded.strata"):   # stratac.Buffer's schedules
        assert required in names, required
    model = sorted(f"stratac/runtime/cpu/{d}/{f.name}" for d in ("src", "include")
                   for f in (ROOT / "runtime" / "cpu" / d).iterdir())
    assert [m for m in model if m not in names] == [], "CPU model sources missing from the wheel"
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
    probe = subprocess.run([sys.executable, "-c", "from stratac.host.moe import default_schedules; "
                            "print(default_schedules())"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip().startswith(str(site))
    # the shipped schedules are a library: `stratac:NAME`, and an import a file falls back on
    probe = subprocess.run([sys.executable, "-c", "from stratac.lang.modules import library_dir; "
                            "print(library_dir())"], cwd=work, env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip().startswith(str(site))
    (work / "composed.strata").write_text((ROOT / "examples" / "allreduce_hierarchical_composed.strata").read_text())
    for target in ("stratac:allreduce_ring", "composed.strata"):
        run = subprocess.run([sys.executable, "-m", "stratac", "check", target, "--world", "2"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0 and "verified" in run.stdout, (target, run.stdout, run.stderr)


@pytest.mark.slow
def test_installing_keeps_the_torch_already_there(tmp_path):
    """pyproject asks for a range of torch, not a pin: with a supported torch installed (the one this
    suite runs on), pip's plan for installing stratac with its dependencies leaves torch alone."""
    import torch
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "stratac" in planned                 # the report is the plan for this project
    assert "torch" not in planned, f"pip would replace torch {torch.__version__} with {planned['torch']}"


def test_torch_is_a_range_that_admits_every_torch_npu_line():
    """torch_npu releases pin their torch (2.1 ... 2.14 on the package index today): a user on any
    of those lines must be able to install stratac without replacing torch."""
    from packaging.requirements import Requirement
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req, = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    for version in ("2.1.0", "2.5.1", "2.9.1", "2.13.0", "2.14.1"):
        assert torch_req.specifier.contains(version), f"{torch_req} refuses torch {version}"
