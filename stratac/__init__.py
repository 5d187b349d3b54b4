"""stratac: verify .strata communication schedules and compile them to Ascend C kernels.

The Python API lives in stratac.comm; `Communicator` is re-exported here (imported lazily, so the
command line does not pay for torch when it only checks or compiles).
"""

__version__ = "0.1.0"
__all__ = ["Communicator", "StrataError", "StrataRuntimeError", "StrataUsageError"]


def __getattr__(name):
    if name in ("Communicator", "StrataRuntimeError", "StrataUsageError"):
        from . import comm
        return getattr(comm, name)
    if name == "StrataError":
        from .diagnostics import StrataError
        return StrataError
    raise AttributeError(name)
