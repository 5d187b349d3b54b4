"""PyTorch's own DistributedTest suite (torch.testing._internal.distributed.distributed_test), run
for backend "stratac": the suite torch runs for gloo, nccl and ucc, with its plugin hook.

Not collected by the suite (no test_ prefix): test_torch_suite.py runs it as its own pytest, once
per world size, since the suite reads BACKEND and WORLD_SIZE from the environment when imported:

    BACKEND=stratac WORLD_SIZE=2 python -m pytest tests/distributed/torch_suite.py -k 'all_reduce'

Each test forks WORLD_SIZE rank processes, which run dist.init_process_group("stratac") through
the suite's file store; importing stratac.distributed here registers the backend in each of them.
"""

import os

os.environ.setdefault("BACKEND", "stratac")
os.environ.setdefault("WORLD_SIZE", "2")

import torch  # noqa: E402
import stratac.distributed  # noqa: E402,F401  (registers backend "stratac")
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

DistTestCases.backend_feature["plugin"].add(os.environ["BACKEND"])

from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402


class TestStratacBackend(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # forked, not spawned as torch's runner does: a child starts without importing torch again
        # (the parent has made no stratac call, so there is no state of the CPU model to inherit)
        self._start_processes(torch.multiprocessing.get_context("fork").Process)
