"""The CPU model's shared library (runtime/cpu, built once into the cache) through cffi.

In: the RUNTIME_CDEF of stratac.codegen.abi and the library stratac.targets.cpu builds. Out: the
process-wide (ffi, lib) handle that communicators and schedule calls share, and the model's own
account of a failure (an aborted job, a dead peer) as a StrataRuntimeError.
"""

from __future__ import annotations

import cffi

from stratac.codegen import abi
from stratac.host.errors import StrataRuntimeError
from stratac.targets import cpu as build

_ffi_handle: cffi.FFI | None = None
_lib_handle = None
# the id of the model's current pool, as the communicators last made it (Communicator._use)
current = [0]


def runtime():
    global _ffi_handle, _lib_handle
    if _lib_handle is None:
        ffi = cffi.FFI()
        ffi.cdef(abi.RUNTIME_CDEF)
        path = build.runtime_library()
        _lib_handle = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
        _ffi_handle = ffi
    return _ffi_handle, _lib_handle


def last_error(lib, ffi) -> str:
    p = lib.strata_cpu_last_error()
    return ffi.string(p).decode(errors="replace") if p != ffi.NULL else "unknown error"


def check_pool(lib, rank: int, where: str) -> None:
    """Raises if the pool was aborted by a failing rank or a peer's process died (no-op before the
    heap is mapped)."""
    ffi = _ffi_handle
    if lib.strata_cpu_aborted():
        msg = ffi.string(lib.strata_cpu_abort_message()).decode(errors="replace")
        raise StrataRuntimeError(f"rank {rank}: {where}: the job is aborted: {msg}")
    if lib.strata_cpu_dead_rank() >= 0:
        raise StrataRuntimeError(f"rank {rank}: {where}: {last_error(lib, ffi)}")
