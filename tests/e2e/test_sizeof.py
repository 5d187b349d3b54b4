"""sizeof(T) end to end (dsl/README.md, "Data"): the schedules of
tests/verify/corpus/good_sizeof_byte_chunks.strata (byte-sized blocks, HCCL's 128-byte ring slices,
sizeof(T) in flag, scratch and split sizes, a scratch sized by it) and tests/e2e/sizeof.strata run on rank processes of
the CPU build in every element type, each result checked against torch; the engine counters show
that the kernel's sizeof(T) is the element size of the call. Translation validation
(tests/e2e/test_translation.py) runs the corpus file's schedules against the verifier's memory at
worlds 1-9 in f16 and f32, its fixed-type f16 caller of a generic callee too (left out here: a run
gives every schedule the case's type)."""

from pathlib import Path

import runkit

from stratac.tools.run import runner

HERE = Path(__file__).resolve().parent
FILES = [HERE.parents[0] / "verify" / "corpus" / "good_sizeof_byte_chunks.strata", HERE / "sizeof.strata"]
BYTES = {"f32": 4, "i32": 4, "f16": 2, "bf16": 2}


def test_every_element_type_runs_correctly_and_the_kernel_reads_its_size(tmp_path):
    world, count = 3, 1000   # 1000 elements: not a whole number of 64- or 128-byte units
    path = tmp_path / "sizeof_all.strata"
    text = runkit.concat(FILES)
    head, sep, tail = text.partition("# a caller of a fixed type")
    assert sep and "schedule allgather_by_elem" in tail
    path.write_text(head + tail[tail.index("\n# sizeof(T) as the kernel reads it"):])
    cases = [runner.Case(dtype=d, count=count, op="sum", root=1) for d in BYTES]
    out = runkit.run(path, world, cases, iters=1, cores=world)
    assert out.failures == [] and out.exit_code == 0, out.failures
    wrong = [(r["schedule"], r["dtype"], r["rank"], r["why"]) for r in out.results if not r["ok"]]
    assert wrong == []
    ran = {(r["schedule"], r["dtype"]) for r in out.results}
    names = {"allgather_blocks_64b", "allreduce_ring_128b", "broadcast_sized", "broadcast_scratch_bytes",
             "allgather_by_elem"}
    assert ran >= {(s, d) for s in names for d in BYTES}
    for r in out.results:
        if r["schedule"] != "allgather_by_elem":
            continue
        sdma = sum(c["sdma"] for c in r["counters"])
        aiv = sum(c["mte_out"] for c in r["counters"])
        nbytes = world * count * BYTES[r["dtype"]]   # every rank's block to every rank, itself too
        assert (sdma, aiv) == ((nbytes, 0) if BYTES[r["dtype"]] == 2 else (0, nbytes)), r["dtype"]
