"""The NPU build driver without CANN: the cmake invocations (argument lists, the -D options),
publication in the cache, cache hits, rebuilds. Only the function that runs a build step is
replaced: it records the command and, for `cmake --build`, leaves the libraries a CANN build
would leave."""

from pathlib import Path

import pytest

from stratac import codegen
from stratac.diagnostics import Codes, StrataError, error
from stratac.ir import passes
from stratac.lang import frontend
from stratac.resources import resource_dir
from stratac.targets import npu

ROOT = Path(__file__).resolve().parents[2]


def generated(name: str, soc: str = passes.DEFAULT_SOC) -> codegen.Output:
    [s] = frontend.schedules(frontend.load_source(ROOT / "examples" / f"{name}.strata"))
    return codegen.generate(passes.pipeline(s, passes.Options(soc=soc)))


class FakeCann:
    """Stands in for the build steps: records (argv, cwd, sources seen) and produces the outputs."""

    def __init__(self, fail_on: str | None = None):
        self.calls = []
        self.fail_on = fail_on

    def __call__(self, cmd, cwd, what, files):
        self.calls.append((list(cmd), Path(cwd), (Path(cwd) / "CMakeLists.txt").read_text()))
        if self.fail_on and self.fail_on in cmd:
            raise StrataError(error(Codes.BUILD, f"{what} failed (exit 1)"))
        if "--build" in cmd:
            name = files["manifest.json"].split('"schedule": "')[1].split('"')[0]
            out = Path(cwd) / "build"
            (out / "lib").mkdir(parents=True, exist_ok=True)
            (out / f"lib{name}.so").write_bytes(b"launcher " + name.encode())
            (out / "lib" / f"lib{name}_kernels.so").write_bytes(b"kernels " + name.encode())


@pytest.fixture
def cann(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeCann()
    monkeypatch.setattr(npu, "_run_tool", fake)
    return fake


def test_configure_and_build_are_argument_lists_with_the_right_options(cann, npu_env):
    out = generated("allreduce_twoshot")
    built = npu.build(out, "Ascend910B3", env=npu_env)
    assert len(cann.calls) == 2
    (configure, cwd, cmakelists), (build_cmd, cwd2, _) = cann.calls
    assert all(isinstance(a, str) for a in configure + build_cmd)
    assert configure[:5] == [npu_env["CMAKE"], "-S", ".", "-B", "build"]
    assert "-DSOC_VERSION=Ascend910B3" in configure
    assert f"-DSTRATA_DEVICE_DIR={resource_dir('runtime') / 'device'}" in configure
    assert f"-DSHMEM_HOME={npu_env['SHMEM_HOME']}" in configure
    assert f"-DASCEND_CANN_PACKAGE_PATH={npu_env['ASCEND_HOME_PATH']}" in configure
    assert (resource_dir("runtime") / "device" / "strata_device.h").is_file()
    assert build_cmd[:4] == [npu_env["CMAKE"], "--build", "build", "--parallel"]
    assert cwd == cwd2 and cmakelists == out.files["CMakeLists.txt"]
    assert built.library.name == "liballreduce_twoshot.so" and built.library.is_file()
    assert (built.directory / "liballreduce_twoshot_kernels.so").is_file()
    assert not (built.directory / "build").exists()          # the build tree is not kept
    assert built.manifest["launcher"] == "strata_launch_allreduce_twoshot"
    assert not built.cached
    assert built.directory.parent == Path(npu_env["ASCEND_HOME_PATH"]).parent / "cache"


def test_second_build_is_a_cache_hit_and_runs_nothing(cann, npu_env):
    out = generated("allgather_push")
    first = npu.build(out, "Ascend910B3", env=npu_env)
    cann.calls.clear()
    again = npu.build(out, "Ascend910B3", env=npu_env)
    assert again.cached and again.directory == first.directory and cann.calls == []


def test_cache_key_has_target_soc_and_cann_version(cann, npu_env, tmp_path, fake):
    b3 = npu.build(generated("allreduce_twoshot"), "Ascend910B3", env=npu_env)
    b1 = npu.build(generated("allreduce_twoshot", "Ascend910B1"), "Ascend910B1", env=npu_env)
    assert b1.directory != b3.directory and "-npu-" in b3.directory.name
    other = fake.cann(tmp_path / "cann9", version="9.0.0")
    b3_9 = npu.build(generated("allreduce_twoshot"), "Ascend910B3",
                     env={**npu_env, "ASCEND_HOME_PATH": str(other)})
    assert b3_9.directory != b3.directory and not b3_9.cached


def test_a_corrupted_kernels_library_is_rebuilt_not_loaded(cann, npu_env):
    out = generated("allreduce_twoshot")
    first = npu.build(out, "Ascend910B3", env=npu_env)
    (first.directory / "liballreduce_twoshot_kernels.so").write_bytes(b"truncated")
    cann.calls.clear()
    again = npu.build(out, "Ascend910B3", env=npu_env)
    assert not again.cached and len(cann.calls) == 2
    assert (again.directory / "liballreduce_twoshot_kernels.so").read_bytes() == b"kernels allreduce_twoshot"


def test_a_failed_build_publishes_nothing(monkeypatch, tmp_path, npu_env):
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(npu, "_run_tool", FakeCann(fail_on="--build"))
    with pytest.raises(StrataError) as exc:
        npu.build(generated("allreduce_twoshot"), "Ascend910B3", env=npu_env)
    assert exc.value.diagnostics[0].code == Codes.BUILD
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_soc_mismatch_and_unknown_soc_are_refused(cann, npu_env):
    out = generated("allreduce_twoshot")          # planned for Ascend910B3 (40 cores)
    with pytest.raises(StrataError, match="compiled for Ascend910B3 .* compile it with --soc Ascend910B1"):
        npu.build(out, "Ascend910B1", env=npu_env)
    with pytest.raises(StrataError, match="unknown SoC 'Ascend310P'"):
        npu.build(out, "Ascend310P", env=npu_env)
    assert cann.calls == []


def test_build_without_a_toolchain_names_what_is_missing(cann, tmp_path):
    with pytest.raises(StrataError) as exc:
        npu.build(generated("allreduce_twoshot"), "Ascend910B3", env={"PATH": str(tmp_path)})
    d = exc.value.diagnostics[0]
    assert d.code == Codes.TOOLCHAIN and "SHMEM_HOME" in d.message and "cmake: not on PATH" in d.message
    assert cann.calls == []
