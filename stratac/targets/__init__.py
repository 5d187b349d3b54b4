"""The targets: generated sources -> a built library in the cache.

In: a stratac.codegen.Output. Out: a `Built` (library, manifest, directory) from the cache, built
if missing. `cpu` compiles kernel.cpp with g++ against stratac's CPU model of Ascend C and SHMEM
(runtime/) and owns the cache (key, atomic publish under a lock, checksums); `npu` finds CANN,
cmake and SHMEM for Ascend and drives the generated CMakeLists.txt, publishing through the same
cache. `verdicts` keeps the verifier's verdicts on the instances calls run beside the builds.
"""
