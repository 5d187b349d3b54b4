"""The NPU runtime. Here (no NPU, no CANN, no torch_npu) every entry point must fail with a
StrataError naming what is missing, never an ImportError; what can be checked without a device
is: the cffi description of SHMEM's host API, and that a launch passes the launcher its
arguments in ABI order. The `npu` tests run only where an Ascend NPU is present."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratac import codegen
from stratac.codegen import abi
from stratac.diagnostics import Codes, StrataError
from stratac.host import npu_comm
from stratac.ir import passes
from stratac.lang import frontend
from stratac.targets import npu

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "SHMEM_HOME", "SHMEM_HOME_PATH", "CMAKE")

no_npu_here = pytest.mark.skipif(npu.npu_available()[0], reason="this machine has an NPU")


@pytest.fixture
def bare(monkeypatch):
    """No CANN or SHMEM configured, and none looked for in the default places."""
    for var in TOOLCHAIN_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(npu, "DEFAULT_CANN_ROOTS", ())


@pytest.fixture
def toolchain_only(monkeypatch, npu_env):
    """CANN, cmake and SHMEM found (fakes), nothing else."""
    for k, v in npu_env.items():
        monkeypatch.setenv(k, v)


def check_missing(exc, *words):
    [d] = exc.value.diagnostics
    assert d.code == Codes.TOOLCHAIN
    text = d.render()
    for w in words:
        assert w in text, (w, text)
    assert "Traceback" not in text
    return d


@no_npu_here
def test_constructor_names_the_missing_toolchain(bare):
    with pytest.raises(StrataError) as exc:
        npu_comm.NpuCommunicator(0, 1, exchange_uid=lambda uid: uid)
    check_missing(exc, "the npu target cannot run here", "ASCEND_HOME_PATH is not set",
                  "SHMEM_HOME", "set_env.sh")
    assert "torch_npu" not in sys.modules      # the preflight comes before any import


@no_npu_here
@pytest.mark.skipif(npu.torch_npu_installed() is not None, reason="torch_npu is installed here")
def test_constructor_with_a_toolchain_but_no_torch_npu(toolchain_only):
    with pytest.raises(StrataError) as exc:
        npu_comm.NpuBackend(0, 1, exchange_uid=lambda uid: uid)
    d = check_missing(exc, "torch_npu: not installed", "pip install torch_npu")
    assert "CANN" not in d.message and "SHMEM" not in d.message
    assert "torch_npu" not in sys.modules


@no_npu_here
def test_job_constructors_fail_before_any_collective(bare):
    with pytest.raises(StrataError) as exc:
        npu_comm.NpuCommunicator.from_process_group()
    check_missing(exc, "ASCEND_HOME_PATH")

    class NoStore:
        def __getattr__(self, name):
            raise AssertionError("the store must not be touched")

    with pytest.raises(StrataError) as exc:
        npu_comm.NpuCommunicator.from_store(0, 2, NoStore())
    check_missing(exc, "ASCEND_HOME_PATH")


@pytest.mark.skipif(npu.torch_npu_installed() is not None, reason="torch_npu is installed here")
def test_import_torch_npu_says_how_to_install_it():
    with pytest.raises(StrataError) as exc:
        npu.import_torch_npu()
    check_missing(exc, "the npu target needs torch_npu, which is not installed", "pip install torch_npu")


def test_importing_the_npu_module_imports_neither_torch_nor_torch_npu():
    code = "import sys, stratac.targets.npu, stratac.host.npu_comm; print(sorted(m for m in ('torch', 'torch_npu') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_shmem_cdef_matches_the_public_header_layout():
    """Sizes and offsets of the structs as SHMEM's include/host/shmem_host_def.h lays them out
    (x86_64/aarch64 LP64), and the version words its initialisers put in them."""
    ffi = npu_comm.shmem_ffi()
    assert ffi.sizeof("aclshmemx_uniqueid_t") == 4 + 4 + 4 + 124
    assert npu_comm.uniqueid_version(ffi) == (1 << 16) + 136
    assert ffi.sizeof("aclshmem_init_optional_attr_t") == 24
    assert npu_comm.optional_attr_version(ffi) == (1 << 16) + 24
    offsets = {f: ffi.offsetof("aclshmemx_init_attr_t", f)
               for f in ("my_pe", "n_pes", "ip_port", "local_mem_size", "option_attr", "comm_args",
                         "instance_id")}
    assert offsets == {"my_pe": 0, "n_pes": 4, "ip_port": 8, "local_mem_size": 72,
                       "option_attr": 80, "comm_args": 104, "instance_id": 112}
    assert ffi.sizeof("aclshmemx_init_attr_t") == 120
    assert npu_comm.INIT_WITH_UNIQUEID == 8 and npu_comm.DATA_OP["mte"] | npu_comm.DATA_OP["sdma"] == 3


class FakeComm:
    """Just what a schedule call asks of its communicator, with recognisable values."""

    world, rank, _sync = 2, 0, 0x5000

    def __init__(self):
        self.epoch = 0

    def _check_open(self):
        pass

    def offset_of(self, t, what):
        return 0

    def next_epoch(self, stamps):
        self.epoch, e = self.epoch + stamps + 1, self.epoch
        return e

    def stream_handle(self):
        return 0xABC0


@pytest.mark.parametrize("example", ["allreduce_twoshot", "allgather_push"])
def test_a_launch_passes_the_launcher_its_arguments_in_abi_order(example):
    import cffi
    import torch
    [s] = frontend.schedules(frontend.load_source(ROOT / "examples" / f"{example}.strata"))
    s = codegen.generate(passes.pipeline(s, passes.Options())).schedule
    fn = object.__new__(npu_comm.npu_schedule_class())   # no library: the launcher is recorded
    fn.comm, fn.ir, fn.name, fn.cores, fn.max_cores, fn.soc = FakeComm(), s, s.name, 40, 40, "Ascend910B3"
    fn._bounded, fn._window = False, None
    fn._ffi = cffi.FFI()
    fn._ffi.cdef(abi.cdef(s))
    fn._scratch = {}
    fn._instances = {}          # the call proves its instance (stratac.host.instance) before launching
    calls = []
    fn._unloaded = False
    picked = []          # the (dtype, op) whose launcher a call asks for
    fn._launcher = lambda dtype, op: picked.append((dtype, op)) or (lambda *a: calls.append(a) or 0)
    env = {"world": FakeComm.world, **{n: 64 for n in s.sizes}}
    tensors = {p.name: torch.zeros(p.size.eval(env), dtype=torch.float16)
               for p in getattr(s, "tensors", s.params)}
    scalars = {x.name: ("max" if x.kind.value == "redop" else 1) for x in getattr(s, "scalars", [])}
    fn(**tensors, **scalars, cores=7)
    [args] = calls
    assert picked == [(passes.ir.DType.F16, 1 if s.op_param else 0)]   # max is abi.OPS[1]
    roles = [a.role for a in abi.args(s)]
    assert len(args) == len(roles)
    got = dict(zip((a.name for a in abi.args(s)), args))
    assert got["dtype"] == passes.ir.DType.F16.code and got["blocks"] == 7 and got["epoch"] == 0
    assert int(fn._ffi.cast("uintptr_t", got["stream"])) == 0xABC0
    assert int(fn._ffi.cast("uintptr_t", got["sync"])) == 0x5000 and "ffts" not in got
    for a in abi.args(s):
        if a.role == "tensor":
            assert int(fn._ffi.cast("uintptr_t", got[a.name])) == tensors[a.name].data_ptr()
    if "op" in got:
        assert got["op"] == (1 if scalars else 0)      # max is abi.OPS[1]
    with pytest.raises(Exception, match="cores must be between 1 and 40"):
        fn(**tensors, **scalars, cores=41)
    calls.clear()
    fn(**tensors, **scalars)   # no cores: they follow the bytes (stratac.host.cores), 1 here
    [args] = calls
    assert dict(zip((a.name for a in abi.args(s)), args))["blocks"] == 1 == fn.last_cores


@pytest.mark.npu
def test_allreduce_on_one_npu():
    import torch
    comm = npu_comm.NpuCommunicator(0, 1, exchange_uid=lambda uid: uid, heap_bytes=64 << 20)
    try:
        mod = comm.load(str(ROOT / "examples" / "allreduce_twoshot.strata"))
        x = comm.empty(1 << 16, dtype=torch.float32)
        want = torch.arange(1 << 16, dtype=torch.float32)
        x.copy_(want.to(x.device))
        fn = mod.allreduce_twoshot
        mod.allreduce_twoshot(x, **{v.name: "sum" for v in getattr(fn.ir, "scalars", [])
                                    if v.kind.value == "redop"})
        torch.npu.synchronize()
        assert torch.equal(x.cpu(), want)          # one rank: the sum is the input
        assert comm.heap_used >= (1 << 16) * 4
    finally:
        comm.close()
