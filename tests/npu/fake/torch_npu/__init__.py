"""A FAKE torch_npu for tests/npu/test_fake_runtime.py: what stratac.host.npu_comm uses of it
(torch_npu.npu's device calls and streams, and the two private constructors of a tensor over device
memory), recording calls in `calls`. Its "NPU tensors" are torch wrapper tensors on device `npu`
that carry only metadata and a data pointer (no kernels run on them)."""

import torch

torch.utils.rename_privateuse1_backend("npu")

calls: list = []
device_name = "Ascend910B3"
devices = 8


class _Stream:
    npu_stream = 0x57AE

    def __init__(self, device):
        self.device = device

    def synchronize(self):
        calls.append(("stream.synchronize", self.device))


class _Npu:
    def device_count(self):
        return devices

    def set_device(self, d):
        calls.append(("set_device", d))

    def get_device_name(self, d):
        return device_name

    def current_stream(self, d=None):
        calls.append(("current_stream", d))
        return _Stream(d)

    def synchronize(self, d=None):
        calls.append(("synchronize", d))


npu = _Npu()


class FakeNpuTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, meta):
        t = torch.Tensor._make_wrapper_subclass(cls, meta["size"], strides=meta["stride"],
                                                dtype=meta["dtype"], device=meta["device"])
        t._ptr = meta["data_ptr"]
        return t

    def data_ptr(self):
        return self._ptr

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.zero_.default:     # the one operator: zeroing (fake) device memory,
            t = args[0]                               # which the fake SHMEM keeps in host memory
            import ctypes
            ctypes.memset(t._ptr, 0, t.numel() * t.element_size())
            calls.append(("zero_", t._ptr, t.numel() * t.element_size()))
            return t
        raise RuntimeError(f"the fake torch_npu runs no operators ({func})")


class _C:
    @staticmethod
    def _construct_storage_from_data_pointer(ptr, device, nbytes):
        calls.append(("storage", ptr, str(device), nbytes))
        return ("storage", ptr, nbytes)

    @staticmethod
    def _construct_NPU_Tensor_From_Storage_And_Metadata(meta, storage):
        assert storage[1] == meta["data_ptr"] and storage[2] == meta["nbytes"]
        return FakeNpuTensor(meta)
