"""stratac: verify .strata communication schedules and compile them to Ascend C kernels.

The Python API lives in stratac.host: `Communicator` (the CPU build) and `NpuCommunicator` (an
Ascend NPU) are re-exported here, imported lazily, so that the command line does not pay for torch
when it only checks or compiles. `Buffer` (stratac.host.moe) is the DeepEP-style MoE
dispatch/combine. docs/architecture.md maps the package.

`import stratac` registers the torch.distributed backend "stratac" (stratac.distributed) when
torch.distributed is already imported, so that `dist.init_process_group("stratac")` works; without
torch imported it does not import it (the command line stays fast): import stratac.distributed.
"""

import sys as _sys

__version__ = "0.1.0"
__all__ = ["Buffer", "Communicator", "NpuCommunicator", "StrataError", "StrataRuntimeError", "StrataUsageError"]


def __getattr__(name):
    if name == "Communicator":
        from stratac.host.comm import Communicator
        return Communicator
    if name in ("StrataRuntimeError", "StrataUsageError"):
        from stratac.host import errors
        return getattr(errors, name)
    if name == "Buffer":
        from stratac.host.moe import Buffer
        return Buffer
    if name == "NpuCommunicator":
        from stratac.host.npu_comm import NpuCommunicator
        return NpuCommunicator
    if name == "StrataError":
        from stratac.diagnostics import StrataError
        return StrataError
    raise AttributeError(name)


if "torch.distributed" in _sys.modules:
    import stratac.distributed  # noqa: E402,F401  (registers the backend)
