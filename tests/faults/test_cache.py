"""The build cache never loads what it did not build: a truncated or corrupt library or manifest,
a tampered, foreign-owned or group-writable entry is moved aside and rebuilt; concurrent builds of
one schedule on an empty cache all succeed and share one entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from faultkit import ROOT

from stratac.targets import cpu as build

LIB = "libfake.so"


class Fake:
    """A stand-in for the compiler: writes a 'library' and a manifest, counts the builds."""

    def __init__(self):
        self.builds = 0

    def __call__(self, tmp: Path) -> None:
        self.builds += 1
        (tmp / LIB).write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
        (tmp / "manifest.json").write_text(json.dumps({"schedule": "fake", "launcher": "strata_launch_fake"}))
        (tmp / "kernel.cpp").write_text("// kernel\n")


@pytest.fixture
def entry(tmp_path):
    """(root, key, fake, publish): publish() -> (directory, cached) through build._publish."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    fake = Fake()
    key = "fake-0123456789abcdef01234567"

    def publish():
        return build._publish(root, key, LIB, fake)

    d, cached = publish()
    assert not cached and fake.builds == 1
    assert publish() == (d, True) and fake.builds == 1
    meta = json.loads((d / "entry.json").read_text())
    assert set(meta["files"]) == {LIB, "manifest.json", "kernel.cpp"}
    return root, d, fake, publish


def _truncate(d):
    with open(d / LIB, "r+b") as f:
        f.truncate(100)


def _flip_manifest(d):
    text = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(text.replace("fake", "fakf", 1))


def _drop_manifest(d):
    (d / "manifest.json").unlink()


def _garbage_entry_json(d):
    (d / "entry.json").write_text("{not json")


def _old_format_entry_json(d):
    # the library's checksum only (entries of earlier versions): the manifest is unprotected
    (d / "entry.json").write_text(json.dumps({"sha256": build._sha256(d / LIB)}))


def _replace_library(d):
    # another library, and its checksum forged into entry.json's top-level field only
    (d / LIB).write_bytes(b"\x7fELF something else entirely")
    meta = json.loads((d / "entry.json").read_text())
    meta["sha256"] = build._sha256(d / LIB)
    (d / "entry.json").write_text(json.dumps(meta))


def _foreign_directory(d):
    os.chown(d, 4242, 4242)


def _foreign_library(d):
    os.chown(d / LIB, 4242, 4242)


def _group_writable(d):
    os.chmod(d, 0o770)


def _world_writable_manifest(d):
    os.chmod(d / "manifest.json", 0o666)


def _path_escape(d):
    meta = json.loads((d / "entry.json").read_text())
    meta["files"]["../outside"] = "0" * 64
    (d / "entry.json").write_text(json.dumps(meta))


def _symlinked_entry(d):
    elsewhere = d.parent / "elsewhere"
    os.rename(d, elsewhere)
    os.symlink(elsewhere, d)


DAMAGE = [_truncate, _flip_manifest, _drop_manifest, _garbage_entry_json, _old_format_entry_json,
          _replace_library, _foreign_directory, _foreign_library, _group_writable,
          _world_writable_manifest, _path_escape, _symlinked_entry]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_or_foreign_entry_is_rebuilt_not_loaded(entry, damage):
    root, d, fake, publish = entry
    if damage in (_foreign_directory, _foreign_library) and os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    damage(d)
    assert not build._entry_valid(d, LIB)
    d2, cached = publish()
    assert d2 == d and not cached and fake.builds == 2
    assert build._entry_valid(d, LIB)
    assert d.is_dir() and not d.is_symlink() and os.stat(d).st_uid == os.geteuid()
    assert (d / LIB).stat().st_size > 100 and json.loads((d / "manifest.json").read_text())["schedule"] == "fake"
    assert publish() == (d, True) and fake.builds == 2
    # the bad entry was moved aside and removed: only the entry, its lock and what the damage made
    assert sorted(p.name for p in root.iterdir() if "stale" in p.name or ".tmp." in p.name) == []


BUILDER = textwrap.dedent("""
    import json, sys
    from stratac import codegen
    from stratac.ir import passes
    from stratac.lang import frontend
    from stratac.targets import cpu as build
    s = frontend.schedules(frontend.load_source(sys.argv[1]))[0]
    out = codegen.generate(passes.pipeline(s, passes.Options(cores=2)))
    b = build.build_cpu(out)
    print(json.dumps({"library": str(b.library), "cached": b.cached, "sha": build._sha256(b.library)}))
""")


