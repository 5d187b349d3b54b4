"""stratac as a torch.distributed backend: `dist.init_process_group("stratac")`.

Importing this module (or `stratac` once torch is imported) registers the backend. Every
all_reduce, broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor),
all_to_all(_single) and barrier then runs a proven stratac kernel on the group's symmetric heap;
what no schedule takes runs on gloo, counted (stats()). docs/api.md, "torch.distributed backend".

    import torch.distributed as dist
    import stratac.distributed as sd
    dist.init_process_group("stratac")          # torchrun, or init_method/store as usual
    x = sd.empty(1 << 20)                        # on the default group's heap: no staging copy
    dist.all_reduce(x)
    print(sd.stats())
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from stratac.distributed import collectives, staging
from stratac.distributed.backend import NAME, Options, ProcessGroup, Work, register
from stratac.host.errors import StrataUsageError

register()


def _group_of(group) -> ProcessGroup:
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroup):
        raise StrataUsageError(f"the process group is of backend {pg.name()!r}, not {NAME!r}: "
                               "stratac.distributed.empty allocates on a stratac group's heap")
    return pg


def empty(*shape, dtype: torch.dtype = torch.float32, group=None) -> torch.Tensor:
    """A tensor on the symmetric heap of `group` (default: the default group), which its
    collectives use without a staging copy (in the spirit of torch's symm_mem.empty). Collective
    over the group: every member allocates the same shapes in the same order."""
    return _group_of(group)._group.comm.empty(*shape, dtype=dtype)


def free(t: torch.Tensor, group=None) -> None:
    """Gives the memory of a tensor of `empty` back (collective, like the allocation)."""
    _group_of(group)._group.comm.free(t)


def use(path: str | Path) -> None:
    """Puts the schedules of a .strata file in front of stratac's own: for each contract the file
    implements, the groups made from now on run its schedules (picked per size as usual) instead of
    the library's. Call it on every rank, before the groups' first collectives."""
    p = Path(path)
    if not p.is_file():
        raise StrataUsageError(f"stratac.distributed.use: {path} is not a file")
    collectives.USER_SOURCES.append(p)


def stats() -> dict:
    """What the backend did in this process: calls run by kernels per op, of those without a
    staging copy, bytes copied in and out of staging per op, and gloo fallbacks per op, dtype and
    reason."""
    return staging.STATS.as_dict()


def reset_stats() -> None:
    staging.STATS.__init__()


__all__ = ["NAME", "Options", "ProcessGroup", "Work", "empty", "free", "reset_stats", "stats", "use"]
