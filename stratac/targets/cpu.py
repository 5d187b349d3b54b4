"""Build generated kernels and cache the result.

CPU target: g++ compiles kernel.cpp + launch.cpp against runtime/cpu (the CPU model) into a shared
library linked with the model's own library (libstratacpu.so, built once per runtime version).
NPU target: the generated CMakeLists.txt with CANN's ascendc_library (stratac.targets.npu).

Cache entries live under $STRATAC_CACHE_DIR (default ~/.cache/stratac). A kernel's key covers
what goes into g++ and nothing else: kernel.cpp and launch.cpp, the runtime's sources and headers
(runtime/, which libstratacpu is also keyed by), this module (the recipe: the commands and their
flags) and the compiler's identity. Outputs with the same sources share one library: the manifest
(launch defaults such as cores, the proven worlds) is the Output's own, never read from the entry,
and a change to stratac's Python that leaves the generated sources alone keeps the entries. A
library holds every entry point of kernel.cpp (build_cpu(out)) or a set of them (build_cpu(out,
names): what a job's warm-up builds for its element types and ops, and what a call builds, through
OnDemand, when it first launches one), keyed apart; entry.json says which. An
entry is built in a private temporary directory and published with one rename, under a file lock,
so concurrent builds of the same schedule share one result. entry.json records the sha256 of every
file of the entry (the library and its sources); an entry whose files do not match it (truncated,
corrupted, replaced), or that is not this user's own (directory or files owned by someone else, or
writable by group or others) is never loaded: it is moved aside and rebuilt.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stratac.codegen import Output
from stratac.diagnostics import Codes, Note, StrataError, check_source_name, error
from stratac.resources import resource_dir, tree_digest

CXX_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-pthread"]


def cache_root() -> Path:
    env = os.environ.get("STRATAC_CACHE_DIR")
    root = Path(env) if env else Path.home() / ".cache" / "stratac"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _cxx() -> str:
    cxx = os.environ.get("CXX", "g++")
    path = shutil.which(cxx)
    if path is None:
        raise StrataError(error(Codes.TOOLCHAIN, f"C++ compiler {cxx!r} not found: the CPU target "
                                "builds kernels with g++ (install it: apt-get install g++, or set CXX)"))
    return path


@functools.lru_cache(maxsize=8)
def _toolchain_id(cxx: str) -> str:
    """The compiler's identity without running it (so a cache hit costs no compiler process):
    its resolved path, size and modification time."""
    real = os.path.realpath(cxx)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path, what: str, generated: dict[str, str] | None = None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise StrataError(error(Codes.BUILD, f"{what}: the compiler ran for over 600 s")) from None
    if proc.returncode != 0:
        notes = _strata_notes(proc.stderr, generated or {})
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise StrataError(error(Codes.BUILD, f"{what} failed (exit {proc.returncode}):\n"
                                f"  command: {' '.join(cmd)}\n{tail}", None, *notes))


def _strata_notes(stderr: str, generated: dict[str, str]) -> list[Note]:
    """Maps `kernel.cpp:LINE:` compiler errors back to the nearest `// strata:N` marker above."""
    notes = []
    for m in re.finditer(r"^(kernel\.cpp|launch\.cpp):(\d+):", stderr, re.M):
        lines = generated.get(m.group(1), "").splitlines()[: int(m.group(2))]
        for text in reversed(lines):
            marker = re.search(r"// strata:(\d+)", text)
            if marker:
                notes.append(Note(f"{m.group(1)}:{m.group(2)} comes from .strata line {marker.group(1)}"))
                break
        if len(notes) >= 3:
            break
    return notes


@dataclass(frozen=True)
class Built:
    """A built library. identity: the key of the sources it was built from, the same whichever of
    their entry points were compiled (the ranks' agreement compares it); entries: the entry points
    (kernel names) the library holds, None when it holds all of them."""
    library: Path
    manifest: dict
    directory: Path
    cached: bool
    identity: str
    entries: frozenset[str] | None = None

    def library_for(self, kernel: str) -> Path:
        """The library that holds the entry point `kernel` (this one)."""
        if self.entries is not None and kernel not in self.entries:
            raise StrataError(error(Codes.BUILD, f"{self.library} holds {', '.join(sorted(self.entries))}, "
                                    f"not {kernel}"))
        return self.library


class CacheLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "a+")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def owned_privately(path: Path, directory: bool) -> bool:
    """path is a real file or directory (no symlink) of this user, not writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    return kind and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _entry_files(d: Path) -> dict[str, str]:
    """sha256 of every regular file under d except entry.json, by relative path."""
    return {str(f.relative_to(d)): _sha256(f) for f in sorted(d.rglob("*"))
            if f.is_file() and not f.is_symlink() and f.name != "entry.json"}


def _entry_valid(d: Path, libname: str) -> bool:
    """The entry is complete, intact and this user's own: every file entry.json lists (the library
    among them) has its recorded sha256; nothing belongs to or is writable by anyone else."""
    meta = d / "entry.json"
    if not (owned_privately(d, True) and owned_privately(meta, False)):
        return False
    try:
        files = json.loads(meta.read_text())["files"]
        if not isinstance(files, dict) or libname not in files:
            return False
        for name, want in files.items():
            f = d / name
            if ".." in Path(name).parts or not owned_privately(f, False) or _sha256(f) != want:
                return False
    except (ValueError, KeyError, TypeError, OSError):
        return False
    return True


def _publish(root: Path, key: str, libname: str, build, meta: dict | None = None) -> tuple[Path, bool]:
    """Returns the entry directory for key, building it with build(tmpdir) if missing or invalid;
    meta: more fields for its entry.json (what the entry holds)."""
    final = root / key
    if _entry_valid(final, libname):
        return final, True
    with CacheLock(root / f"{key}.lock"):
        if _entry_valid(final, libname):
            return final, True
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp.", dir=root))
        try:
            build(tmp)
            files = _entry_files(tmp)
            (tmp / "entry.json").write_text(json.dumps({"sha256": files[libname], "files": files,
                                                        **(meta or {})}, indent=1))
            if final.exists() or final.is_symlink():
                # an invalid entry (corrupt, foreign, tampered): moved aside under the lock, so that
                # even one we cannot delete is never looked at again
                stale = root / f"{key}.stale.{secrets.token_hex(6)}"
                os.rename(final, stale)
                if stale.is_symlink() or not stale.is_dir():
                    stale.unlink()
                else:
                    shutil.rmtree(stale, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final, False


@functools.lru_cache(maxsize=1)
def recipe_digest() -> str:
    """What a CPU build depends on besides its own sources: runtime/ (the model's sources, the
    device library's headers) and this module (the commands and their flags)."""
    h = hashlib.sha256(tree_digest(resource_dir("runtime")).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


COMPILED = ("kernel.cpp", "launch.cpp")   # the generated files g++ compiles (the rest is data)


def runtime_sources(rt: Path) -> list[Path]:
    """The CPU model's translation units, runtime/cpu/src/*.cpp, sorted by name."""
    return sorted((rt / "cpu" / "src").glob("*.cpp"), key=lambda f: f.name)


def runtime_library() -> Path:
    """libstratacpu.so, the CPU model, built once per runtime version and compiler."""
    cxx = _cxx()
    rt = resource_dir("runtime")
    # one file per concept (runtime/cpu/src/*.cpp, sharing model_internal.h), compiled as one
    # translation unit that includes them in sorted order: the headers are parsed once (4.4 s of
    # CPU, against 12.9 s for one compile per file), and the order of their static constructors and
    # destructors is the order of inclusion (workers.cpp last); recipe_digest covers every .cpp
    # and .h of runtime/, the key their names
    sources = runtime_sources(rt)
    key_src = json.dumps({"runtime": recipe_digest(), "cxx": _toolchain_id(cxx), "flags": CXX_FLAGS,
                          "sources": [s.name for s in sources], "unity": 1})
    key = "runtime-" + hashlib.sha256(key_src.encode()).hexdigest()[:24]

    def build(tmp: Path) -> None:
        what = "building the CPU model (libstratacpu.so)"
        unity = tmp / "model.cpp"
        unity.write_text("".join(f'#include "{src}"\n' for src in sources), encoding="utf-8")
        _run([cxx, *CXX_FLAGS, "-shared", str(unity), f"-I{rt / 'cpu' / 'include'}",
              "-o", str(tmp / "libstratacpu.so"), "-lrt"], tmp, what)
        unity.unlink()

    d, _ = _publish(cache_root(), key, "libstratacpu.so", build)
    return d / "libstratacpu.so"


def _source_key(out: Output, cxx: str, rtlib: Path) -> str:
    """NAME-HASH of what g++ compiles for `out`: its sources, the recipe, the compiler, the model."""
    sources = {name: out.files[name] for name in COMPILED}
    files_digest = hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()
    key_src = json.dumps({"files": files_digest, "recipe": recipe_digest(),
                          "cxx": _toolchain_id(cxx), "flags": CXX_FLAGS, "target": "cpu",
                          "runtime": rtlib.parent.name})
    return f"{out.schedule.name}-" + hashlib.sha256(key_src.encode()).hexdigest()[:24]


def _entry_key(name: str, identity: str, entries) -> str:
    """The cache key of the library of `entries` (None: all) of the sources `identity` names."""
    if entries is None:
        return identity
    return f"{name}-" + hashlib.sha256(f"{identity}\0{','.join(sorted(entries))}".encode()).hexdigest()[:24]


def kernel_names(out: Output) -> list[str]:
    """The entry points of out's kernel.cpp (one per element type and reduction), from its manifest."""
    return [k["name"] for k in json.loads(out.files["manifest.json"])["kernels"]]


def build_cpu(out: Output, entries=None) -> Built:
    """Builds out's kernel.cpp and launch.cpp against the CPU model: every entry point, or only
    those named in `entries` (kernel names), compiled with -DSTRATA_ENTRIES and one
    -DSTRATA_ENTRY_<name> each (the templates' guards) and cached under a key of its own. The
    kernel class is instantiated per element type and reduction, so the entries a job launches
    cost a fraction of the build of all twelve of an AllReduce (docs/bench.md, "The suite's builds:
    entry points as calls need them")."""
    check_source_name(out.schedule.source_name)
    cxx = _cxx()
    rt = resource_dir("runtime")
    rtlib = runtime_library()
    identity = _source_key(out, cxx, rtlib)
    names = kernel_names(out)
    chosen = None if entries is None else frozenset(entries)
    if chosen is not None and (not chosen or chosen - set(names)):
        raise StrataError(error(Codes.BUILD, f"{out.schedule.name} has no entry point "
                                f"{', '.join(sorted(chosen - set(names))) or '(none named)'}: it has "
                                f"{', '.join(names)}"))
    if chosen is not None and chosen == set(names):
        chosen = None
    key = _entry_key(out.schedule.name, identity, chosen)
    macros = [] if chosen is None else ["-DSTRATA_ENTRIES", *(f"-DSTRATA_ENTRY_{k}" for k in sorted(chosen))]
    libname = f"lib{out.schedule.name}.so"

    def build(tmp: Path) -> None:
        for name in COMPILED:
            (tmp / name).write_text(out.files[name], encoding="utf-8")
        _run([cxx, *CXX_FLAGS, "-shared", "-DSTRATA_CPU_MODEL", *macros,
              f"-I{rt / 'cpu' / 'include'}", f"-I{rt / 'device'}",
              "kernel.cpp", "launch.cpp", "-o", libname,
              f"-L{rtlib.parent}", "-lstratacpu", f"-Wl,-rpath,{rtlib.parent}"],
             tmp, f"building {out.schedule.name} for the CPU model", out.files)

    d, cached = _publish(cache_root(), key, libname, build,
                         {"identity": identity, "entries": None if chosen is None else sorted(chosen)})
    return Built(d / libname, json.loads(out.files["manifest.json"]), d, cached, identity, chosen)


class OnDemand:
    """A CPU build whose entry points are built when a call first needs one (what comm.load gives
    a Schedule). library_for(kernel) is a library of these sources that holds the kernel if the
    cache has one (every entry point's, or the set a job's warm-up built: build_all), else a
    library of that entry point alone, or of all of them once the schedule has needed two (a
    program that calls several element types or ops pays about one build of all, not one per
    entry; every rank that makes the same calls asks for the same library). Nothing is compiled at
    load but the model; a missing compiler is said there."""

    def __init__(self, out: Output):
        check_source_name(out.schedule.source_name)
        self.out = out
        self.manifest = json.loads(out.files["manifest.json"])
        self.identity = _source_key(out, _cxx(), runtime_library())
        self.libname = f"lib{out.schedule.name}.so"
        self._needed: set[str] = set()

    def _held(self, d: Path, kernel: str) -> bool:
        """d is an intact entry of this user's (checked before its entry.json is read) whose key is
        that of a library of these sources holding kernel: a directory of another name (a
        temporary or stale one, a copy) or an entry.json that says anything else is passed over."""
        if not (owned_privately(d, True) and owned_privately(d / "entry.json", False)):
            return False
        try:
            meta = json.loads((d / "entry.json").read_text())
        except (OSError, ValueError):
            return False
        held = meta.get("entries") if isinstance(meta, dict) else 0
        if held is not None and not (isinstance(held, list) and held and all(isinstance(k, str) for k in held)):
            return False
        return (meta.get("identity") == self.identity and (held is None or kernel in held)
                and d.name == _entry_key(self.out.schedule.name, self.identity, held)
                and _entry_valid(d, self.libname))

    def library_for(self, kernel: str) -> Path:
        self._needed.add(kernel)
        root = cache_root()
        # the build of every entry point first (its key is the identity), then the sets
        for d in [root / self.identity, *sorted(root.glob(f"{self.out.schedule.name}-*"))]:
            if self._held(d, kernel):
                return d / self.libname
        built = build_cpu(self.out, [kernel] if len(self._needed) == 1 else None)
        if built.identity != self.identity:
            raise StrataError(error(Codes.BUILD, f"{self.out.schedule.name}: the compiler or the CPU model "
                                    "changed since the schedule was loaded (its sources build to another "
                                    "library now): load it again"))
        return built.library


def entries_for(out: Output, uses) -> list[str] | None:
    """The entry points of out that calls with `uses`, (dtype, op) pairs by their short names
    ("f32", "sum"; the op is ignored for a schedule without a redop), launch; None (all of them)
    when uses is None or names a dtype out has no entry for (a fixed type, such as an int8
    dispatch's, whatever the run's dtype)."""
    if not uses:
        return None
    kernels = json.loads(out.files["manifest.json"])["kernels"]
    names = []
    for dtype, op in uses:
        match = [k["name"] for k in kernels if k["dtype"] == dtype and (k["op"] is None or k["op"] == op)]
        if not match:
            return None
        names += match
    return sorted(set(names))


def build_all(outputs: list[Output], uses=None) -> list[Built]:
    """build_cpu of every output, in order, with one g++ per CPU at a time (a build is a compiler
    process, so threads suffice; the cache's lock is per entry). uses: per output, the (dtype, op)
    pairs its calls will launch, one library of those entry points (entries_for; the ranks'
    OnDemand then finds it); None (for all outputs or one) for every entry point. The first error
    in the outputs' order is raised, after every build has ended."""
    per = uses if uses is not None else [None] * len(outputs)
    if len(per) != len(outputs):
        raise ValueError(f"build_all: {len(per)} uses for {len(outputs)} outputs")
    jobs = [(o, entries_for(o, u)) for o, u in zip(outputs, per)]
    if len(jobs) < 2:
        return [build_cpu(*j) for j in jobs]
    runtime_library()   # once, before the threads want it
    with concurrent.futures.ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(build_cpu, *j) for j in jobs]
    return [f.result() for f in futures]