def test_concurrent_builds_share_one_entry_and_a_truncated_library_is_rebuilt(tmp_path):
    """Three processes build the same schedule at once on an empty cache (the CPU model library
    too): all succeed with the same library, exactly one built it, no temporary directory is left.
    Then the library is truncated: the next build notices, rebuilds, and the result loads."""
    cache = tmp_path / "cache"
    env = dict(os.environ, STRATAC_CACHE_DIR=str(cache))
    src = ROOT / "examples" / "allgather_push.strata"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(src)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert len({r["library"] for r in results}) == 1
    assert len({r["sha"] for r in results}) == 1
    assert sorted(r["cached"] for r in results) == [False, True, True]
    entries = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert len(entries) == 2 and entries[0].startswith("allgather_push-") and entries[1].startswith("runtime-")
    assert [p.name for p in cache.iterdir() if ".tmp." in p.name or ".stale." in p.name] == []
    assert (cache.stat().st_mode & 0o777) == 0o700
    lib = Path(results[0]["library"])
    with open(lib, "r+b") as f:
        f.truncate(lib.stat().st_size // 2)
    p = subprocess.run([sys.executable, "-c", BUILDER, str(src)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    again = json.loads(p.stdout)
    assert again["cached"] is False and again["sha"] == results[0]["sha"]   # the build is reproducible
    import cffi
    cffi.FFI().dlopen(str(lib))   # a whole library again


def test_builds_of_several_schedules_keep_their_order_and_the_first_error(tmp_path, monkeypatch):
    """build_all builds in threads, returns each output's entry in the outputs' order, and raises
    the error of the first output (in that order) that does not compile, after the others ended."""
    from stratac import codegen
    from stratac.diagnostics import StrataError
    from stratac.ir import passes
    from stratac.lang import frontend
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    outs = [codegen.generate(passes.pipeline(s, passes.Options(cores=2)))
            for f in ("allgather_push.strata", "allreduce_ring.strata", "broadcast_tree.strata")
            for s in frontend.schedules(frontend.load_source(str(ROOT / "examples" / f)))[:1]]
    built = build.build_all(outs)
    assert [b.manifest["schedule"] for b in built] == [o.schedule.name for o in outs]
    assert all(not b.cached for b in built)
    assert [b.library for b in build.build_all(outs)] == [b.library for b in built]

    def broken(o):
        return codegen.Output(o.schedule, {**o.files, "kernel.cpp": o.files["kernel.cpp"] + "\n#error broken here\n"})
    bad = [outs[0], broken(outs[1]), broken(outs[2])]
    with pytest.raises(StrataError) as exc:
        build.build_all(bad)
    assert f"building {outs[1].schedule.name} for the CPU model" in exc.value.diagnostics[0].message


def test_a_call_builds_the_entry_point_it_launches_and_a_job_the_entry_points_of_its_cases(tmp_path, monkeypatch):
    """comm.load compiles no kernel on the CPU build. A call builds the entry point of its element
    type and reduction alone, in a library whose launcher refuses any other (-2) and that holds no
    other kernel; the second entry point a schedule needs builds them all, and that library then
    serves every call. A job's warm-up (build_all with the cases' element types and ops) builds
    one library of exactly those. All carry the identity of the same sources, which the ranks'
    agreement compares."""
    import shutil

    import cffi
    import torch

    from stratac import codegen
    from stratac.codegen import abi
    from stratac.host import comm as C
    from stratac.ir import passes
    from stratac.lang import frontend
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    model = build.runtime_library().parent            # the model's entry, as the default cache has it
    shutil.copytree(model, cache / model.name)
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(cache))
    src = ROOT / "examples" / "allreduce_ring.strata"

    def libraries() -> dict[str, list | None]:
        """entry directory -> the entry points its library holds (None: all), of the entries whose
        entry.json is a regular file holding an object (the planted ones below are not)"""
        metas = {p.name: p / "entry.json" for p in cache.iterdir() if p.name.startswith("allreduce_ring-")}
        metas = {k: json.loads(f.read_text()) for k, f in metas.items() if f.is_file()}
        return {k: m["entries"] for k, m in metas.items() if isinstance(m, dict)}

    [s] = frontend.schedules(frontend.load_source(str(src)))
    out = codegen.generate(passes.pipeline(s, passes.Options()))
    comm = C.Communicator(0, 1, segment=C._segment_name(), create=True, heap_bytes=4 << 20, timeout=10)
    C.unlink_segment(comm.segment)
    try:
        mod = comm.load(src)
        assert libraries() == {}
        x = comm.empty(100, dtype=torch.float32)
        x.copy_(torch.arange(100, dtype=torch.float32))
        mod.allreduce_ring(x, op="sum")
        assert torch.equal(x, torch.arange(100, dtype=torch.float32))    # world 1: the sum is x
        assert list(libraries().values()) == [["allreduce_ring_f32_sum"]]
        y = comm.empty(64, dtype=torch.bfloat16)
        y.copy_(torch.arange(64, dtype=torch.bfloat16))
        mod.allreduce_ring(y, op="max")                 # the second: every entry point
        mod.allreduce_ring(x, op="min")                 # from that library
        assert torch.equal(y, torch.arange(64, dtype=torch.bfloat16))
        assert sorted(libraries().values(), key=str) == [None, ["allreduce_ring_f32_sum"]]
        mod2 = comm.load(src)                           # another schedule object: the library of all
        mod2.allreduce_ring(x, op="sum")
        assert len(libraries()) == 2
        [every_dir] = [d for d, held in libraries().items() if held is None]
        assert list(mod2.allreduce_ring._libs) == [str(cache / every_dir / "liballreduce_ring.so")]
        # the ranks' agreement: the same identity whichever library a schedule launched from
        assert mod.allreduce_ring._identity == mod2.allreduce_ring._identity
    finally:
        comm.close(collective=False)
    [one] = [d for d, held in libraries().items() if held]
    built = build.build_cpu(out, ["allreduce_ring_f32_sum"])
    assert built.cached and built.directory.name == one
    ffi = cffi.FFI()
    ffi.cdef(abi.cdef(out.schedule))
    lib = ffi.dlopen(str(built.library))
    launch = getattr(lib, abi.launcher_name(out.schedule))
    f32 = passes.ir.DType.F32.code
    # f32 max (op 1) and f16 sum: not built, refused before anything is touched
    assert launch(f32, 1, 1, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0) == -2
    assert launch(passes.ir.DType.F16.code, 0, 1, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0) == -2
    ffi.dlclose(lib)

    def symbols(b) -> str:
        return subprocess.run(["nm", "-D", "--defined-only", str(b.library)], capture_output=True, text=True,
                              check=True).stdout
    held = {k for k in build.kernel_names(out) if k in symbols(built).split()}
    assert held == {"allreduce_ring_f32_sum"}
    with pytest.raises(build.StrataError, match="holds allreduce_ring_f32_sum, not allreduce_ring_bf16_max"):
        built.library_for("allreduce_ring_bf16_max")
    every = build.build_cpu(out)
    assert every.cached and every.identity == built.identity and every.directory != built.directory
    assert all(k in symbols(every) for k in build.kernel_names(out))
    # a job's warm-up: one library of its cases' entry points, which the ranks' loads then find
    [job] = build.build_all([out], [[("f16", "sum"), ("f16", "min"), ("f16", "sum")]])
    assert not job.cached and job.entries == {"allreduce_ring_f16_sum", "allreduce_ring_f16_min"}
    assert job.identity == built.identity
    assert libraries()[job.directory.name] == ["allreduce_ring_f16_min", "allreduce_ring_f16_sum"]
    assert build.OnDemand(out).library_for("allreduce_ring_i32_min") == every.library
    shutil.rmtree(every.directory)
    assert build.OnDemand(out).library_for("allreduce_ring_f16_min") == job.library
    assert build.OnDemand(out).library_for("allreduce_ring_f32_sum") == built.library
    with pytest.raises(build.StrataError, match="has no entry point allreduce_ring_i8_sum"):
        build.build_cpu(out, ["allreduce_ring_i8_sum"])
    # what a call's search passes over: a copy of an entry under another name, an entry.json that
    # is a FIFO (reading it would hang) or not an object, under the key of what it would hold
    i32_max = ["allreduce_ring_i32_max"]
    shutil.copytree(built.directory, cache / "allreduce_ring-0123456789abcdef01234567")
    copy = json.loads((built.directory / "entry.json").read_text())
    (cache / "allreduce_ring-0123456789abcdef01234567" / "entry.json").write_text(
        json.dumps({**copy, "entries": i32_max}))
    fifo = cache / build._entry_key("allreduce_ring", built.identity, i32_max)
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / "entry.json", 0o600)
    other = cache / build._entry_key("allreduce_ring", built.identity, ["allreduce_ring_i32_max", "x"])
    other.mkdir(mode=0o700)
    (other / "entry.json").write_text("[1]")
    import signal
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    signal.alarm(120)                                   # a hang fails the test
    try:
        found = build.OnDemand(out).library_for("allreduce_ring_i32_max")
    finally:
        signal.alarm(0)
    # passed over, then built at its own key: the FIFO's entry was moved aside and built anew
    assert found == fifo / "liballreduce_ring.so" and (fifo / "entry.json").is_file()
    assert libraries()[fifo.name] == i32_max
    assert [p.name for p in cache.iterdir() if ".stale." in p.name or ".tmp." in p.name] == []
