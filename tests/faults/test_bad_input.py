"""Bad input is refused before anything is written: every class of wrong argument raises
StrataUsageError with a message saying what is wrong, no kernel is launched (the flag epoch does
not move) and the tensors keep their contents. The instance checks (regions against the tensors,
the proof of the instance) are provoked on real ranks by tests/api (call_refusals)."""

from __future__ import annotations

import math

import pytest
import torch
from faultkit import ROOT

from stratac.host import comm as C
from stratac.host import errors, schedule
from stratac.ir import passes
from stratac.lang import frontend

AR = ROOT / "examples" / "allreduce_twoshot.strata"
AG = ROOT / "examples" / "allgather_push.strata"


@pytest.fixture(scope="module")
def comm():
    c = C.Communicator(0, 1, segment=C._segment_name(), create=True, heap_bytes=4 << 20, timeout=10)
    C.unlink_segment(c.segment)
    yield c
    c.close(collective=False)


@pytest.fixture(scope="module")
def mods(comm):
    return comm.load(AR), comm.load(AG)


def refused(comm, text: str, fn, *args, keep=(), **kw) -> str:
    """fn(*args) raises StrataUsageError containing text; no launch, `keep` tensors unchanged."""
    epoch = comm._epoch
    saved = [t.clone() for t in keep]
    with pytest.raises(errors.StrataUsageError) as exc:
        fn(*args, **kw)
    assert text in str(exc.value), str(exc.value)
    assert comm._epoch == epoch, "a kernel was launched"
    for t, s in zip(keep, saved):
        assert torch.equal(t, s), "a tensor was written"
    return str(exc.value)


def test_tensors_of_the_wrong_kind(comm, mods):
    ar, ag = mods
    x = comm.empty(64, dtype=torch.float32)
    x.copy_(torch.arange(64))
    refused(comm, "has dtype torch.float64", ar.allreduce_twoshot, comm.empty(64, dtype=torch.float64),
            op="sum")
    refused(comm, "not on the symmetric heap: allocate it with comm.empty", ar.allreduce_twoshot,
            torch.arange(64, dtype=torch.float32), op="sum")
    refused(comm, "is on meta", ar.allreduce_twoshot, torch.empty(64, device="meta"), op="sum")
    refused(comm, "must be contiguous", ar.allreduce_twoshot, comm.empty(8, 8).t(), op="sum")
    out = comm.empty(65, dtype=torch.float32)
    refused(comm, "parameter out must have", ag.allgather_push, x, out, keep=(x, out))
    out16 = comm.empty(64, dtype=torch.float16)
    refused(comm, "parameter out is torch.float16 but an earlier T parameter is torch.float32",
            ag.allgather_push, x, out16, keep=(x, out16))
    # loaded with the default Options: lowered for Ascend910B3, whose SoC has 40 vector cores
    refused(comm, "cores must be between 1 and 40, got 65", ar.allreduce_twoshot, x, op="sum", cores=65,
            keep=(x,))
    # 0 is not "all cores" (nor is False, or a fraction): only None means the schedule's default
    for cores in (0, False, 2.5):
        refused(comm, f"allreduce_twoshot: cores must be between 1 and 40, got {cores!r}",
                ar.allreduce_twoshot, x, op="sum", cores=cores, keep=(x,))
    # a tensor of another heap (another communicator's, or freed and reused memory) is not this heap's
    with pytest.raises(errors.StrataUsageError, match="not on the symmetric heap"):
        ar.allreduce_twoshot(torch.empty(1 << 20, dtype=torch.float32)[:64], op="sum")


def test_no_more_blocks_than_the_soc_it_was_compiled_for(comm):
    """A launch may use at most the vector cores of the SoC the kernel was lowered for (40 on
    Ascend910B3, 48 on Ascend910B1): the call refuses more, naming the SoC, before any launch; and
    the CPU model is told that count at every call, so that a launch the Python check did not see
    (the launcher called directly) is refused by the model too (runtime/cpu/src/launch.cpp LaunchBlocks)."""
    x = comm.empty(64, dtype=torch.float32)
    x.copy_(torch.arange(64))
    b3 = comm.load(AR)                                              # default: Ascend910B3
    b1 = comm.load(AR, options=passes.Options(soc="Ascend910B1"))   # 48 vector cores
    fn3, fn1 = b3.allreduce_twoshot, b1.allreduce_twoshot
    assert (fn3.soc, fn3.max_cores, fn1.max_cores) == ("Ascend910B3", 40, 48)
    msg = refused(comm, "allreduce_twoshot: cores must be between 1 and 40, got 41", fn3, x, op="sum",
                  cores=41, keep=(x,))
    assert "vector core count of Ascend910B3, the SoC it was compiled for" in msg
    fn3(x, op="sum", cores=40)                      # the SoC's every core: runs
    fn1(x, op="sum", cores=48)                      # a 48-core SoC: 48 blocks run
    assert torch.equal(x, torch.arange(64, dtype=torch.float32))   # world 1: the sum is x
    # the 910B3 module's call told the model 40: its launcher, called directly with 41 blocks
    # (bypassing the Python check), is refused by the model, and nothing was written
    fn3(x, op="sum", cores=1)
    dtype, sizes, ptrs, _ = fn3.bind(x, op="sum")
    sync = fn3._ffi.cast("void*", comm._base + comm._sync)
    rc = fn3._launcher(dtype, 0)(dtype.code, 0, 41, fn3._ffi.NULL, sync, comm.next_call(fn3.ir.sync_ops)[0], *ptrs,
                     *(sizes[n] for n in fn3.ir.sizes))
    assert rc != 0
    err = C.last_error(comm._lib, comm._ffi)
    assert "41 blocks exceed the SoC's 40 vector cores" in err, err
    assert torch.equal(x, torch.arange(64, dtype=torch.float32))
    fn3(x, op="sum")                                # the pool is not aborted: later calls run


