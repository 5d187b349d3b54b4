"""What the machine under the bench offers, measured by the sweeps before their first case.

In: nothing but a buffer size. Out: the copy ceiling (the best torch copy_ in GB/s, on one thread
and on all of torch's: the table sets busbw beside it) and the memory available (a sweep whose
estimate does not fit is refused before it starts).
"""

from __future__ import annotations

import math
import time
from pathlib import Path


def copy_ceiling(nbytes: int = 256 << 20, reps: int = 5) -> dict:
    """The best of `reps` torch copies of `nbytes` (GB/s = bytes copied / s; each byte is read
    once and written once), with one thread and with all of torch's threads."""
    import torch
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)   # both touched: no page faults in the timing
    threads = torch.get_num_threads()
    out = {"bytes": nbytes, "threads": threads}
    try:
        for key, n in (("gbps_1_thread", 1), ("gbps_all_threads", threads)):
            torch.set_num_threads(n)
            dst.copy_(src)
            best = math.inf
            for _ in range(reps):
                t0 = time.perf_counter()
                dst.copy_(src)
                best = min(best, time.perf_counter() - t0)
            out[key] = nbytes / best / 1e9
    finally:
        torch.set_num_threads(threads)
    return out


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
