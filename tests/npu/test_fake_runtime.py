"""The NPU runtime's control flow against FAKES (tests/npu/fake/): a fake libshmem.so built here with
gcc from fake_shmem.c (the SHMEM host calls npu_comm makes, logging each), a fake torch_npu module
(device calls, streams, tensors that carry only metadata), a fake CANN tree and a fake cmake that
compiles the generated launch.cpp's NPU branch with g++ against aclrtlaunch_<kernel>.h headers
written the way ascendc_library declares them, and a kernels library that records each launch.
What runs is stratac's real code: NpuCommunicator (bootstrap, allocate, free, barrier,
synchronize, close, load, launch), stratac.targets.npu.build (a build and a failed one) and the
topology check. Nothing here says the real SHMEM, CANN or torch_npu behave so: that is the `npu`
test's job on a machine with an NPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from stratac.codegen import abi
from stratac.diagnostics import Codes, StrataError
from stratac.host import npu_comm
from stratac.host.errors import StrataRuntimeError, StrataUsageError
from stratac.targets import npu

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parent / "fake"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None,
                                reason="needs gcc and g++ to build the fakes")


@pytest.fixture(scope="module")
def fake_shmem_prefix(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("shmem")
    (prefix / "include").mkdir()
    (prefix / "include" / "shmem.h").write_text("// fake\n")
    (prefix / "lib").mkdir()
    # -Bsymbolic: the fake's calls to its own functions (calloc -> malloc) stay inside this copy,
    # whatever other library of the process exports the same names with RTLD_GLOBAL
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-Bsymbolic", str(FAKE / "fake_shmem.c"), "-o",
                    str(prefix / "lib" / "libshmem.so")], check=True, capture_output=True)
    return prefix


@pytest.fixture
def rt(tmp_path, monkeypatch, fake_shmem_prefix, fake):
    """The fake runtime: the environment NpuCommunicator is given, the fake SHMEM library (its log
    and failure switch) and the fake torch_npu module."""
    cann = fake.cann(tmp_path / "cann")
    env = {"PATH": "/usr/bin:/bin", "ASCEND_HOME_PATH": str(cann),
           "SHMEM_HOME": str(fake_shmem_prefix), "CMAKE": str(FAKE / "cmake")}
    monkeypatch.setenv("STRATAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(npu, "npu_devices", lambda: ["/dev/davinci0"])
    monkeypatch.syspath_prepend(str(FAKE))
    for m in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, m)
    lib = ctypes.CDLL(str(fake_shmem_prefix / "lib" / "libshmem.so"), mode=ctypes.RTLD_GLOBAL)
    lib.fake_shmem_log.restype = ctypes.c_char_p
    lib.fake_shmem_reset()
    import torch_npu
    torch_npu.calls.clear()
    torch_npu.device_name = "Ascend910B3"
    yield type("Rt", (), {"env": env, "lib": lib, "torch_npu": torch_npu,
                          "log": staticmethod(lambda: lib.fake_shmem_log().decode())})
    sys.modules.pop("torch_npu", None)


def make(rt, world=1, rank=0, **kw):
    barriers = []
    comm = npu_comm.NpuCommunicator(rank, world, exchange_uid=lambda uid: uid if uid else bytes(136),
                                    barrier=lambda: barriers.append(1), env=rt.env, **kw)
    return comm, barriers


def test_bootstrap_allocate_free_barrier_synchronize_close(rt):
    import torch
    comm, barriers = make(rt, heap_bytes=3 << 20)
    log = rt.log().splitlines()
    assert log[0] == f"get_uniqueid version={(1 << 16) + 136}"
    assert log[1] == f"set_attr pe=0 n=1 heap={4 << 20} uid={0x5a}"      # rounded up to 2 MiB pages
    assert log[2] == f"init_attr flags=8 engines=3 timeout=120 version={(1 << 16) + 24}"
    # the sync area: aclshmem_align(512, ...) (aclshmem_malloc guarantees 16 bytes only), zeroed on
    # the device; every allocation is 512-byte aligned (the kernels' 64-byte signal lines need 64)
    assert log[3] == f"align 512 {abi.sync_area_bytes(1)}"
    assert ("zero_", comm._sync, abi.sync_area_bytes(1)) in rt.torch_npu.calls
    assert comm._sync % 512 == 0
    assert ("set_device", 0) in rt.torch_npu.calls and comm.heap_bytes == 4 << 20

    x = comm.empty(64, dtype=torch.float16)
    assert rt.log().splitlines()[-1] == "align 512 128" and x.data_ptr() % 512 == 0
    assert isinstance(x, torch.Tensor) and x.device.type == "npu" and x.dtype == torch.float16
    assert x.numel() == 64 and comm.offset_of(x, "x") > 0
    assert comm.heap_used >= 128 + abi.sync_area_bytes(1)
    with pytest.raises(StrataUsageError, match="x is on cpu; the npu target runs on NPU tensors"):
        comm.offset_of(torch.zeros(4), "x")
    with pytest.raises(StrataRuntimeError, match="symmetric heap exhausted: .* 4194304-byte heap"):
        comm.empty(1 << 30, dtype=torch.uint8)

    rt.torch_npu.calls.clear()
    comm.free(x)
    assert rt.torch_npu.calls[-1] == ("stream.synchronize", 0)          # waits before freeing
    assert rt.log().splitlines()[-1] == f"free +{x.data_ptr() - comm._base}"
    with pytest.raises(StrataUsageError, match="not on the symmetric heap"):
        comm.free(x)

    comm.barrier()
    comm.synchronize()
    assert barriers == [1] and rt.torch_npu.calls[-1] == ("synchronize", 0)
    comm.close()
    assert rt.log().splitlines()[-1] == "finalize" and barriers == [1, 1]
    comm.close()                                                         # a second close does nothing
    assert rt.log().count("finalize") == 1
    with pytest.raises(StrataUsageError, match="the communicator is closed"):
        comm.empty(4)


def test_shmem_failures_name_the_call_and_the_error(rt):
    rt.lib.fake_shmem_fail(b"aclshmemx_init_attr")
    with pytest.raises(StrataRuntimeError, match=r"aclshmemx_init_attr \(rank 0 of 1, engines mte\+sdma, "
                                                 r"heap 268435456 bytes\) failed: SHMEM error -7 \(timeout\)"):
        make(rt)
    rt.lib.fake_shmem_reset()
    rt.lib.fake_shmem_fail(b"aclshmemx_get_uniqueid")
    with pytest.raises(StrataRuntimeError, match=r"aclshmemx_get_uniqueid on rank 0 failed: SHMEM error -6 "
                                                 r"\(bootstrap error\)"):
        make(rt)
    rt.lib.fake_shmem_reset()
    with pytest.raises(StrataUsageError, match="exchange_uid must return rank 0's 136-byte SHMEM unique id"):
        npu_comm.NpuCommunicator(1, 2, exchange_uid=lambda uid: b"short", env=rt.env)
    rt.lib.fake_shmem_fail(b"aclshmem_finalize")
    comm, _ = make(rt)
    with pytest.raises(StrataRuntimeError, match=r"aclshmem_finalize failed: SHMEM error -5 \(not initialised\)"):
        comm.close()


def test_load_builds_with_cmake_and_a_launch_reaches_the_kernel(rt):
    """comm.load compiles, builds through the fake cmake (the generated launch.cpp's NPU branch
    compiled against aclrtlaunch_ headers) and loads; a call checks its tensors and launches the
    kernel of its dtype and op with the ABI's arguments on torch_npu's current stream."""
    import torch
    comm, _ = make(rt)
    mod = comm.load(str(ROOT / "examples" / "allreduce_twoshot.strata"))
    fn = mod.allreduce_twoshot
    x = comm.empty(1024, dtype=torch.float32)
    epoch = comm._epoch
    fn(x, op="max", cores=5)
    kernels = ctypes.CDLL(str(fn.built.directory / npu.kernels_library_name("allreduce_twoshot")))
    kernels.fake_last_launch.restype = ctypes.c_char_p
    got = kernels.fake_last_launch().decode()
    assert got == (f"allreduce_twoshot_f32_max blocks=5 stream={0x57AE} sync={comm._sync} "
                   f"epoch={epoch} x={x.data_ptr()} n=1024")
    y = comm.empty(1024, dtype=torch.float16)
    fn(y, op="sum")   # 2 KiB: one core (stratac.host.cores, the CPU launcher's decision too)
    assert kernels.fake_last_launch().decode().startswith(
        f"allreduce_twoshot_f16_sum blocks=1 stream={0x57AE} ")
    big = comm.empty(4 << 20, dtype=torch.float16)
    fn(big, op="sum")   # 8 MiB: every core of the SoC
    assert kernels.fake_last_launch().decode().startswith(
        f"allreduce_twoshot_f16_sum blocks={fn.cores} stream={0x57AE} ") and fn.cores == 40
    with pytest.raises(StrataUsageError, match="cores must be between 1 and 40"):
        fn(x, op="sum", cores=41)
    with pytest.raises(StrataUsageError, match="is on cpu"):
        fn(torch.zeros(1024), op="sum")
    comm.close()
    with pytest.raises(StrataUsageError, match="the communicator is closed"):
        fn(x, op="sum")


def test_aliased_tensors_are_refused_on_the_npu_too(rt):
    import torch
    comm, _ = make(rt)
    mod = comm.load(str(ROOT / "examples" / "allgather_push.strata"))
    [fn] = mod.schedules.values()
    t = comm.empty(4096, dtype=torch.float32)
    names = [p.name for p in fn.ir.tensors]
    assert len(names) == 2
    with pytest.raises(StrataUsageError, match=rf"parameters {names[0]} and {names[1]} share memory "
                                               r"\(heap bytes \[\d+, \d+\) overlap\)"):
        fn(t, t)
    comm.close()


@pytest.mark.parametrize("step", ["configure", "build"])
def test_a_failed_build_says_which_step_and_publishes_nothing(rt, monkeypatch, tmp_path, step):
    monkeypatch.setenv("FAKE_CMAKE_FAIL", step)
    comm, _ = make(rt)
    with pytest.raises(StrataError) as exc:
        comm.load(str(ROOT / "examples" / "allreduce_twoshot.strata"))
    [d] = exc.value.diagnostics
    assert d.code == Codes.BUILD
    if step == "configure":
        assert d.message.startswith("configuring allreduce_twoshot for Ascend910B3 (cmake) failed (exit 1)")
        assert "could not find ascendc.cmake (fake)" in d.message
    else:
        assert d.message.startswith("building allreduce_twoshot for Ascend910B3 with CANN failed (exit 1)")
        assert "no matching function for call (fake)" in d.message
        assert any(n.message.endswith("comes from .strata line 10") for n in d.notes), d.notes
    cache = tmp_path / "cache"   # no build is published (the proof's verdict is kept: it held)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock") and p.name != "verdicts"] == []
    comm.close()


def test_worlds_beyond_one_hccs_domain(rt):
    assert npu_comm.check_topology("Ascend910B3", 8) is None
    assert npu_comm.check_topology("Ascend910_9391", 16) is None
    with pytest.raises(StrataUsageError, match="world of 9 ranks on Ascend910B1 spans more than one HCCS domain"):
        npu_comm.check_topology("Ascend910B1", 9, allow_unverified=True)     # A2: never
    with pytest.raises(StrataUsageError, match="UNVERIFIED: pass allow_unverified_topology=True"):
        npu_comm.check_topology("Ascend910_9391", 17)
    assert "UNVERIFIED" in npu_comm.check_topology("Ascend910_9391", 384, allow_unverified=True)
    assert "not known to stratac" in npu_comm.check_topology(None, 2)

    # the communicator refuses before SHMEM is initialised (every rank alike)
    with pytest.raises(StrataUsageError, match="world of 16 ranks on Ascend910B3"):
        make(rt, world=16)
    assert rt.log() == ""
    rt.torch_npu.device_name = "Ascend910_9391"
    with pytest.raises(StrataUsageError, match="spans more than one A3 server"):
        make(rt, world=32)
    assert rt.log() == ""
    with pytest.warns(UserWarning, match="MTE reach across servers is UNVERIFIED"):
        comm, _ = make(rt, world=32, allow_unverified_topology=True)
    assert "set_attr pe=0 n=32" in rt.log()
    comm.close()
    rt.torch_npu.device_name = "Ascend310P3"          # not one stratac knows: warned, not checked
    with pytest.warns(UserWarning, match="HCCS domain of SoC None is not known"):
        comm, _ = make(rt, world=2)
    comm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rt.torch_npu.device_name = "Ascend910B3"
        comm, _ = make(rt, world=8)
        comm.close()


def test_an_sdma_schedule_is_refused_on_a_communicator_without_the_sdma_engine(rt, tmp_path):
    """engines=("mte",) initialises SHMEM without ACLSHMEM_DATA_OP_SDMA: its SDMA workspace is
    null, and an SDMA post would dereference it on the device. load refuses a schedule with an
    `on sdma` (or `on auto`) stage there, naming the schedule, the stage and the engines, before
    anything is built; an AIV-only schedule still loads."""
    comm, _ = make(rt, engines=("mte",))
    assert "init_attr flags=8 engines=1 " in rt.log()
    cache = tmp_path / "cache"
    for path, example, engine in ((ROOT / "examples" / "allgather_push.strata", "allgather_push", "sdma"),
                                  (ROOT / "examples" / "allreduce_twoshot.strata", "allreduce_twoshot", "sdma"),
                                  (ROOT / "tests" / "verify" / "corpus" / "good_pull_and_max.strata",
                                   "allgather_pull", "auto")):
        with pytest.raises(StrataUsageError) as exc:
            comm.load(str(path))
        text = str(exc.value)
        assert text.startswith(f"schedule {example}: stage "), text
        assert f".strata:" in text and f"runs `on {engine}`" in text
        assert "engines=('mte',)" in text and "ACLSHMEM_DATA_OP_SDMA" in text
        assert "nothing was built or loaded" in text
    # nothing built (the schedule's proof is kept as a verdict: it held)
    assert not cache.exists() or [p.name for p in cache.iterdir()
                                  if not p.name.endswith(".lock") and p.name != "verdicts"] == []
    mod = comm.load(str(ROOT / "examples" / "allreduce_oneshot.strata"))     # AIV only: loads
    assert list(mod.schedules) == ["allreduce_oneshot"]
    comm.close()
    comm, _ = make(rt)                                                       # mte + sdma: loads
    comm.load(str(ROOT / "examples" / "allgather_push.strata"))
    comm.close()


def test_load_says_the_ranks_agreement_is_not_active_on_the_npu(rt):
    """The NPU host writes no agreement records (docs/robustness.md), so the kernels' strata::Agree
    cannot refuse ranks that disagree: load says so at run time, once per communicator."""
    import warnings
    comm, _ = make(rt)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        comm.load(str(ROOT / "examples" / "allreduce_oneshot.strata"))
        comm.load(str(ROOT / "examples" / "allreduce_oneshot.strata"))
    said = [w for w in seen if "agreement on each call is not active" in str(w.message)]
    assert len(said) == 1 and said[0].category is RuntimeWarning, [str(w.message) for w in seen]
