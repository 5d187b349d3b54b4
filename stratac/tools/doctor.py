"""`stratac doctor`: what this machine has, which targets can build and run here, and for every
missing piece the next step.

collect() gathers the rows (it never imports torch or torch_npu: versions come from package
metadata, so a broken torch_npu cannot break the report), render() makes the table and
exit_status() is 0 exactly when the cpu target works. report() is the one call the CLI needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Mapping

from stratac.diagnostics import StrataError
from stratac.targets import npu

OK, WARN, MISSING, FAIL = "ok", "warn", "missing", "FAIL"
CPU_ROW, NPU_ROW = "target cpu", "target npu"


@dataclass(frozen=True)
class Row:
    item: str
    status: str          # ok | warn | missing (optional piece) | FAIL (a target that cannot work)
    detail: str
    next_step: str = ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _python() -> Row:
    v = sys.version_info
    text = f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"
    if v < (3, 10):
        return Row("Python", FAIL, text, "stratac needs Python >= 3.10")
    return Row("Python", OK, text)


def _torch() -> Row:
    v = _version("torch")
    if v is None:
        return Row("torch", MISSING, "not installed",
                   "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu "
                   "(the CPU wheel; `pip install stratac` pulls it)")
    return Row("torch", OK, v)


def autoload_breaks_torch(torch_npu_version: str | None, cann_found: bool,
                          env: Mapping[str, str]) -> bool:
    """torch auto-loads an installed torch_npu on `import torch` (torch_npu registers a
    `torch.backends` entry point); without CANN that import fails, unless autoloading is off."""
    return (torch_npu_version is not None and not cann_found
            and env.get(npu.AUTOLOAD_ENV, "1") == "1")


def _torch_npu(cann_found: bool, env: Mapping[str, str]) -> tuple[Row, str | None]:
    v = npu.torch_npu_installed()
    if v is None:
        return Row("torch_npu", MISSING, "not installed (only the npu target needs it)",
                   f"for the npu target: {npu.TORCH_NPU_FIX}"), None
    if autoload_breaks_torch(v, cann_found, env):
        return Row("torch_npu", WARN, f"{v}, installed without CANN: `import torch` will try to "
                   "load it and fail",
                   f"export {npu.AUTOLOAD_ENV}=0 (keeps the cpu target working), or install CANN "
                   "and source its set_env.sh"), v
    return Row("torch_npu", OK, v), v


def _cxx(env: Mapping[str, str]) -> tuple[Row, bool]:
    name = env.get("CXX", "g++")
    label = "C++ compiler"
    path = shutil.which(name, path=env.get("PATH", os.defpath))
    if path is None:
        return Row(label, MISSING, f"{'CXX=' if 'CXX' in env else ''}{name}: not found",
                   "install g++: apt-get install g++ (or set CXX to a C++17 compiler)"), False
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        first = out.stdout.splitlines()[0] if out.stdout else "unknown version"
    except (OSError, subprocess.SubprocessError) as exc:
        return Row(label, FAIL, f"{path} --version failed: {exc}",
                   "reinstall it: apt-get install --reinstall g++"), False
    return Row(label, OK, f"{first} ({path})"), True


def _piece(item: str, found, ok_text) -> Row:
    if isinstance(found, npu.Missing):
        return Row(item, MISSING, found.what.split(": ", 1)[-1], f"for the npu target: {found.fix}")
    return Row(item, OK, ok_text(found))


def _cache_row() -> Row:
    from stratac.targets import cpu as build
    try:
        root = build.cache_root()
    except OSError as exc:
        return Row("cache", FAIL, f"cannot create the cache directory: {exc}",
                   "export STRATAC_CACHE_DIR=<a writable directory>")
    size = entries = 0
    for p in root.rglob("*"):
        try:
            if p.is_file():
                size += p.stat().st_size
            elif p.parent == root:
                entries += 1
        except OSError:
            continue
    return Row("cache", OK, f"{root} ({entries} entries, {size / 1e6:.1f} MB; "
               "STRATAC_CACHE_DIR moves it, deleting it clears it)")


def _cpu_target(cxx_ok: bool, torch_row: Row) -> Row:
    if not cxx_ok:
        return Row(CPU_ROW, FAIL, "cannot build: no C++ compiler",
                   "install g++: apt-get install g++ (or set CXX to a C++17 compiler)")
    from stratac.targets import cpu as build
    try:
        lib = build.runtime_library()
    except StrataError as exc:
        d = exc.diagnostics[0]
        return Row(CPU_ROW, FAIL, "cannot build the CPU model: " + d.message.splitlines()[0],
                   "install g++: apt-get install g++ (or set CXX to a C++17 compiler); "
                   "the full error: " + " ".join(d.message.split())[:300])
    if torch_row.status != OK:
        return Row(CPU_ROW, FAIL, f"builds ({lib.name}) but cannot run without torch",
                   torch_row.next_step)
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        return Row(CPU_ROW, FAIL, "builds but cannot run: /dev/shm is missing or not writable",
                   "mount a writable tmpfs at /dev/shm (docker: --shm-size=1g)")
    return Row(CPU_ROW, OK, f"builds and runs (the CPU model built: {lib})")


def _npu_target(found: list, torch_npu_version: str | None, env: Mapping[str, str]) -> Row:
    missing = [f for f in found if isinstance(f, npu.Missing)]
    if missing:
        names = ", ".join(m.what.split(":")[0] for m in missing)
        return Row(NPU_ROW, FAIL, f"cannot build: missing {names}",
                   "install what the rows above mark missing (CANN, cmake, SHMEM), each as its "
                   "next step says")
    why, steps = [], []
    if torch_npu_version is None:
        why.append("torch_npu is not installed")
        steps.append(npu.TORCH_NPU_FIX)
    else:
        err = _import_in_subprocess("torch_npu", env)
        if err:
            why.append(f"torch_npu does not import: {err}")
            steps.append("source CANN's and SHMEM's set_env.sh; match torch_npu to torch and CANN")
    if not npu.npu_devices():
        why.append("no Ascend device (/dev/davinci*)")
        steps.append("run on a machine with an Ascend NPU and its driver")
    if why:
        return Row(NPU_ROW, FAIL, "builds, cannot run: " + "; ".join(why), "; ".join(steps))
    return Row(NPU_ROW, OK, "builds and runs")


def _import_in_subprocess(module: str, env: Mapping[str, str]) -> str:
    """'' if `import module` works in a fresh interpreter, else its last error line (a child
    process, so a crashing import cannot take the report down)."""
    try:
        p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           text=True, timeout=120, env=dict(env))
    except subprocess.TimeoutExpired:
        return "timed out after 120 s"
    if p.returncode == 0:
        return ""
    lines = p.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {p.returncode}"


def collect(env: Mapping[str, str] | None = None) -> list[Row]:
    """Every row of the report, in order. Builds the CPU model once (cached) to prove the cpu
    target; never imports torch or torch_npu into this process. `env` (default os.environ) is
    where the tools are looked up; the CPU-model build itself, like every build, reads
    os.environ (CXX, STRATAC_CACHE_DIR)."""
    env = os.environ if env is None else env
    found = npu._probe(env, None)
    cann, cmake, shmem = found
    rows = [_python()]
    torch_row = _torch()
    rows.append(torch_row)
    tnpu_row, tnpu_version = _torch_npu(not isinstance(cann, npu.Missing), env)
    rows.append(tnpu_row)
    cxx_row, cxx_ok = _cxx(env)
    rows.append(cxx_row)
    rows.append(_piece("cmake", cmake, lambda c: f"{c.version} ({c.path})"))
    rows.append(_piece("CANN", cann, lambda c: f"{c.version} ({c.home})"))
    rows.append(_piece("SHMEM", shmem, lambda s: f"{s.home} ({s.library.name})"))
    rows.append(_cache_row())
    rows.append(_cpu_target(cxx_ok, torch_row))
    rows.append(_npu_target(found, tnpu_version, env))
    return rows


def render(rows: list[Row]) -> str:
    """A table: item, status, details, and under every row that is not ok its next step."""
    w_item = max(len("item"), *(len(r.item) for r in rows))
    w_status = max(len("status"), *(len(r.status) for r in rows))
    pad = " " * (w_item + w_status + 4)
    out = ["stratac doctor: what this machine can build and run", "",
           f"{'item':<{w_item}}  {'status':<{w_status}}  details",
           f"{'-' * w_item}  {'-' * w_status}  {'-' * 7}"]
    for r in rows:
        out.append(f"{r.item:<{w_item}}  {r.status:<{w_status}}  {r.detail}")
        if r.next_step and r.status != OK:
            out.append(f"{pad}next: {r.next_step}")
    out.append("")
    code = exit_status(rows)
    out.append("exit status 0: the cpu target works here" if code == 0 else
               f"exit status {code}: the cpu target does not work here (see its next step)")
    return "\n".join(out)


def exit_status(rows: list[Row]) -> int:
    """0 when the cpu target builds and runs here, else 1."""
    cpu = next((r for r in rows if r.item == CPU_ROW), None)
    return 0 if cpu is not None and cpu.status == OK else 1


def report(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """What `stratac doctor` prints and its exit status."""
    rows = collect(env)
    return render(rows), exit_status(rows)