def test_a_freed_tensor_is_refused_even_when_its_memory_is_reused(comm, mods):
    """comm.free gives the memory back; the tensor and its views are refused from then on, also
    once another tensor holds that memory (the call would write into it)."""
    ar, _ = mods
    old = comm.empty(64, dtype=torch.float32)
    comm.free(old)
    new = comm.empty(64, dtype=torch.float32)
    assert new.data_ptr() == old.data_ptr()
    new.copy_(torch.arange(64))
    for t in (old, old[8:16]):
        refused(comm, "allreduce_twoshot: parameter x was given back with comm.free: its memory may "
                "belong to another tensor now; allocate a new one with comm.empty", ar.allreduce_twoshot,
                t, op="sum", keep=(new,))
    refused(comm, "the tensor to free was given back with comm.free", comm.free, old, keep=(new,))
    refused(comm, "parameter x lies on the symmetric heap but is not a tensor comm.empty or comm.zeros "
            "made", ar.allreduce_twoshot, comm._heap[-256:].view(torch.float32), op="sum", keep=(new,))
    ar.allreduce_twoshot(new, op="sum")   # world 1: unchanged, and allowed
    assert torch.equal(new, torch.arange(64, dtype=torch.float32))
    comm.free(new[8:16])                  # a view gives back its whole allocation
    refused(comm, "parameter x was given back with comm.free", ar.allreduce_twoshot, new, op="sum")


def test_aliasing_where_the_schedule_writes(comm, mods):
    """AllGather writes `out`: an input that shares memory with it is refused, whether it is the
    same tensor or a slice of it. AllReduce has one parameter, in place by contract."""
    ar, ag = mods
    out = comm.empty(64, dtype=torch.float32)
    out.copy_(torch.arange(64))
    msg = refused(comm, "allgather_push: parameters x and out share memory", ag.allgather_push, out, out,
                  keep=(out,))
    assert "and the schedule writes out: pass separate tensors" in msg
    big = comm.empty(128, dtype=torch.float32)
    refused(comm, "parameters x and out share memory (heap bytes", ag.allgather_push, big[32:96], big[64:128],
            keep=(big,))
    # disjoint parts of one allocation are fine
    big.copy_(torch.arange(128))
    ag.allgather_push(big[:64], big[64:])
    assert torch.equal(big[64:], torch.arange(64, dtype=torch.float32))
    ar.allreduce_twoshot(out, op="sum")   # one tensor in place: what the contract says


def test_world_size_and_manifest_mismatch(comm):
    """A schedule verified for another world than the communicator's, or a library whose manifest
    describes another schedule, is refused when it is bound."""
    src = frontend.load_source(AG)
    compiled = schedule.compile_source(src, passes.Options(cores=2), worlds=[2, 4])
    with pytest.raises(errors.StrataUsageError, match=r"allgather_push was verified for world size\(s\) 2, 4, but "
                       r"the communicator has world 1"):
        schedule.Module(comm, compiled)
    ar = schedule.compile_source(frontend.load_source(AR), passes.Options(cores=2), worlds=[1])[0]
    ag = schedule.compile_source(src, passes.Options(cores=2), worlds=[1])[0]
    from stratac.targets import cpu as build
    with pytest.raises(errors.StrataUsageError,
                       match=r"allreduce_twoshot: the manifest of the library built from .* describes "
                       r"'allgather_push' with launcher 'strata_launch_allgather_push', not this schedule"):
        schedule.Schedule(comm, ar.schedule, build.build_cpu(ag.output), worlds=(1,))


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, "10"])
def test_a_bad_timeout_is_refused(timeout):
    with pytest.raises(errors.StrataUsageError, match="timeout must be a positive number of seconds"):
        C.Communicator(0, 1, segment=C._segment_name(), create=True, timeout=timeout)


def test_heap_exhaustion_is_refused_with_the_numbers(comm):
    with pytest.raises(errors.StrataRuntimeError, match=r"symmetric heap exhausted: aclshmem_align\(\d+\): "
                       r"symmetric heap exhausted: request of \d+ bytes"):
        comm.empty(1 << 30)
