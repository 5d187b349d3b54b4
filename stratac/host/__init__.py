"""The host runtime: built kernels -> Python callables over torch tensors on a symmetric heap.

In: a .strata file (compiled, verified for the job's world and built through stratac.targets), and
the ranks of a job (torch.distributed or a Store). Out: a communicator per rank that allocates
heap tensors and loads schedules whose calls check every tensor against the proof before they
launch (`schedule`; the instance a call makes is checked and proven by `instance`). `comm` is the
CPU build (ranks are processes, the heap is shared memory); `npu_comm` is the same API on SHMEM for
Ascend. `moe` is the DeepEP-style `Buffer` for MoE dispatch and combine on top of them.
"""
