"""The NPU target: toolchain discovery and the CMake build driver for a real Ascend NPU.

In: generated sources (stratac.codegen.Output) and a SoC. Out: the built kernels and launcher in
the cache (`build`), or a StrataError that names each missing piece of the toolchain.

Toolchain (`find_toolchain`): the CANN toolkit (ASCEND_HOME_PATH, else ASCEND_TOOLKIT_HOME; the
directory holding ascendc.cmake under one of ASCENDC_CMAKE_DIRS; its version from
<arch>-linux/ascend_toolkit_install.info or compiler/version.info), cmake (CMAKE, else PATH) and
SHMEM for Ascend (SHMEM_HOME = the prefix with include/shmem.h and lib/libshmem.so, else
SHMEM_HOME_PATH as SHMEM's own set_env.sh exports it, whose prefix is $SHMEM_HOME_PATH/shmem).
What is missing is named with the variable that points stratac at it; nothing is guessed silently.

Build (`build`): the generated CMakeLists.txt (CANN's ascendc_library) configured and built with
argument lists, never a shell, in a private directory under the cache; published with the same
lock, atomic rename and checksum as the CPU build (stratac.targets.cpu). The key adds the target,
the SoC, the CANN version and the SHMEM install to the generated sources and stratac's own digest.

The runtime that loads these kernels is stratac.host.npu_comm. torch_npu is imported lazily
(`import_torch_npu`), only for the NPU target. A machine with torch_npu installed but no CANN
breaks `import torch` itself, because torch auto-loads installed device backends through the
`torch.backends` entry point that torch_npu registers: set TORCH_DEVICE_BACKEND_AUTOLOAD=0 (read
by torch/__init__.py, `_is_device_backend_autoload_enabled`) to keep the CPU target usable there.
docs/npu.md has the whole story.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stratac import codegen
from stratac.diagnostics import Codes, Note, StrataError, error
from stratac.ir import passes
from stratac.resources import compiler_digest, resource_dir
from stratac.targets import cpu as _cache

# Where CANN keeps ascendc.cmake, in the order CANN's own samples search them.
ASCENDC_CMAKE_DIRS = ("tools/tikcpp/ascendc_kernel_cmake", "compiler/tikcpp/ascendc_kernel_cmake",
                      "ascendc_devkit/tikcpp/samples/cmake")
# Default install locations, only used to tell the user which set_env.sh to source.
DEFAULT_CANN_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann",
                      "~/Ascend/ascend-toolkit/latest")
CANN_ENV = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
SHMEM_ENV = ("SHMEM_HOME", "SHMEM_HOME_PATH")
CMAKE_ENV = "CMAKE"
CMAKE_MIN = (3, 16)                       # cmake_minimum_required of templates/CMakeLists.txt.j2
SHMEM_LIBS = ("libshmem.so", "libaclshmem.so")
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


# ---------------------------------------------------------------------------------------------
# Toolchain discovery

@dataclass(frozen=True)
class Missing:
    """One piece of the toolchain that is not there: what, and the next step."""

    what: str
    fix: str


@dataclass(frozen=True)
class Cann:
    home: Path
    cmake_dir: Path          # the directory of ascendc.cmake
    version: str             # "unknown" without a version file
    version_file: Path | None


@dataclass(frozen=True)
class CMake:
    path: str
    version: str


@dataclass(frozen=True)
class Shmem:
    home: Path               # the prefix: include/shmem.h, lib/libshmem.so
    library: Path


@dataclass(frozen=True)
class Toolchain:
    cann: Cann
    cmake: CMake
    shmem: Shmem

    def identity(self) -> dict:
        """What a cached NPU build depends on besides the sources."""
        return {"cann": str(self.cann.home), "cann_version": self.cann.version,
                "cmake": self.cmake.version, "shmem": str(self.shmem.home),
                "shmem_header": _file_id(self.shmem.home / "include" / "shmem.h"),
                "shmem_library": _file_id(self.shmem.library)}


def _file_id(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:absent"
    return f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}"


def _cann_version(home: Path) -> tuple[str, Path | None]:
    """CANN's documented version records: `version=` in <arch>-linux/ascend_toolkit_install.info
    (the file CANN's install guide tells users to read), else `Version=` in
    compiler/version.info."""
    infos = [home / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"]
    infos += [Path(p) for p in
              sorted(glob.glob(str(home / "*-linux" / "ascend_toolkit_install.info")))]
    records = [(p, "version") for p in infos] + [(home / "compiler" / "version.info", "Version")]
    for path, key in records:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        m = re.search(rf"^\s*{key}\s*=\s*(\S+)", text, re.M)
        if m:
            return m.group(1), path
    return "unknown", None


def _ascendc_cmake_dir(home: Path) -> Path | None:
    for d in ASCENDC_CMAKE_DIRS:
        if (home / d / "ascendc.cmake").is_file():
            return home / d
    return None


_CANN_FIX = ("install the CANN toolkit and run `source <CANN>/set_env.sh` (it exports "
             "ASCEND_HOME_PATH), or export ASCEND_HOME_PATH=<CANN install dir>")


def find_cann(env: Mapping[str, str] | None = None,
              default_roots: tuple[str, ...] | None = None) -> Cann | Missing:
    env = os.environ if env is None else env
    var = next((v for v in CANN_ENV if env.get(v)), None)
    if var is None:
        for root in DEFAULT_CANN_ROOTS if default_roots is None else default_roots:
            home = Path(os.path.expanduser(root))
            if _ascendc_cmake_dir(home) is not None:
                return Missing(f"CANN toolkit: ASCEND_HOME_PATH is not set (a CANN toolkit is "
                               f"installed at {home})",
                               f"run `source {home}/set_env.sh`, or export ASCEND_HOME_PATH={home}")
        return Missing("CANN toolkit: ASCEND_HOME_PATH is not set", _CANN_FIX)
    home = Path(env[var])
    if not home.is_dir():
        return Missing(f"CANN toolkit: {var}={home} does not exist", _CANN_FIX)
    cmake_dir = _ascendc_cmake_dir(home)
    if cmake_dir is None:
        return Missing(f"CANN toolkit: {var}={home} has no ascendc.cmake under "
                       f"{', '.join(ASCENDC_CMAKE_DIRS)}",
                       f"point {var} at the CANN toolkit install (the directory of its "
                       "set_env.sh, e.g. /usr/local/Ascend/ascend-toolkit/latest)")
    version, vfile = _cann_version(home)
    return Cann(home, cmake_dir, version, vfile)


_CMAKE_FIX = (f"install cmake >= {'.'.join(map(str, CMAKE_MIN))} (apt-get install cmake, or pip "
              "install cmake), or export CMAKE=<path to cmake>")


def find_cmake(env: Mapping[str, str] | None = None) -> CMake | Missing:
    env = os.environ if env is None else env
    name = env.get(CMAKE_ENV) or "cmake"
    path = shutil.which(name, path=env.get("PATH", os.defpath))
    if path is None:
        how = f"CMAKE={name} is not an executable" if env.get(CMAKE_ENV) else "not on PATH"
        return Missing(f"cmake: {how}", _CMAKE_FIX)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return Missing(f"cmake: {path} --version failed: {exc}", _CMAKE_FIX)
    m = re.search(r"version\s+(\d+)\.(\d+)(\S*)", out.stdout)
    if out.returncode != 0 or not m:
        return Missing(f"cmake: {path} --version did not print a version", _CMAKE_FIX)
    version = f"{m.group(1)}.{m.group(2)}{m.group(3)}"
    if (int(m.group(1)), int(m.group(2))) < CMAKE_MIN:
        return Missing(f"cmake: {path} is version {version}, older than "
                       f"{'.'.join(map(str, CMAKE_MIN))}", _CMAKE_FIX)
    return CMake(path, version)


_SHMEM_FIX = ("install SHMEM for Ascend (https://gitcode.com/cann/shmem) and run `source "
              "<install>/shmem/latest/set_env.sh` (it exports SHMEM_HOME_PATH), or export "
              "SHMEM_HOME=<prefix with include/shmem.h and lib/libshmem.so>")


def _shmem_library(prefix: Path) -> Path | None:
    for libdir in ("lib", "lib64"):
        for name in SHMEM_LIBS:
            if (prefix / libdir / name).is_file():
                return prefix / libdir / name
    return None


def find_shmem(env: Mapping[str, str] | None = None) -> Shmem | Missing:
    env = os.environ if env is None else env
    if env.get("SHMEM_HOME"):
        var, candidates = "SHMEM_HOME", [Path(env["SHMEM_HOME"])]
    elif env.get("SHMEM_HOME_PATH"):
        root = Path(env["SHMEM_HOME_PATH"])
        var, candidates = "SHMEM_HOME_PATH", [root / "shmem", root]
    else:
        return Missing("SHMEM for Ascend: neither SHMEM_HOME nor SHMEM_HOME_PATH is set",
                       _SHMEM_FIX)
    for prefix in candidates:
        if (prefix / "include" / "shmem.h").is_file():
            lib = _shmem_library(prefix)
            if lib is None:
                return Missing(f"SHMEM for Ascend: {prefix} has include/shmem.h but no "
                               f"lib/{SHMEM_LIBS[0]}", _SHMEM_FIX)
            return Shmem(prefix, lib)
    where = " or ".join(str(p / "include" / "shmem.h") for p in candidates)
    return Missing(f"SHMEM for Ascend: {var}={env[var]} has no {where}", _SHMEM_FIX)


def _probe(env: Mapping[str, str], default_roots: tuple[str, ...] | None) -> list:
    return [find_cann(env, default_roots), find_cmake(env), find_shmem(env)]


def find_toolchain(env: Mapping[str, str] | None = None,
                   default_roots: tuple[str, ...] | None = None) -> Toolchain:
    """Finds CANN, cmake and SHMEM for Ascend, or raises one StrataError naming every missing
    piece with the environment variable that points stratac at it."""
    found = _probe(os.environ if env is None else env, default_roots)
    missing = [f for f in found if isinstance(f, Missing)]
    if missing:
        raise StrataError(toolchain_error(missing))
    cann, cmake, shmem = found
    return Toolchain(cann, cmake, shmem)


def toolchain_error(missing: list[Missing], doing: str = "the npu target cannot build here"):
    """One diagnostic: every missing piece in the message, each next step in a note."""
    return error(Codes.TOOLCHAIN, f"{doing}: " + "; ".join(m.what for m in missing), None,
                 *(Note(f"{m.what.split(':')[0]}: {m.fix}") for m in missing))


# ---------------------------------------------------------------------------------------------
# torch_npu and the device, without importing torch_npu until the NPU target is really used

def torch_npu_installed() -> str | None:
    """torch_npu's version if it is installed (found without importing it), else None."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    from importlib import metadata
    try:
        return metadata.version("torch_npu")
    except metadata.PackageNotFoundError:
        return "unknown version"


def npu_devices() -> list[str]:
    """The Ascend device nodes of this machine (the driver creates /dev/davinciN)."""
    return sorted(glob.glob("/dev/davinci[0-9]*"))


TORCH_NPU_FIX = ("pip install torch_npu (the release built for your torch and CANN versions; "
                 "`pip install stratac[npu]`)")


def _run_problems(env: Mapping[str, str], default_roots: tuple[str, ...] | None,
                  ) -> tuple[list, list[Missing]]:
    found = _probe(env, default_roots)
    missing = [f for f in found if isinstance(f, Missing)]
    if torch_npu_installed() is None:
        missing.append(Missing("torch_npu: not installed", TORCH_NPU_FIX))
    if not npu_devices():
        missing.append(Missing("NPU: no Ascend device node (/dev/davinci*)",
                               "run on a machine with an Ascend NPU and its driver installed"))
    return found, missing


def npu_available(env: Mapping[str, str] | None = None,
                  default_roots: tuple[str, ...] | None = None) -> tuple[bool, str]:
    """Whether the NPU target can run here (without importing torch_npu), and why not."""
    _, missing = _run_problems(os.environ if env is None else env, default_roots)
    return (not missing), "; ".join(m.what for m in missing)


def require_npu(env: Mapping[str, str] | None = None,
                default_roots: tuple[str, ...] | None = None) -> Toolchain:
    """The preflight of every NPU runtime entry point (and of `stratac run --target npu`): the
    toolchain, torch_npu installed and an NPU present, or one StrataError naming all that is
    missing, each with its next step."""
    found, missing = _run_problems(os.environ if env is None else env, default_roots)
    if missing:
        raise StrataError(toolchain_error(missing, "the npu target cannot run here"))
    cann, cmake, shmem = found
    return Toolchain(cann, cmake, shmem)


def missing_toolchain_message(env: Mapping[str, str] | None = None) -> str:
    """One line for the CLI: what the npu target lacks here, each with its next step."""
    _, missing = _run_problems(os.environ if env is None else env, None)
    if not missing:
        return "the npu target is ready here (CANN, cmake, SHMEM for Ascend, torch_npu, an NPU)"
    d = toolchain_error(missing, "the npu target cannot run here")
    return d.message + "".join(f"\n  note: {n.message}" for n in d.notes)


def import_torch_npu():
    """Imports torch_npu, turning every way it can fail into a StrataError that says why."""
    if torch_npu_installed() is None:
        raise StrataError(error(Codes.TOOLCHAIN, "the npu target needs torch_npu, which is not "
                                "installed", None, Note(f"torch_npu: {TORCH_NPU_FIX}")))
    try:
        import torch_npu
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StrataError(error(Codes.TOOLCHAIN, f"torch_npu is installed but cannot be imported: "
                                f"{first}", None,
                                Note("torch_npu needs CANN's runtime libraries: run `source "
                                     "<CANN>/set_env.sh` first; its torch version must match "
                                     "the installed torch"))) from None
    return torch_npu


# ---------------------------------------------------------------------------------------------
# Build

def configure_command(tc: Toolchain, soc: str) -> list[str]:
    """`cmake -S . -B build` with everything the generated CMakeLists.txt takes from outside."""
    return [tc.cmake.path, "-S", ".", "-B", "build",
            f"-DSOC_VERSION={soc}",
            f"-DASCEND_CANN_PACKAGE_PATH={tc.cann.home}",
            f"-DSTRATA_DEVICE_DIR={resource_dir('runtime') / 'device'}",
            f"-DSHMEM_HOME={tc.shmem.home}",
            "-DCMAKE_BUILD_TYPE=Release",
            # the launcher finds the kernels library next to itself once both sit in the cache
            "-DCMAKE_BUILD_RPATH=$ORIGIN"]


def build_command(tc: Toolchain) -> list[str]:
    return [tc.cmake.path, "--build", "build", "--parallel", str(os.cpu_count() or 2)]


def _run_tool(cmd: list[str], cwd: Path, what: str, files: dict[str, str]) -> None:
    """Runs one build step (an argument list, no shell); tests replace this function."""
    _cache._run(cmd, cwd, what, files)


def kernels_library_name(schedule: str) -> str:
    return f"lib{schedule}_kernels.so"


def _kernels_valid(d: Path, schedule: str) -> bool:
    try:
        want = json.loads((d / "npu.json").read_text())["kernels_sha256"]
        return _cache._sha256(d / kernels_library_name(schedule)) == want
    except (OSError, ValueError, KeyError):
        return False


def build(output: codegen.Output, soc: str, *, env: Mapping[str, str] | None = None,
          toolchain: Toolchain | None = None) -> _cache.Built:
    """Builds the generated sources with CANN for `soc`, through the cache. Built.library is the
    launcher (lib<schedule>.so); the kernels (lib<schedule>_kernels.so) sit next to it."""
    if soc not in passes.SOCS:
        raise StrataError(error(Codes.BAD_ENGINE, f"unknown SoC {soc!r}; known: "
                                f"{', '.join(passes.SOCS)}"))
    s = output.schedule
    planned = s.kernel.soc if s.kernel is not None else soc
    if planned != soc:
        raise StrataError(error(Codes.BAD_ENGINE, f"{s.name} was compiled for {planned} "
                                f"({passes.SOCS[planned]} vector cores) but the build asks "
                                f"for {soc}: compile it with --soc {soc}"))
    tc = toolchain or find_toolchain(env)
    files_digest = hashlib.sha256(json.dumps(output.files, sort_keys=True).encode()).hexdigest()
    key_src = json.dumps({"files": files_digest, "stratac": compiler_digest(), "target": "npu",
                          "soc": soc, "toolchain": tc.identity()}, sort_keys=True)
    key = f"{s.name}-npu-" + hashlib.sha256(key_src.encode()).hexdigest()[:24]
    libname = f"lib{s.name}.so"
    kernels = kernels_library_name(s.name)

    def do_build(tmp: Path) -> None:
        for name, text in output.files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        configure = configure_command(tc, soc)
        _run_tool(configure, tmp, f"configuring {s.name} for {soc} (cmake)", output.files)
        _run_tool(build_command(tc), tmp, f"building {s.name} for {soc} with CANN", output.files)
        built = {p.name: p for p in sorted((tmp / "build").rglob("*.so"), reverse=True)}
        for want in (libname, kernels):
            if want not in built:
                found = ", ".join(sorted(built)) or "no shared library"
                raise StrataError(error(Codes.BUILD, f"the CANN build of {s.name} produced no "
                                        f"{want} (found: {found})"))
            shutil.copy2(built[want], tmp / want)
        (tmp / "npu.json").write_text(json.dumps({
            "soc": soc, "toolchain": tc.identity(), "configure": configure,
            "kernels": kernels, "kernels_sha256": _cache._sha256(tmp / kernels)}, indent=2))
        shutil.rmtree(tmp / "build", ignore_errors=True)

    root = _cache.cache_root()
    d, cached = _cache._publish(root, key, libname, do_build)
    if not _kernels_valid(d, s.name):
        # the launcher is intact but its kernels library is not: rebuild the entry
        with _cache.CacheLock(root / f"{key}.lock"):
            if not _kernels_valid(d, s.name):
                shutil.rmtree(d, ignore_errors=True)
        d, cached = _cache._publish(root, key, libname, do_build)
    manifest = json.loads((d / "manifest.json").read_text())
    return _cache.Built(d / libname, manifest, d, cached, d.name)
